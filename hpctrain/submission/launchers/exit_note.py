"""After a launcher failed: the first rank it reports killed by a signal becomes the run's failure note.

srun reports each task that ended abnormally on its error stream, which is the job's output file, in the order it
saw them end ("srun: error: HOST: task 1: Killed": the signal's ``strsignal`` text). A rank killed by a signal left
no error of its own, and the ranks srun ended after it (``--kill-on-bad-exit``) are its consequence, so "rank 1
killed by SIGKILL" is the run's reason (submission/failure.py, level ``SIGNAL``). A first rank that exited by
itself wrote its own note, and so did a rank whose own error made srun kill the others: when a rank's own error
is noted, nothing is added (srun may report the tasks it killed before the one that exited). The batch script
runs this when srun exits non-zero:
``python -m hpctrain.submission.launchers.exit_note --run-dir DIR (--log FILE | --slurm-job ID)``.
Plain standard library (it runs in the batch script, on the job's first node).
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from hpctrain.submission.failure import OWN, PEER, SIGNAL, noted_level, record_failure

SRUN_TASK = re.compile(r"^srun: error: \S+: tasks? (?P<tasks>\d[0-9,\-]*): (?P<what>.+?)\s*$")
JOB_START = re.compile(r"^hpctrain: job \S+ starts on ")  # the batch script's first line: this attempt begins
# What a scheduler stops a job with (cancel, walltime, preemption): not a rank's own death.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                          signal.SIGCONT})


def _by_description() -> dict[str, signal.Signals]:
    names: dict[str, signal.Signals] = {}
    for sig in signal.Signals:
        text = signal.strsignal(sig)
        if text:
            names.setdefault(text, sig)
    return names


def first_killed_rank(lines: Iterable[str]) -> tuple[int, signal.Signals] | None:
    """(rank, signal) of the first task srun reports killed in the last attempt of a job's output; None when the
    first task srun reports exited by itself, was stopped by the scheduler, or none is reported."""
    attempt: list[str] = []
    for line in lines:
        if JOB_START.match(line):
            attempt = []
        attempt.append(line)
    names = _by_description()
    for line in attempt:
        match = SRUN_TASK.match(line)
        if match is None:
            continue
        sig = names.get(match["what"])
        if sig is None or sig in STOP_SIGNALS:
            return None
        return int(re.match(r"\d+", match["tasks"]).group()), sig  # type: ignore[union-attr]
    return None


def slurm_output_file(job_id: str) -> Path | None:
    """The file a Slurm job's error stream goes to (``scontrol show job``'s StdErr)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for field in out.stdout.split():
        if field.startswith("StdErr="):
            return Path(field.split("=", 1)[1])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.launchers.exit_note", description=__doc__)
    parser.add_argument("--run-dir", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--log", help="the job's output file, holding srun's error stream")
    source.add_argument("--slurm-job", help="a Slurm job id: its StdErr file is read")
    args = parser.parse_args(argv)
    log = Path(args.log) if args.log else slurm_output_file(args.slurm_job)
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log is not None else []
    except OSError:
        lines = []
    found = first_killed_rank(lines)
    if found is None or (noted_level(args.run_dir) or PEER) >= OWN:
        # A rank's own error is the cause: srun kills the other tasks (SIGKILL) when one exits non-zero, and may
        # report them before the task that exited.
        return 0
    rank, sig = found
    line = f"rank {rank} killed by {sig.name}"
    record_failure(args.run_dir, line, SIGNAL)
    print(f"hpctrain: {line} (srun's report)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
