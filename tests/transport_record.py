"""How the tests' counting transports record a command: its argv, plus what it sends on standard input as a last
word (``run_script`` sends a script there, so a poll's commands are read from that word)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_recorded(argv: list[str], kw: Mapping[str, Any]) -> list[str]:
    sent = kw.get("input")
    return [*argv, sent.decode()] if sent is not None else list(argv)
