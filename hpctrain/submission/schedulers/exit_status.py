"""How a job's end is said, the same way whichever scheduler reported it: a death by signal as
``killed by signal 9 (SIGKILL), exit status 137``, any other failure as ``exit code 2``.

A signal death reaches hpctrain in several shapes: Slurm's ExitCode ``0:9`` (the batch shell itself was killed)
or ``137:0`` (the shell exited with what its launcher reported for a killed rank: 128 + 9, the number the job log
prints), PBS's Exit_status 256 + 9, and the local controller's -9 (Python's return code of a killed child). Each
is read back to the signal; the exit status shown is the scheduler's number where it gave one above 0, else the
128 + S a shell reports, so that the status matches the job log's "launcher exited with status 137".
"""

from __future__ import annotations

import re
import signal as signals

SHELL_SIGNAL_BASE = 128  # a shell reports a child killed by signal S as 128 + S
PBS_SIGNAL_BASE = 256  # PBS's Exit_status of a job whose top shell was killed by signal S: 256 + S
MAX_SIGNAL = 64  # signals are 1..64 on Linux (SIGRTMAX)

# The texts this module writes, and the shorter ones of earlier versions, for one death by signal.
SIGNAL_DEATH = re.compile(r"(exit code -?\d+ \()?killed by signal \d+( \(SIG\w+\))?(, exit status \d+)?\)?")


def death_signal(code: int | None, signal: int | None = None) -> int | None:
    """The signal that ended a job or process: the scheduler's own (``signal``), else the one its exit status
    encodes (-S, 128 + S, PBS's 256 + S); None when it exited by itself."""
    if signal:
        return signal
    if code is None:
        return None
    for base in (0, SHELL_SIGNAL_BASE, PBS_SIGNAL_BASE):
        if 0 < abs(code) - base <= MAX_SIGNAL and (code < 0) == (base == 0):
            return abs(code) - base
    return None


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``SIG43`` for a number this platform has no name for."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def ended_text(code: int | None, signal: int | None = None) -> str:
    """``killed by signal 9 (SIGKILL), exit status 137`` for a death by signal, ``exit code N`` otherwise
    (``signal``: the one the scheduler reported beside ``code``, Slurm's ``0:9``)."""
    sig = death_signal(code, signal)
    if sig is None:
        return f"exit code {code}"
    if sig > MAX_SIGNAL:  # not a signal's number (Slurm's OUT_OF_MEMORY reads 0:125): as the scheduler said it
        return f"killed by signal {sig}"
    status = code if code is not None and code > 0 else SHELL_SIGNAL_BASE + sig
    return f"killed by signal {sig} ({signal_name(sig)}), exit status {status}"
