"""Run a rendered script on this machine as if a scheduler did: detached, with a walltime and a record.

``submit SCRIPT`` (in the run directory, like ``sbatch``) reads the script's ``#LOCAL`` directives and starts
a supervisor process (its pid is the job id, printed) that runs ``bash SCRIPT`` in its own process group,
sends the checkpoint signal ``lead`` seconds before the walltime and SIGTERM/SIGKILL at the walltime (like
Slurm), and writes ``job-state.json`` atomically when the script ends. When the script exits 75 (stopped at
a checkpoint) it is run again with a fresh walltime and ``HPCTRAIN_RESTART_COUNT``, up to ``max_requeues``
times — what ``scontrol requeue`` does on Slurm. ``status JOB DIR ...`` prints one JSON line per job and
``cancel JOB DIR`` signals a supervisor, from any later process (submitit's LocalExecutor keeps a controller
process too; ours adds the walltime signal and the requeue); ``signal JOB DIR SIG`` has it send the job's warning
signal now. The ``local`` back-end (local.py) runs these.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.exit_codes import EXIT_REQUEUE
from hpctrain.files import write_atomic
from hpctrain.submission.schedulers.exit_status import ended_text

STATE_FILE = "job-state.json"
PID_FILE = "job-supervisor.json"
LOG_FILE = "job.out"
DIRECTIVE = "#LOCAL"
KILL_WAIT_S = 30.0  # Slurm's default KillWait between SIGTERM and SIGKILL
# The states a record holds: names of hpctrain's JobState.
STATES = frozenset({"RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "MISSING"})


@dataclass(frozen=True)
class LocalJobState:
    """What the supervisor recorded: state is one of RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, MISSING."""

    state: str
    exit_code: int | None
    reason: str
    restarts: int = 0  # how many times the script was run again after stopping at a checkpoint


def _write_json_atomic(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data))


def _process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (to tell our supervisor from a later process with the same pid); None
    when no such process runs. A zombie has ended: where PID 1 does not reap orphans (a container whose first
    process is a shell), a supervisor that outlived its submitting process stays one, with its start time."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return None


def start(script: str | Path, run_dir: str | Path, *, walltime_s: int, signal_name: str = "USR2",
          signal_lead_s: int = 60, max_requeues: int = 0, python: str | None = None) -> str:
    """Start the supervisor detached; returns the job id (the supervisor's pid).

    Refused (RuntimeError) while an earlier job's supervisor still lives in ``run_dir``: two jobs would write
    the same checkpoints (a continuation submitted right after a cancel, before the ranks have ended).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    earlier = _supervisor(run_dir)
    if earlier is not None and _alive(earlier):
        raise RuntimeError(f"job {earlier['pid']} still runs in {run_dir}; wait for it to end")
    (run_dir / STATE_FILE).unlink(missing_ok=True)  # a continuation in the same run dir starts afresh
    out = open(run_dir / LOG_FILE, "ab")  # noqa: SIM115 - handed to the child
    argv = [python or sys.executable, "-m", "hpctrain.submission.schedulers.local_controller", "supervise",
            "--run-dir", str(run_dir), "--walltime", str(walltime_s), "--signal", signal_name,
            "--lead", str(signal_lead_s), "--max-requeues", str(max_requeues), "--", "bash", str(script)]
    proc = subprocess.Popen(argv, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    _write_json_atomic(run_dir / PID_FILE, {"pid": proc.pid, "start_time": _process_start_time(proc.pid),
                                            "signal": signal_name})
    return str(proc.pid)


def _read_record(run_dir: Path, job_id: str) -> dict | None:
    """The state record of job ``job_id`` (None when there is none, or it is an earlier job's)."""
    try:
        record = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or "state" not in record or record.get("job", job_id) != job_id:
        return None
    return record


def _state_of(record: dict) -> LocalJobState:
    return LocalJobState(record["state"], record.get("exit_code"), record.get("reason", ""),
                         int(record.get("restarts", 0)))


def _supervisor(run_dir: Path) -> dict | None:
    try:
        info = json.loads((run_dir / PID_FILE).read_text())
        return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None
    except (OSError, ValueError):
        return None


def _alive(info: dict) -> bool:
    """Whether the supervisor a pid file names still runs (and is not a later process with its pid)."""
    return bool(info.get("start_time")) and _process_start_time(int(info["pid"])) == info.get("start_time")


def status(run_dir: str | Path, job_id: str | None = None) -> LocalJobState:
    """The job's state from its record, or from whether its supervisor still lives.

    The supervisor writes a RUNNING record (with its restart count) while the script runs and the final
    record when it ends; a RUNNING record whose supervisor is gone means it was killed (FAILED). With
    ``job_id``, a run directory now holding another job (a continuation) answers MISSING for this one.
    """
    run_dir = Path(run_dir)
    info = _supervisor(run_dir)
    if info is None:
        return LocalJobState("MISSING", None, "no supervisor record in the run directory")
    if job_id is not None and str(info["pid"]) != job_id:
        return LocalJobState("MISSING", None, f"job {info['pid']} runs in this run directory now")
    record = _read_record(run_dir, str(info["pid"]))
    if record is not None and record["state"] != "RUNNING":
        return _state_of(record)
    if _alive(info):
        return LocalJobState("RUNNING", None, "", int(record.get("restarts", 0)) if record else 0)
    time.sleep(0.2)  # the supervisor may be writing its record right now
    record = _read_record(run_dir, str(info["pid"]))
    if record is not None and record["state"] != "RUNNING":
        return _state_of(record)
    return LocalJobState("FAILED", None, "the supervisor ended without a record (killed or machine restarted)",
                         int(record.get("restarts", 0)) if record else 0)


def cancel(run_dir: str | Path, job_id: str | None = None) -> bool:
    """Ask the supervisor to stop the job (SIGTERM, then SIGKILL after the grace period); False if not running."""
    info = _supervisor(Path(run_dir))
    if info is None or (job_id is not None and str(info["pid"]) != job_id):
        return False
    if not _alive(info):
        return False
    os.kill(int(info["pid"]), signal.SIGTERM)
    return True


def send_signal(run_dir: str | Path, job_id: str, signal_name: str) -> bool:
    """Have the supervisor send its job's warning signal to the script now, as it does before the walltime;
    False if the job is not running. ValueError for another signal than the job's (it would end the
    supervisor) or one that cancels (TERM, INT)."""
    info = _supervisor(Path(run_dir))
    if info is None or str(info["pid"]) != job_id or not _alive(info):
        return False
    if signal_name in ("TERM", "INT") or info.get("signal", signal_name) != signal_name:
        raise ValueError(f"job {job_id} takes its warning signal {info.get('signal')} on request, not {signal_name}")
    os.kill(int(info["pid"]), getattr(signal, f"SIG{signal_name}"))
    return True


def read_directives(script: Path) -> argparse.Namespace:
    """The ``#LOCAL`` options of a script (walltime_s, signal, lead, max_requeues), like sbatch reads #SBATCH.

    Directives are read from the comment lines at the top of the script, up to its first command.
    """
    parser = argparse.ArgumentParser(prog=f"{DIRECTIVE} directives of {script}", add_help=False)
    parser.add_argument("--walltime-s", type=int, required=True)
    parser.add_argument("--signal", default="USR2@60")
    parser.add_argument("--max-requeues", type=int, default=0)
    words: list[str] = []
    for line in script.read_text(encoding="utf-8").splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith(DIRECTIVE + " "):
            words += shlex.split(line[len(DIRECTIVE):])
    args = parser.parse_args(words)
    name, _, lead = args.signal.partition("@")
    args.signal, args.lead = name, int(lead or 60)
    return args


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
    warn_signal = getattr(signal, f"SIG{signal_name}")
    if warn_signal not in (signal.SIGTERM, signal.SIGINT):  # those two cancel
        def forward(_signum: int, _frame: object) -> None:
            if children and children[-1].poll() is None:
                print(f"hpctrain: local controller: SIG{signal_name} sent to the job on request", flush=True)
                try:
                    os.kill(children[-1].pid, warn_signal)
                except ProcessLookupError:
                    pass

        signal.signal(warn_signal, forward)
    job = str(os.getpid())  # the job id: start() returned this process's pid
    restarts = 0
    while True:
        _write_json_atomic(run_dir / STATE_FILE, {"job": job, "state": "RUNNING", "exit_code": None, "reason": "",
                                                  "restarts": restarts})
        code, timed_out = _run_once(command, run_dir, walltime_s, signal_name, lead_s, restarts, children,
                                    cancelled_at)
        if code == EXIT_REQUEUE and not cancelled_at and not timed_out and restarts < max_requeues:
            restarts += 1
            print(f"hpctrain: local controller: the job stopped at a checkpoint; running it again "
                  f"(restart {restarts} of {max_requeues})", flush=True)
            continue
        break
    state, reason = final_state(code, cancelled=bool(cancelled_at), timed_out=timed_out, walltime_s=walltime_s,
                                max_requeues=max_requeues)
    _write_json_atomic(run_dir / STATE_FILE, {"job": job, "state": state, "exit_code": code, "reason": reason,
                                              "restarts": restarts, "ended": time.time()})
    return 0


def final_state(code: int, *, cancelled: bool, timed_out: bool, walltime_s: int, max_requeues: int) -> tuple[str, str]:
    """(state, reason) of a job whose script's last run returned ``code`` (Python's: -S for a death by signal S)."""
    if cancelled:
        return "CANCELLED", "cancelled by the user"
    if timed_out:
        return "TIMEOUT", f"walltime of {walltime_s} s reached"
    if code == 0:
        return "COMPLETED", ""
    if code == EXIT_REQUEUE:
        return "FAILED", (f"stopped at a checkpoint (exit {code}) and max_requeues ({max_requeues}) is reached; "
                          "continue with `hpctrain resume`")
    return "FAILED", ended_text(code)


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
    p_submit = sub.add_parser("submit", help="start SCRIPT under a supervisor in this directory; print the job id")
    p_submit.add_argument("script")
    p_status = sub.add_parser("status", help="one JSON line per JOB RUN_DIR pair")
    p_status.add_argument("pairs", nargs="*", metavar="JOB RUN_DIR")
    p_cancel = sub.add_parser("cancel", help="stop job JOB of RUN_DIR")
    p_cancel.add_argument("job")
    p_cancel.add_argument("run_dir")
    p_signal = sub.add_parser("signal", help="send job JOB of RUN_DIR its warning signal SIG now")
    p_signal.add_argument("job")
    p_signal.add_argument("run_dir")
    p_signal.add_argument("signal")
    p = sub.add_parser("supervise")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--walltime", type=int, required=True)
    p.add_argument("--signal", default="USR2")
    p.add_argument("--lead", type=int, default=60)
    p.add_argument("--max-requeues", type=int, default=0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.action == "submit":
        script = Path(args.script).resolve()
        try:
            opts = read_directives(script)
        except (OSError, SystemExit) as exc:
            print(f"local controller: cannot read the {DIRECTIVE} directives of {script}: {exc}", file=sys.stderr)
            return 1
        try:
            job = start(script, Path.cwd(), walltime_s=opts.walltime_s, signal_name=opts.signal,
                        signal_lead_s=opts.lead, max_requeues=opts.max_requeues)
        except (RuntimeError, OSError) as exc:
            print(f"local controller: {exc}", file=sys.stderr)
            return 1
        print(job)
        return 0
    if args.action == "status":
        if len(args.pairs) % 2:
            parser.error("status takes JOB RUN_DIR pairs")
        for job, run_dir in zip(args.pairs[::2], args.pairs[1::2], strict=True):
            st = status(run_dir, job)
            print(json.dumps({"job": job, "state": st.state, "exit_code": st.exit_code, "reason": st.reason,
                              "restarts": st.restarts}))
        return 0
    if args.action == "cancel":
        if cancel(args.run_dir, args.job):
            return 0
        print(f"local controller: job {args.job} is not running", file=sys.stderr)
        return 1
    if args.action == "signal":
        if not hasattr(signal, f"SIG{args.signal}"):
            parser.error(f"no signal SIG{args.signal}")
        try:
            if send_signal(args.run_dir, args.job, args.signal):
                return 0
        except ValueError as exc:
            print(f"local controller: {exc}", file=sys.stderr)
            return 1
        print(f"local controller: job {args.job} is not running", file=sys.stderr)
        return 1
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return supervise(command, Path(args.run_dir), args.walltime, args.signal, args.lead, args.max_requeues)


if __name__ == "__main__":
    sys.exit(main())
