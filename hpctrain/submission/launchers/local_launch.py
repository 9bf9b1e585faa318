"""Start N ranks of a command on this machine: the launcher of the ``local`` site (no scheduler).

Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Walltime and preemption signals sent to the launcher are forwarded to every rank. When one
rank dies, the others are stopped and the launcher exits non-zero naming the rank, so a dead rank never
leaves the job hanging; a rank killed by a signal is the run's failure note (``--note-dir``, by default the
``--run-dir`` of the command, or the run directory it runs in).
``python -m hpctrain.submission.launchers.local_launch --nprocs 2 [--log-dir D] -- CMD ...``
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from hpctrain.exit_codes import EXIT_REQUEUE
from hpctrain.launch_env import torchrun_variables
from hpctrain.submission.failure import SIGNAL, record_failure

FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE_SECONDS = 10.0
JOB_SCRIPT = "job.sh"  # what a run directory holds (submission/run_record.py)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_environment(base: dict[str, str], rank: int, nprocs: int, port: int) -> dict[str, str]:
    env = dict(base)
    env.update(torchrun_variables(rank, nprocs, rank, nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               HPCTRAIN_LAUNCHER="local")
    return env


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _pump(stream: IO[bytes], rank: int, sinks: list[IO[bytes]], prefix: bool) -> None:
    """Copy a rank's output line by line to the launcher's stdout (prefixed) and its log file."""
    tag = f"[rank {rank}] ".encode()
    for line in iter(stream.readline, b""):
        for sink in sinks:
            sink.write((tag + line) if prefix and sink is sys.stdout.buffer else line)
            sink.flush()
    stream.close()


def note_dir_for(command: Sequence[str], cwd: Path | None = None) -> str | None:
    """Where the failure note of ``command``'s run goes: the ``--run-dir`` of an ``hpctrain run`` command, else
    the working directory when it is a run directory (it holds the job's script: the batch script runs the
    launcher there, as for submitit's runner); None otherwise."""
    for i, word in enumerate(command):
        if word == "--run-dir" and i + 1 < len(command):
            return command[i + 1]
        if word.startswith("--run-dir="):
            return word.split("=", 1)[1]
    cwd = Path.cwd() if cwd is None else cwd
    return str(cwd) if (cwd / JOB_SCRIPT).is_file() else None


def launch(command: Sequence[str], nprocs: int, *, log_dir: str | None = None, prefix: bool = True,
           note_dir: str | None = None) -> int:
    """Run ``command`` as ``nprocs`` ranks; returns 0 when all ranks succeed, else the first failure's code.

    When a rank is killed by a signal (one this launcher did not forward), "rank N killed by SIGKILL" becomes the
    failure note of ``note_dir`` (submission/failure.py), above the errors the other ranks see because of it.
    """
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    logs: list[IO[bytes]] = []
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    for rank in range(nprocs):
        proc = subprocess.Popen(list(command), env=rank_environment(dict(os.environ), rank, nprocs, port),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        sinks: list[IO[bytes]] = [sys.stdout.buffer]
        if log_dir:
            log = open(Path(log_dir) / f"rank-{rank}.log", "ab")  # noqa: SIM115 - closed below
            logs.append(log)
            sinks.append(log)
        assert proc.stdout is not None
        pump = threading.Thread(target=_pump, args=(proc.stdout, rank, sinks, prefix), daemon=True)
        pump.start()
        pumps.append(pump)

    forwarded: set[int] = set()

    def forward(signum: int, _frame: object) -> None:
        forwarded.add(signum)
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    first_failure: tuple[int, int] | None = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0, EXIT_REQUEUE)]
            if failed and first_failure is None:
                # A rank killed by a signal left no error of its own; the others' errors that the same poll
                # sees (a collective broken by its death) are its consequence: it is the one to name.
                first_failure = min(failed, key=lambda rc: (rc[1] >= 0, rc[0]))
                rank, code = first_failure
                print(f"hpctrain local launcher: rank {rank} {describe_exit(code)}; stopping the other ranks",
                      file=sys.stderr, flush=True)
                if code < 0 and note_dir is not None and -code not in forwarded:
                    record_failure(note_dir, f"rank {rank} {describe_exit(code)}", SIGNAL)
                _stop_all(procs)
            if all(c is not None for c in codes):
                break
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for pump in pumps:
            pump.join(timeout=5)
        for log in logs:
            log.close()
    if first_failure is None:
        return EXIT_REQUEUE if EXIT_REQUEUE in codes else 0
    rank, code = first_failure
    return code if code > 0 else 128 - code


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the remaining ranks, SIGKILL them after a grace period (in the background)."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_later() -> None:
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    threading.Thread(target=kill_later, daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.launchers.local_launch", description=__doc__)
    parser.add_argument("--nprocs", type=int, required=True)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--no-prefix", action="store_true")
    parser.add_argument("--note-dir", default=None,
                        help="where a rank's death by a signal is noted (default: the command's --run-dir, or the "
                             "working directory when it is a run directory)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    if args.nprocs < 1:
        parser.error("--nprocs must be at least 1")
    note_dir = args.note_dir or note_dir_for(command)
    return launch(command, args.nprocs, log_dir=args.log_dir, prefix=not args.no_prefix, note_dir=note_dir)


if __name__ == "__main__":
    sys.exit(main())
