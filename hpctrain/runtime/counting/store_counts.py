"""Per-rank count of what a torch.distributed rank asks of the rendezvous store server (rank 0's TCPStore, or the
launcher agent's): every call, by operation and phase, counted where the rank makes it, and the connections it
opens. Summed over ranks this is what the server serves. gloo's own C++ calls are in the count: gloo reaches the
store only through the Python store objects this module wraps.

Switched on with runtime/counting/counters.py's switch (``HPCTRAIN_COUNTERS``); written as the record's ``store``
section. Record format: docs/scaling.md, "Counters".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from hpctrain.runtime.counting import counters

PHASES = ("startup", "train", "close")


@dataclass
class StoreCounts:
    """``server``: who serves the store this rank talks to ("rank 0", "launcher agent", "none" when the ranks
    bootstrapped over MPI and no store exists); ``rendezvous``: how gloo's addresses were exchanged ("mpi",
    "store"); ``calls``: phase -> operation -> calls sent to the server; ``local_calls``: the store calls of
    gloo's rendezvous this process answered itself; ``connections``: client connections this rank opened."""

    server: str = "none"
    rendezvous: str = ""
    connections: int = 0
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    local_calls: int = 0
    closing: bool = False
    close_started: float | None = None  # time.time() when close began: the end of the training phase

    def begin_close(self) -> None:
        self.closing, self.close_started = True, time.time()

    def phase(self) -> str:
        if self.closing:
            return "close"
        from hpctrain.runtime.counting import work_counts

        counts = work_counts.active()
        return counts.phase if counts is not None else "startup"

    def call(self, op: str) -> None:
        table = self.calls.setdefault(self.phase(), {})
        table[op] = table.get(op, 0) + 1

    def section(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("closing")
        out["totals"] = {p: sum(self.calls.get(p, {}).values()) for p in PHASES}
        return out


_counts: StoreCounts | None = None


def active() -> StoreCounts | None:
    """This process's counts when counting is on (created at the first call), else None."""
    global _counts
    if _counts is None and counters.enabled():
        _counts = StoreCounts()
    return _counts


def sections() -> dict[str, Any]:
    """Keyword sections for ``counters.write_record``: ``{"store": ...}``, or nothing when no store was counted."""
    return {"store": _counts.section()} if _counts is not None else {}


def counted_client(store: Any) -> Any:
    """``store`` (a fresh client connection to the server) counted: one connection, then every call."""
    counts = active()
    if counts is None:
        return store
    from hpctrain.runtime.comm.exchange_store import CountingStore

    counts.connections += 1
    return CountingStore(store, counts.call)
