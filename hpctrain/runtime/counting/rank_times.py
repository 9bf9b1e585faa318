"""Each rank's busy time per step over a logging interval — input plus compute, without the reduction wait and
the stop vote — so that ``hpctrain report`` can show which rank the others wait for. The trainer adds one slot
per rank to the interval's metrics all-reduce; rank 0 appends the row to ``RUN_DIR/rank_times.jsonl``.
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

    def write(self, step: int, busy: list[float]) -> None:
        """Append one row (rank 0); a rank without a timed step is null."""
        if self.path is None or all(math.isnan(b) for b in busy):
            return
        row = {"step": step, "time": round(time.time(), 3),
               "busy_s": [None if math.isnan(b) else float(f"{b:.{DIGITS}g}") for b in busy]}
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        except OSError:
            pass  # advisory, like the profile: a full disk must not stop training
