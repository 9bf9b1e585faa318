"""A watchdog thread that turns a stuck collective into a loud abort instead of a silent hang.

Every collective is registered with ``arm`` before it starts and ``disarm``-ed when it completes; when one
is still pending after ``timeout_s`` the ``on_timeout`` callback runs (it names the missing ranks and aborts).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CLOSE_WAIT_S = 30.0  # how long close() waits for a poll in progress


@dataclass(slots=True, eq=True)
class Pending:
    """One collective in flight: its sequence number (the same on every rank) and what it is."""

    index: int
    kind: str
    label: str
    started: float
    is_done: Callable[[], bool] | None = None

    def describe(self) -> str:
        what = f"{self.kind}, {self.label}" if self.label else self.kind
        return f"collective #{self.index} ({what})"


class Watchdog:
    """Background thread; ``on_timeout(pending)`` runs once, on the watchdog thread, for the oldest late one.

    ``poll`` (optional) runs every tick, even when nothing is pending: a communicator whose side channel is MPI
    uses it to answer another rank's "which collective have you reached?" from its own queue (runtime/comm/liveness.py);
    it must not send a request to another process, or every tick of every rank would.
    """

    def __init__(
        self,
        timeout_s: float,
        on_timeout: Callable[[Pending], None],
        poll: Callable[[], None] | None = None,
        tick_s: float | None = None,
    ) -> None:
        self.timeout_s = float(timeout_s)
        self._on_timeout = on_timeout
        self._poll = poll
        self._tick = tick_s if tick_s is not None else min(1.0, max(0.05, self.timeout_s / 20))
        self._pending: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fired = False
        self._thread = threading.Thread(target=self._run, name="hpctrain-watchdog", daemon=True)
        self._thread.start()

    @property
    def tick_s(self) -> float:
        """How often the thread checks deadlines and runs ``poll``."""
        return self._tick

    def arm(
        self, index: int, kind: str, label: str = "", is_done: Callable[[], bool] | None = None
    ) -> Pending:
        """Start the clock for collective ``index``; ``is_done`` lets an un-waited async op count as done."""
        p = Pending(index, kind, label, time.monotonic(), is_done)
        with self._lock:
            self._pending[index] = p
        return p

    def disarm(self, pending: Pending) -> None:
        with self._lock:
            self._pending.pop(pending.index, None)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the thread and wait for it: a poll in progress (a store or MPI call) is let finish.

        A daemon thread still inside a native call when the interpreter shuts down is ended from under that
        call (Python 3.11 exits it on the GIL), which aborts the process where the call is C++ (pybind11):
        so the wait (``CLOSE_WAIT_S`` by default) outlasts any poll: the gloo side store answers or fails
        within ``comm.SIDE_STORE_TIMEOUT_S``, MPI's probes do not block.
        """
        self._stop.set()
        if threading.current_thread() is self._thread:
            return
        timeout_s = CLOSE_WAIT_S if timeout_s is None else timeout_s
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            print(f"hpctrain watchdog: its thread did not stop within {timeout_s:g} s", file=sys.stderr, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            if self._poll is not None:
                try:
                    self._poll()
                except Exception as exc:  # a failing poll must not kill the watchdog itself
                    print(f"hpctrain watchdog: poll failed: {exc}", file=sys.stderr, flush=True)
            with self._lock:
                for p in [p for p in self._pending.values() if p.is_done is not None and p.is_done()]:
                    del self._pending[p.index]
                oldest = min(self._pending.values(), key=lambda p: p.started, default=None)
            if oldest is not None and not self._fired and time.monotonic() - oldest.started > self.timeout_s:
                self._fired = True
                self._on_timeout(oldest)
