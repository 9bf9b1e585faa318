"""Run a rendered script on this machine as if a scheduler did: detached, with a walltime and a record.

``start`` launches a supervisor process (its pid is the job id) that runs ``bash SCRIPT`` in its own
process group, sends the checkpoint signal ``lead`` seconds before the walltime and SIGTERM/SIGKILL at
the walltime (like Slurm), and writes ``job-state.json`` atomically when the script ends. When the script
exits 75 (stopped at a checkpoint) it is run again with a fresh walltime and ``HPCTRAIN_RESTART_COUNT``,
up to ``max_requeues`` times — what ``scontrol requeue`` does on Slurm. Status and cancel work from any
later process, so the CLI can exit while the run goes on (submitit's LocalExecutor does the same with a
controller process; ours adds the walltime signal and the requeue).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.exit_codes import EXIT_REQUEUE

STATE_FILE = "job-state.json"
PID_FILE = "job-supervisor.json"
KILL_WAIT_S = 30.0  # Slurm's default KillWait between SIGTERM and SIGKILL


@dataclass(frozen=True)
class LocalJobState:
    """What the supervisor recorded: state is one of RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, MISSING."""

    state: str
    exit_code: int | None
    reason: str
    restarts: int = 0  # how many times the script was run again after stopping at a checkpoint


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (to tell our supervisor from a later process with the same pid)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return None


def start(script: str | Path, run_dir: str | Path, *, walltime_s: int, signal_name: str = "USR2",
          signal_lead_s: int = 60, max_requeues: int = 0, python: str | None = None) -> str:
    """Start the supervisor detached; returns the job id (the supervisor's pid)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STATE_FILE).unlink(missing_ok=True)  # a continuation in the same run dir starts afresh
    out = open(run_dir / "job.out", "ab")  # noqa: SIM115 - handed to the child
    argv = [python or sys.executable, "-m", "hpctrain.submission.schedulers.local_controller", "supervise",
            "--run-dir", str(run_dir), "--walltime", str(walltime_s), "--signal", signal_name,
            "--lead", str(signal_lead_s), "--max-requeues", str(max_requeues), "--", "bash", str(script)]
    proc = subprocess.Popen(argv, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    _write_json_atomic(run_dir / PID_FILE, {"pid": proc.pid, "start_time": _process_start_time(proc.pid)})
    return str(proc.pid)


def _read_record(run_dir: Path) -> dict | None:
    try:
        record = json.loads((run_dir / STATE_FILE).read_text())
        return record if isinstance(record, dict) and "state" in record else None
    except (OSError, ValueError):
        return None


def _state_of(record: dict) -> LocalJobState:
    return LocalJobState(record["state"], record.get("exit_code"), record.get("reason", ""),
                         int(record.get("restarts", 0)))


def status(run_dir: str | Path) -> LocalJobState:
    """The job's state from its record, or from whether its supervisor still lives.

    The supervisor writes a RUNNING record (with its restart count) while the script runs and the final
    record when it ends; a RUNNING record whose supervisor is gone means it was killed (FAILED).
    """
    run_dir = Path(run_dir)
    record = _read_record(run_dir)
    if record is not None and record["state"] != "RUNNING":
        return _state_of(record)
    try:
        info = json.loads((run_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return LocalJobState("MISSING", None, "no supervisor record in the run directory")
    if _process_start_time(int(info["pid"])) == info.get("start_time") and info.get("start_time"):
        return LocalJobState("RUNNING", None, "", int(record.get("restarts", 0)) if record else 0)
    time.sleep(0.2)  # the supervisor may be writing its record right now
    record = _read_record(run_dir)
    if record is not None and record["state"] != "RUNNING":
        return _state_of(record)
    return LocalJobState("FAILED", None, "the supervisor ended without a record (killed or machine restarted)",
                         int(record.get("restarts", 0)) if record else 0)


def cancel(run_dir: str | Path) -> bool:
    """Ask the supervisor to stop the job (SIGTERM, then SIGKILL after the grace period); False if not running."""
    run_dir = Path(run_dir)
    try:
        info = json.loads((run_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return False
    pid = int(info["pid"])
    if _process_start_time(pid) != info.get("start_time"):
        return False
    os.kill(pid, signal.SIGTERM)
    return True


def supervise(command: Sequence[str], run_dir: Path, walltime_s: int, signal_name: str, lead_s: int,
              max_requeues: int = 0) -> int:
    """Run ``command`` under a walltime, again after each exit 75 (up to ``max_requeues``); record the end."""
    cancelled_at: list[float] = []
    children: list[subprocess.Popen] = []

    def on_cancel(_signum: int, _frame: object) -> None:
        if not cancelled_at:
            cancelled_at.append(time.monotonic())
            if children:
                _signal_group(children[-1].pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_cancel)
    signal.signal(signal.SIGINT, on_cancel)
    restarts = 0
    while True:
        _write_json_atomic(run_dir / STATE_FILE, {"state": "RUNNING", "exit_code": None, "reason": "",
                                                  "restarts": restarts})
        code, timed_out = _run_once(command, run_dir, walltime_s, signal_name, lead_s, restarts, children,
                                    cancelled_at)
        if code == EXIT_REQUEUE and not cancelled_at and not timed_out and restarts < max_requeues:
            restarts += 1
            print(f"hpctrain: local controller: the job stopped at a checkpoint; running it again "
                  f"(restart {restarts} of {max_requeues})", flush=True)
            continue
        break
    if cancelled_at:
        state, reason = "CANCELLED", "cancelled by the user"
    elif timed_out:
        state, reason = "TIMEOUT", f"walltime of {walltime_s} s reached"
    elif code == 0:
        state, reason = "COMPLETED", ""
    elif code == EXIT_REQUEUE:
        state, reason = "FAILED", (f"stopped at a checkpoint (exit {code}) and max_requeues ({max_requeues}) "
                                   "is reached; continue with `hpctrain resume`")
    else:
        state, reason = "FAILED", f"the script exited with code {code}"
    _write_json_atomic(run_dir / STATE_FILE, {"state": state, "exit_code": code, "reason": reason,
                                              "restarts": restarts, "ended": time.time()})
    return 0


def _run_once(command: Sequence[str], run_dir: Path, walltime_s: int, signal_name: str, lead_s: int,
              restarts: int, children: list[subprocess.Popen], cancelled_at: list[float]) -> tuple[int, bool]:
    """One run of the script in its own process group; (exit code, whether the walltime ended it)."""
    warn_signal = getattr(signal, f"SIG{signal_name}")
    child = subprocess.Popen(list(command), cwd=run_dir, start_new_session=True,
                             env={**os.environ, "HPCTRAIN_LOCAL_JOB_ID": str(os.getpid()),
                                  "HPCTRAIN_WALLTIME_S": str(walltime_s),
                                  "HPCTRAIN_RESTART_COUNT": str(restarts)})
    children.append(child)
    if cancelled_at:  # cancelled between two runs
        _signal_group(child.pid, signal.SIGTERM)
    started = time.monotonic()
    warned, terminated_at = False, None
    while child.poll() is None:
        elapsed = time.monotonic() - started
        if not warned and elapsed >= max(0, walltime_s - lead_s):
            warned = True  # like Slurm's --signal=B:SIG@LEAD: to the batch shell only, which forwards it
            try:
                os.kill(child.pid, warn_signal)
            except ProcessLookupError:
                pass
        if terminated_at is None and elapsed >= walltime_s:
            terminated_at = time.monotonic()
            _signal_group(child.pid, signal.SIGTERM)
        if terminated_at is not None and time.monotonic() - terminated_at > KILL_WAIT_S:
            _signal_group(child.pid, signal.SIGKILL)
        if cancelled_at and time.monotonic() - cancelled_at[0] > KILL_WAIT_S:
            _signal_group(child.pid, signal.SIGKILL)
        time.sleep(0.1)
    return child.returncode, terminated_at is not None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.schedulers.local_controller")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("supervise")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--walltime", type=int, required=True)
    p.add_argument("--signal", default="USR2")
    p.add_argument("--lead", type=int, default=60)
    p.add_argument("--max-requeues", type=int, default=0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return supervise(command, Path(args.run_dir), args.walltime, args.signal, args.lead, args.max_requeues)


if __name__ == "__main__":
    sys.exit(main())
