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
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.launch_env import job_id_of, restarts_of
from hpctrain.nodes.blame import Blame, append_blames
from hpctrain.submission.failure import OWN, PEER, SIGNAL, noted_level, record_failure

SRUN_TASK = re.compile(r"^srun: error: (?P<host>\S+): tasks? (?P<tasks>\d[0-9,\-]*): (?P<what>.+?)\s*$")
NODE_FAILURE = re.compile(r"^srun: error: Node failure on \S+")  # blamed by the node check (source scheduler)
OOM = re.compile(r"oom[-_ ]kill", re.IGNORECASE)  # slurmstepd: "Detected 1 oom_kill event in StepId=..."
# The batch script's first line, or its start of the ranks again on spare nodes: this attempt begins.
JOB_START = re.compile(r"^hpctrain: (job \S+ starts on |starting the ranks again from the last checkpoint)")
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


@dataclass(frozen=True)
class Killed:
    """The first rank srun reports killed: its rank, the signal, its node and the node's other reported ranks, and
    whether the step saw the kernel's out-of-memory killer."""

    rank: int
    signal: signal.Signals
    node: str
    ranks_on_node: tuple[int, ...]
    out_of_memory: bool = False

    @property
    def cause(self) -> str:
        return "out of memory (the kernel's OOM killer)" if self.out_of_memory else f"killed by {self.signal.name}"


def _tasks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def first_killed_rank(lines: Iterable[str]) -> Killed | None:
    """The first task srun reports killed in the last attempt of a job's output; None when the first task srun
    reports exited by itself, was stopped by the scheduler, none is reported, or srun reports a node lost (its
    tasks and the others it ended are then the loss's consequence)."""
    attempt: list[str] = []
    for line in lines:
        if JOB_START.match(line):
            attempt = []
        attempt.append(line)
    if any(NODE_FAILURE.match(line) for line in attempt):
        return None  # the scheduler lost a node: the tasks srun reports killed are the lost node's consequence
    names = _by_description()
    reports = [(m, names.get(m["what"])) for m in map(SRUN_TASK.match, attempt) if m is not None]
    if not reports:
        return None
    first, sig = reports[0]
    if sig is None or sig in STOP_SIGNALS:
        return None
    host = first["host"]
    on_node = sorted({t for m, _ in reports if m["host"] == host for t in _tasks(m["tasks"])})
    oom = sig == signal.SIGKILL and any(OOM.search(line) for line in attempt)
    return Killed(_tasks(first["tasks"])[0], sig, host, tuple(on_node), oom)


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
    line = f"rank {found.rank} on {found.node} {found.cause}"
    record_failure(args.run_dir, line, SIGNAL)
    append_blames(args.run_dir, [Blame(node=found.node, cause=line, ranks=found.ranks_on_node, source="launcher",
                                       job=job_id_of(os.environ), restart=restarts_of(os.environ))])
    print(f"hpctrain: {line} (srun's report)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
