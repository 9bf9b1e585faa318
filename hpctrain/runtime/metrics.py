"""Training metrics: a JSONL file per run (rank 0), the same records to TensorBoard or MLflow when the job asks
(runtime/metric_sinks.py), and a live progress line on stderr."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from hpctrain.runtime.metric_sinks import MetricsSink


# One line per attempt of a run (the first, each requeue or resume): when rank 0 started training and from which
# step. The report splits metrics.jsonl into attempts by these times (rank 0's own clock, like the records').
ATTEMPTS_FILE = "attempts.jsonl"


def note_attempt(run_dir: Path, start_step: int) -> None:
    """Append this attempt's start (rank 0); advisory, like the metrics themselves."""
    try:
        with open(run_dir / ATTEMPTS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"time": round(time.time(), 3), "step": start_step}) + "\n")
    except OSError:
        pass


class MetricsLog:
    """Appends one JSON object per logging interval to ``metrics.jsonl`` and prints a progress line."""

    def __init__(self, path: Path | None, total_steps: int, unit: str, stream: TextIO = sys.stderr,
                 sinks: Sequence[MetricsSink] = ()) -> None:
        self.path, self.total, self.unit, self.stream = path, total_steps, unit, stream
        self.sinks = list(sinks)
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        for sink in self.sinks:
            sink.write(record)
        self.stream.write(progress_line(record, self.total, self.unit) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def progress_line(record: dict[str, Any], total: int, unit: str) -> str:
    parts = [f"step {record.get('step', '?')}/{total}"]
    if "loss" in record:
        parts.append(f"loss {record['loss']:.4f}")
    if "lr" in record:
        parts.append(f"lr {record['lr']:.3g}")
    if "per_rank_rate" in record:
        parts.append(f"{record['per_rank_rate']:.2f} {unit}/s/rank")
    shown = {"step", "loss", "lr", "per_rank_rate", "time", "ranks", "final", "steps"}
    for key, value in record.items():
        if key not in shown and isinstance(value, float):
            parts.append(f"{key} {value:.3f}")
    return "  ".join(parts)

