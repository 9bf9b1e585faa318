"""StopFlag with real signals in real processes: the handler only raises a flag, the step in progress
finishes, the process exits with the caller's code; plus a signal from a timer thread and the cross-rank agreement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpctrain.checkpoint.signals import StopFlag, signal_number

REPO = Path(__file__).resolve().parents[1]

STEPPING = """
import sys, time
from hpctrain.checkpoint.signals import StopFlag
flag = StopFlag().install(("USR2",))
print("ready", flush=True)
for step in range(1, 2000):
    print(f"begin {step}", flush=True)
    deadline = time.monotonic() + 0.05
    x = 0
    while time.monotonic() < deadline:  # a step: compute, then a sleep a signal may interrupt
        x += sum(range(1000))
        time.sleep(0.005)
    print(f"end {step}", flush=True)
    if flag.requested():
        print(f"stop after {step}: {flag.reason}", flush=True)
        sys.exit(42)
sys.exit(1)
"""


def _start() -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", STEPPING], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _read_until(proc: subprocess.Popen[str], prefix: str) -> list[str]:
    assert proc.stdout is not None
    lines = []
    while not (lines and lines[-1].startswith(prefix)):
        line = proc.stdout.readline()
        assert line, f"process ended before {prefix!r}: {lines}"
        lines.append(line.strip())
    return lines


def _check_finished_cleanly(lines: list[str]) -> int:
    """Every begun step ended, and the stop came right after the last one. Returns that step."""
    begun = [int(x.split()[1]) for x in lines if x.startswith("begin")]
    ended = [int(x.split()[1]) for x in lines if x.startswith("end")]
    assert begun == ended
    stops = [x for x in lines if x.startswith("stop")]
    assert len(stops) == 1 and lines[-1] == stops[0]
    assert lines[-2] == f"end {ended[-1]}" and stops[0].startswith(f"stop after {ended[-1]}: received SIGUSR2")
    return ended[-1]


def test_usr2_finishes_the_current_step_then_exits_with_chosen_code() -> None:
    proc = _start()
    lines = _read_until(proc, "begin 3")
    os.kill(proc.pid, signal.SIGUSR2)
    assert proc.stdout is not None
    lines += [x.strip() for x in proc.stdout.read().splitlines()]
    assert proc.wait(timeout=30) == 42
    assert _check_finished_cleanly(lines) in (3, 4)  # the step in flight when it arrived (4 if it just ended)


def test_a_burst_of_signals_stops_once() -> None:
    proc = _start()
    lines = _read_until(proc, "begin 2")
    for _ in range(300):
        os.kill(proc.pid, signal.SIGUSR2)
    assert proc.stdout is not None
    lines += [x.strip() for x in proc.stdout.read().splitlines()]
    assert proc.wait(timeout=30) == 42
    _check_finished_cleanly(lines)


def _signal_after(seconds: float, signum: int) -> threading.Timer:
    """Send ``signum`` to this process from a started daemon thread after ``seconds``."""
    timer = threading.Timer(seconds, os.kill, args=(os.getpid(), signum))
    timer.daemon = True
    timer.start()
    return timer


def test_a_signal_from_a_timer_thread_raises_the_flag_through_the_handler() -> None:
    with StopFlag().install(("USR2",)) as flag:
        start = time.monotonic()
        timer = _signal_after(0.15, signal.SIGUSR2)
        while not flag.requested() and time.monotonic() - start < 10:
            time.sleep(0.01)
        timer.cancel()
        assert flag.requested() and flag.reason == "received SIGUSR2"
        assert time.monotonic() - start >= 0.14
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # uninstalled on exit


def test_agree_raises_every_flag_when_any_rank_asked() -> None:
    asked, quiet = StopFlag(), StopFlag()
    asked.set()
    values = [1 if f.requested() else 0 for f in (asked, quiet)]

    def allreduce_max(v: int) -> int:
        return max(values)

    assert asked.agree(allreduce_max) and quiet.agree(allreduce_max)
    assert quiet.requested() and quiet.reason == "stop requested"
    assert StopFlag().agree(lambda v: v) is False


def test_signal_names() -> None:
    assert signal_number("USR2") == signal_number("SIGUSR2") == signal.SIGUSR2
    assert signal_number(15) == 15
    with pytest.raises(ValueError, match="unknown signal 'NOPE'"):
        signal_number("NOPE")


LATE_SIGNAL = """
import os, signal, sys
from hpctrain.checkpoint.signals import catch_early_signals, ignore_late_signals
catch_early_signals()
if sys.argv[1] == "ignore":
    ignore_late_signals()
class LateSignal:
    '''Sends the walltime signal from its destructor: during module teardown, after Python's signal handling
    has ended (what a scheduler's signal does when it lands while torch and gloo are being freed).'''
    def __init__(self):
        self.kill, self.pid, self.signal = os.kill, os.getpid(), signal.SIGUSR2
    def __del__(self):
        self.kill(self.pid, self.signal)
late = LateSignal()
print("training finished", flush=True)
"""


@pytest.mark.parametrize("late", ["ignore", "keep"])
def test_a_walltime_signal_during_the_teardown_does_not_kill_a_finished_rank(late: str) -> None:
    """The suite once recorded a finished run as failed: its walltime signal came after the last step, while the
    rank's interpreter was shutting down, and the default action killed it (launcher: "killed by SIGUSR2", exit
    140). ``hpctrain run`` now calls ``ignore_late_signals`` when training returns; without it ("keep") the same
    late signal still kills the process, so the test would catch the call going missing."""
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL, late], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert "training finished" in proc.stdout
    assert proc.returncode == (0 if late == "ignore" else -signal.SIGUSR2), proc.stderr


def test_hpctrain_run_ignores_late_signals_once_training_returns() -> None:
    """``hpctrain run`` calls ``ignore_late_signals`` right after ``train`` returns (read from its source: the
    call, not a copy of it, is what protects the ranks)."""
    import ast
    import inspect

    from hpctrain.commands import run

    tree = ast.parse(inspect.getsource(run.cmd_run))
    line = {n.func.id: n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "train" in line and "ignore_late_signals" in line
    assert 0 < line["ignore_late_signals"] - line["train"] <= 3  # right after the call to train()
