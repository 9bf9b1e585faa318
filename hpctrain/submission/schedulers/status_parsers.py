"""What every back-end's status parsers return (``JobStatus``), and whether a status command failed only because
the scheduler forgot the job (answers from several status commands are combined by ``tracking.combine``). The
parsers themselves, pure functions from a command's stdout to ``{job_id: JobStatus}``, live in
each back-end's module beside the argv that produces the layout they read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.submission.schedulers.state import JobState


@dataclass(frozen=True)
class PastRun:
    """One earlier run of a job the scheduler ran again (a requeue): how it ended and on which nodes."""

    state: str  # the scheduler's own word (NODE_FAIL, REQUEUED, PREEMPTED, ...)
    nodes: str = ""  # as the scheduler writes a node list (node[01-02])


@dataclass(frozen=True)
class JobStatus:
    """The state of one scheduler job as hpctrain records it."""

    job_id: str
    state: JobState
    reason_text: str = ""
    exit_code: int | None = None
    restart_count: int = 0
    raw_state: str = ""
    signal: int | None = None  # the signal that ended the job, when the scheduler says
    # The current run has ended and is being cleaned up (Slurm's COMPLETING): accounting may already hold it.
    run_ended: bool = False
    # The runs before the current one, oldest first, where accounting lists them (sacct -D, sacct -c).
    earlier_runs: tuple[PastRun, ...] = ()
    nodes: str = ""  # the current run's nodes as the scheduler writes them, where the status command says


_UNKNOWN_JOB = re.compile(r"Invalid job id specified|Unknown Job Id|Job has finished|does not exist", re.I)


def is_unknown_job_error(stderr: str) -> bool:
    """True when a status command failed only because the scheduler has forgotten the job(s)."""
    return bool(_UNKNOWN_JOB.search(stderr))
