"""Walltime and preemption: a signal handler that only raises a flag, and an agreement across ranks.

The training loop checks ``agree(allreduce_max)`` at each step boundary, so every rank stops after the
same step, checkpoints outside the handler, and exits for requeue. No torch import: cheap to use anywhere.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable, Iterable
from types import FrameType


def signal_number(sig: str | int) -> int:
    """'USR2', 'SIGUSR2' or 15 -> the signal number."""
    if isinstance(sig, int):
        return sig
    name = sig.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(getattr(_signal, name))
    except AttributeError:
        raise ValueError(f"unknown signal {sig!r}; use a name such as USR2, TERM or INT") from None


class StopFlag:
    """Set by a signal and read at step boundaries.

    The handler does one attribute store and nothing else: no I/O, no locks, no allocation of note, so a
    second signal arriving while the first is handled cannot corrupt anything.
    """

    def __init__(self) -> None:
        self._signum: int = 0  # 0 = not requested; written by the handler, read by the loop
        self._previous: dict[int, object] = {}

    def install(self, signals: Iterable[str | int] = ("USR2",)) -> StopFlag:
        """Route ``signals`` to this flag (main thread only). Returns self."""
        for sig in signals:
            num = signal_number(sig)
            self._previous[num] = _signal.signal(num, self._handler)
            if num in EARLY_SIGNALS:
                self._signum = num  # it came before this flag existed
        return self

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        for num, previous in self._previous.items():
            _signal.signal(num, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self._signum = signum

    def set(self, signum: int = -1) -> None:
        """Raise the flag by hand (-1 = not from a signal, e.g. the agreement across ranks)."""
        self._signum = signum

    def requested(self) -> bool:
        return self._signum != 0

    @property
    def reason(self) -> str:
        """What raised the flag, for the log line the loop writes (never the handler)."""
        if self._signum == 0:
            return "not requested"
        if self._signum == -1:
            return "stop requested"
        return f"received {_signal.Signals(self._signum).name}"

    def agree(self, any_rank_reduce: Callable[[int], int]) -> bool:
        """True on every rank if any rank's flag is up; ``any_rank_reduce`` is an all-reduce max."""
        if any_rank_reduce(1 if self.requested() else 0) > 0:
            if not self.requested():
                self.set()
            return True
        return False

    def __enter__(self) -> StopFlag:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


EARLY_SIGNALS: list[int] = []


def catch_early_signals(stop_signal: str = "USR2") -> None:
    """Until a StopFlag is installed, only remember walltime/preemption signals (``EARLY_SIGNALS``).

    ``hpctrain run`` calls this first thing: a signal that arrives while torch is being imported would
    otherwise kill the rank (the default action) and lose the chance to checkpoint. ``StopFlag.install``
    takes over and raises itself when one was received.
    """
    for name in {stop_signal, "USR1", "USR2", "TERM"}:
        try:
            _signal.signal(signal_number(name), lambda signum, _frame: EARLY_SIGNALS.append(signum))
        except (ValueError, OSError):  # not the main thread, or a name this platform lacks
            continue


def ignore_late_signals(stop_signal: str = "USR2") -> None:
    """Ignore walltime/preemption signals from now on: the run has finished, or stopped after its checkpoint.

    Call it when training returns. Python gives every signal it handles back to the default action before it
    tears the interpreter down (``_PySignal_Fini`` runs before modules and native libraries are freed, which takes
    a while with torch and gloo loaded), so a walltime signal that arrives then kills a rank whose work is done:
    the launcher reports "killed by SIGUSR2", a finished run is recorded as failed, and a stopped one exits 140
    instead of asking for its requeue. An ignored signal stays ignored through the teardown. TERM stays as it is
    unless it is the stop signal: a scheduler's TERM still ends a rank that hangs in teardown.
    """
    for name in {stop_signal, "USR1", "USR2"}:
        try:
            _signal.signal(signal_number(name), _signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread, or a name this platform lacks
            continue
