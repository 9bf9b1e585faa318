"""Printing helpers shared by commands: JSON output and plain aligned tables (no heavy imports)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from hpctrain.text import printable


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A left-aligned text table; cells are str()-ed, their control characters escaped."""
    cells = [[printable(str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line.rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
