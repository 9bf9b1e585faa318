"""Every collective of a multi-rank communicator numbered and watched: if one does not complete within
``timeout_s`` the job aborts with a message naming the rank(s) that never arrived. The ranks are asked only after
the timeout, over a side channel their watchdog (or liveness listener) threads answer, so the fast path carries no
per-collective bookkeeping message and no per-tick request (runtime/comm/liveness.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpctrain.errors import RuntimeFailure
from hpctrain.runtime.comm.base import Communicator
from hpctrain.runtime.comm.watchdog import Pending


def _missing_message(missing: list[int], pending: Pending, timeout_s: float) -> str:
    if not missing:
        return f"every rank arrived at {pending.describe()} but it did not complete within {timeout_s:g} s"
    who = ", ".join(f"rank {r}" for r in missing)
    return f"{who} did not arrive at {pending.describe()} within {timeout_s:g} s"


def late_message(behind: list[int], silent: list[int], pending: Pending, timeout_s: float) -> str:
    msg = _missing_message(behind, pending, timeout_s)
    if silent:
        msg += "; " + ", ".join(f"rank {r}" for r in silent) + " did not answer (frozen or dead)"
    return msg


class WatchedCommunicator(Communicator):
    """Every collective of a multi-rank communicator is numbered and armed on the watchdog.

    Subclasses set ``_closed``, ``_index`` and ``_watchdog`` in their constructor.
    """

    _closed: bool
    _index: int
    _watchdog: Any

    def _begin(self, kind: str, label: str, is_done: Callable[[], bool] | None = None) -> Pending:
        if self._closed:
            raise RuntimeFailure(f"rank {self.rank}: {kind} on a closed communicator")
        self._index += 1
        return self._watchdog.arm(self._index, kind, label, is_done)

    def _run(self, kind: str, label: str, fn: Callable[[], Any]) -> Any:
        pending = self._begin(kind, label)
        try:
            return fn()
        finally:
            self._watchdog.disarm(pending)
