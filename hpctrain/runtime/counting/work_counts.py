"""Per-rank counts of the work that must not grow with the number of ranks: input bytes read, collective calls
with their messages and bytes, checkpoint files and bytes, steps, and when the first step ended.

Switched on with runtime/counting/counters.py's switch (``HPCTRAIN_COUNTERS``) and written into the same per-rank
record, as its ``work`` section. Off, ``active()`` is None: callers skip counting after one test, nothing is wrapped.
Record format and the table built from it: docs/scaling.md, "Counters".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from hpctrain.runtime.counting import counters


@dataclass
class Traffic:
    """Collective or point-to-point calls and what they cost this rank.

    ``calls`` and ``payload_bytes`` (the tensor handed to the call) are measured; messages and bytes sent and
    received are the algorithm's (runtime/counting/comm_counts.py says which), summed over the calls.
    """

    calls: int = 0
    payload_bytes: int = 0
    sent_messages: int = 0
    sent_bytes: int = 0
    received_messages: int = 0
    received_bytes: int = 0

    def add(self, other: Traffic) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class InputTally:
    """Bytes and read calls from one input source, in all and per epoch (``None``: not tied to an epoch)."""

    bytes: int = 0
    reads: int = 0
    by_epoch: dict[str, int] = field(default_factory=dict)


@dataclass
class WorkCounts:
    """This rank's counts. Communication is kept per phase (``startup`` until the first step ends, then
    ``train``) and per category (gradients, stop flag, metrics, checkpoint, ...: ``category(label)``)."""

    traffic: dict[str, dict[str, Traffic]] = field(default_factory=dict)
    algorithms: dict[str, list[str]] = field(default_factory=dict)  # kind -> the algorithms the counts assumed
    inputs: dict[str, InputTally] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, int]] = field(default_factory=dict)  # step -> files and bytes written
    steps: int = 0
    phase: str = "startup"
    started: float = field(default_factory=time.time)
    first_step_end: float | None = None

    def add_traffic(self, label: str, traffic: Traffic, algorithm: str, kind: str) -> None:
        table = self.traffic.setdefault(self.phase, {})
        table.setdefault(category(label), Traffic()).add(traffic)
        seen = self.algorithms.setdefault(kind, [])
        if algorithm not in seen:
            seen.append(algorithm)

    def add_input(self, source: str, nbytes: int, reads: int = 1, epoch: int | None = None) -> None:
        tally = self.inputs.setdefault(source, InputTally())
        tally.bytes += int(nbytes)
        tally.reads += int(reads)
        if epoch is not None:
            tally.by_epoch[str(epoch)] = tally.by_epoch.get(str(epoch), 0) + int(nbytes)

    def add_checkpoint_file(self, step: int, nbytes: int, node_local: bool = False) -> None:
        """A file this rank wrote for checkpoint ``step``: on the shared file system, or node-local (a rank state
        handed to its node's local rank 0 for the per-node file)."""
        entry = self.checkpoints.setdefault(str(step), {"files": 0, "bytes": 0, "node_local_files": 0,
                                                        "node_local_bytes": 0})
        prefix = "node_local_" if node_local else ""
        entry[f"{prefix}files"] += 1
        entry[f"{prefix}bytes"] += int(nbytes)

    def add_checkpoint_records(self, step: int, nbytes: int) -> None:
        """Bytes of the file records (or their per-node reduction) that the commit of ``step`` delivered to this
        rank: what arrived, padding included."""
        entry = self.checkpoints.setdefault(str(step), {"files": 0, "bytes": 0, "node_local_files": 0,
                                                        "node_local_bytes": 0})
        entry["record_bytes"] = entry.get("record_bytes", 0) + int(nbytes)

    def step_done(self) -> None:
        self.steps += 1
        if self.first_step_end is None:
            self.first_step_end = time.time()
            self.phase = "train"
            counters.mark("first_step")

    def section(self) -> dict[str, Any]:
        """The ``work`` section of the rank's record (JSON-able)."""
        return {
            "steps": self.steps,
            "started": self.started,
            "first_step_end": self.first_step_end,
            "traffic": {phase: {cat: asdict(t) for cat, t in table.items()} for phase, table in self.traffic.items()},
            "algorithms": {kind: list(names) for kind, names in self.algorithms.items()},
            "inputs": {name: asdict(t) for name, t in self.inputs.items()},
            "checkpoints": {step: dict(v) for step, v in self.checkpoints.items()},
        }


# Labels the runtime gives its collectives -> what the record groups them under (first prefix that matches).
CATEGORIES = (("bucket", "gradients"), ("dasgd", "gradients"), ("stop flag", "stop flag"), ("metrics", "metrics"),
              ("checkpoint", "checkpoint"), ("broadcast", "model broadcast"), ("check_sync", "check sync"),
              ("data", "data"), ("nodes", "nodes"))


def category(label: str) -> str:
    for prefix, name in CATEGORIES:
        if label.startswith(prefix):
            return name
    return "other"


_counts: WorkCounts | None = None


def active() -> WorkCounts | None:
    """This process's counts when counting is on (created at the first call), else None."""
    global _counts
    if _counts is None and counters.enabled():
        _counts = WorkCounts()
    return _counts


def step_done() -> None:
    """The trainer calls this after every step: two tests when counting is off."""
    counts = _counts if _counts is not None else active()
    if counts is not None:
        counts.step_done()


def sections() -> dict[str, Any]:
    """Keyword sections for ``counters.write_record``: ``{"work": ...}``, or nothing when counting is off."""
    return {"work": _counts.section()} if _counts is not None else {}
