"""Each rank's busy time per step over a logging interval — input plus compute, without the reduction wait and
the stop vote — so that ``hpctrain report`` can show which rank the others wait for. The trainer adds one slot
per rank to the interval's metrics all-reduce; rank 0 appends the row to ``RUN_DIR/rank_times.jsonl``. Beyond one
node a row also holds each node's busy time (its slowest rank's) and link time (runtime/node_stats.py).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

RANK_TIMES_FILE = "rank_times.jsonl"
BUSY_KEYS = ("input_s", "compute_s")
DIGITS = 5  # significant digits kept per rank: a row of 4096 ranks stays near 50 kB


class RankTimes:
    """Reads a step profiler's running sums; ``busy_s()`` is the mean busy time per timed step since its last call
    (NaN when no step was timed: the profiler skips the first steps)."""

    def __init__(self, stats: dict[str, Any], path: Path | None) -> None:
        self.stats, self.path = stats, path
        self._total, self._count = 0.0, 0

    def busy_s(self) -> float:
        total = sum(self.stats[k].mean * self.stats[k].count for k in BUSY_KEYS)
        count = self.stats[BUSY_KEYS[-1]].count
        steps = count - self._count
        busy = (total - self._total) / steps if steps > 0 else math.nan
        self._total, self._count = total, count
        return busy

    def write(self, step: int, busy: list[float], per_node: dict[str, list[float]] | None = None) -> None:
        """Append one row (rank 0); a rank without a timed step is null. ``per_node``: more lists of seconds by
        node index (``node_busy_s``, ``node_link_s``), kept the same way."""
        if self.path is None or all(math.isnan(b) for b in busy):
            return
        row = {"step": step, "time": round(time.time(), 3), "busy_s": _kept(busy),
               **{key: _kept(values) for key, values in (per_node or {}).items()}}
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        except OSError:
            pass  # advisory, like the profile: a full disk must not stop training


def _kept(seconds: list[float]) -> list[float | None]:
    return [None if math.isnan(s) else float(f"{s:.{DIGITS}g}") for s in seconds]
