"""What ``status``, ``runs`` and ``RunHandle`` show for a run, read from the registry and the run's record.

A view names why a run ended (the ranks' failure note, else the scheduler's words and the exit code, and the node
blamed for it) and whether it was requeued ("restart 1 of 5"), so a chain of requeues reads as one run going on;
it lists the nodes the run blamed and those its next attempt leaves out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.exit_codes import EXIT_REQUEUE
from hpctrain.nodes.blame import Blame
from hpctrain.submission.blamed_nodes import (
    failure_blames,
    left_out_by_run,
    stragglers,
    with_blamed_nodes,
    with_stragglers,
)
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import CREATED, SUBMIT_FAILED, Run, Submission
from hpctrain.submission.run_record import read_meta, saved_progress
from hpctrain.submission.schedulers.exit_status import SIGNAL_DEATH, death_signal, ended_text
from hpctrain.submission.schedulers.state import JobState

# Chain entries that continue the job before them (same run, same submission) rather than start anew.
CONTINUATIONS = ("requeue", "resubmit")


@dataclass(frozen=True)
class Progress:
    """Training progress from the last line of a run's metrics.jsonl."""

    step: int | None
    total: int | None
    loss: float | None
    rate: float | None

    def text(self) -> str:
        if self.step is None:
            return ""
        parts = [f"step {self.step}" + (f"/{self.total}" if self.total else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.rate is not None:
            parts.append(f"{self.rate:.3g}/s/rank")
        return "  ".join(parts)


def progress_from_record(record: Mapping[str, Any] | None, total: int | None) -> Progress | None:
    if not record:
        return None

    def num(key: str) -> float | None:
        value = record.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    step = record.get("step")
    return Progress(int(step) if isinstance(step, int | float) else None, total, num("loss"),
                    num("per_rank_rate"))


@dataclass(frozen=True)
class RunView:
    """What ``hpctrain status`` shows for one run.

    ``restart``: how many times the current submission was requeued (or resubmitted itself) after a
    checkpoint, of at most ``max_requeues``. ``poll_error_code``: the exit status that fits ``poll_error``.
    ``blamed``: the nodes the run blamed; ``left_out``: node -> why, for those its next attempt leaves out.
    """

    run_id: str
    name: str
    site: str
    remote: str | None
    job_id: str | None
    state: str
    reason: str
    run_dir: str
    progress: Progress | None = None
    poll_error: str = ""
    restart: int = 0
    max_requeues: int | None = None
    poll_error_code: int = 0
    blamed: tuple[Blame, ...] = ()
    left_out: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["progress"] = asdict(self.progress) if self.progress else None
        d["blamed"] = [{**asdict(b), "ranks": list(b.ranks)} for b in self.blamed]
        return d


def latest_job_id(registry: RunRegistry, run_id: str) -> str | None:
    """The job id of a run's newest successful submission."""
    for sub in reversed(registry.chain(run_id)):
        if sub.ok:
            return sub.job_id
    return None


def restarts_of(chain: list[Submission]) -> int:
    """Requeues and self-resubmissions since the run's newest submit or resume."""
    count = 0
    for sub in reversed(chain):
        if not sub.ok:
            continue
        if sub.kind not in CONTINUATIONS:
            break
        count += 1
    return count


def restart_text(restart: int, max_requeues: int | None) -> str:
    return f"restart {restart}" + (f" of {max_requeues}" if max_requeues is not None else "")


def view_of(registry: RunRegistry, run: Run, progress: Progress | None = None, poll_error: str = "",
            poll_error_code: int = 0) -> RunView:
    """A RunView from the registry and the run's record alone (no polling)."""
    chain = registry.chain(run.run_id)
    try:
        meta = read_meta(registry, run)
    except HpctrainError as exc:
        meta = None
        poll_error = poll_error or str(exc)
        poll_error_code = poll_error_code or exc.exit_code
    if progress is None:
        progress = progress_from_record(saved_progress(registry, run.run_id), meta.total_steps if meta else None)
    reason = run.state_reason
    if run.state == CREATED:
        reason = reason or "registered, not submitted"
    if run.state == SUBMIT_FAILED:
        reason = reason or "submission failed"
    if run.state in _ENDED_BADLY:
        reason = why_it_ended(chain, run, meta.no_requeue if meta else None)
    restart = restarts_of(chain)
    limit = meta.max_requeues if meta else None
    if restart:
        reason = _with_restart(reason, run.state, restart, limit, meta.scheduler if meta else None,
                               requeue_cause(chain))
    job_id = next((s.job_id for s in reversed(chain) if s.ok), None)
    blamed = registry.blames(run.run_id)
    if run.state in _ENDED_BADLY:
        reason = with_blamed_nodes(reason, failure_blames(blamed, job_id))
    elif run.state in _GOING:
        reason = with_stragglers(reason, stragglers(blamed, job_id))
    left_out = left_out_by_run(blamed, meta.spare_nodes if meta else 0)
    return RunView(run.run_id, run.name, run.site, run.remote, job_id, run.state, reason, run.run_dir, progress,
                   poll_error, restart, limit, poll_error_code, tuple(blamed), left_out)


# How a chain entry closed by a requeue the scheduler made (a node failure) ends its reason (tracking.py writes it).
BY_SCHEDULER = "; requeued by the scheduler"


# How a job ended before the user resumed its run, as words after "after".
_ENDINGS = {JobState.CANCELLED.value: "a cancel", JobState.TIMEOUT.value: "a timeout",
            JobState.FAILED.value: "a failure", JobState.PREEMPTED.value: "a preemption",
            JobState.MISSING.value: "the scheduler lost its job", JobState.COMPLETED.value: "it completed"}


def continued_after(before: Submission) -> str:
    """Why a run went on after the chain entry ``before``, as words after "after": "a checkpoint" (the ranks
    stopped at one and asked for a requeue), what the scheduler ran the job again for ("a node failure (node02
    ...)"), or how the job ended before the user resumed the run ("a cancel", "a timeout", ...)."""
    if before.state == JobState.REQUEUED.value:
        cause, sep, _ = before.state_reason.rpartition(BY_SCHEDULER)
        return cause if sep and cause else "a checkpoint"
    if before.exit_code == EXIT_REQUEUE:
        return "a stop at its checkpoint"
    return _ENDINGS.get(before.state or "", "its job ended")


def started_how(kind: str, before: Submission) -> str:
    """What started a chain entry of ``kind`` after ``before``, as words after the kind ("requeue", "resume"):
    "after a checkpoint", "by the scheduler after a node failure (...)", "by the user after a cancel"."""
    if kind == "resume":
        return f"by the user after {continued_after(before)}"
    if kind == "resubmit":  # a job submits itself again only once it stopped at its checkpoint (PBS, Cobalt)
        return "after a checkpoint"
    if before.state_reason.endswith(BY_SCHEDULER):
        return f"by the scheduler after {continued_after(before)}"
    return f"after {continued_after(before)}"


def chain_starts(chain: list[Submission]) -> list[str]:
    """For each successful entry of a chain, what started it (``started_how``); '' for a submission."""
    done = [s for s in chain if s.ok]
    return ["" if s.kind == "submit" or i == 0 else started_how(s.kind, done[i - 1]) for i, s in enumerate(done)]


def requeue_cause(chain: list[Submission]) -> str:
    """Why the newest requeue of a chain happened, as words after "after" (``continued_after``)."""
    ended = [s for s in chain if s.ok and s.state == JobState.REQUEUED.value and s.state_reason]
    return continued_after(ended[-1]) if ended else "a checkpoint"


def _with_restart(reason: str, state: str, restart: int, limit: int | None, scheduler: str | None,
                  cause: str = "a checkpoint") -> str:
    """The reason of a requeued run: the restart first while it goes on, after the reason once it has ended. The
    scheduler's hold after a requeue is no news while the run waits, and untrue once it has started or ended (a
    registry written before the status parsers dropped it there may still hold it)."""
    where = restart_text(restart, limit)
    hold = _requeue_hold_reasons(scheduler)
    reason = "; ".join(part for part in reason.split("; ") if part not in hold) if reason else ""
    if state == JobState.PENDING.value:
        return f"requeued after {cause} ({where}), waiting to start again" + (f"; {reason}" if reason else "")
    if state in (JobState.RUNNING.value, JobState.REQUEUED.value):
        return f"{where}, after {cause}" + (f"; {reason}" if reason else "")
    return (f"{reason}; " if reason else "") + f"in {where}"


def _requeue_hold_reasons(scheduler: str | None) -> frozenset[str]:
    if scheduler is None:
        return frozenset()
    from hpctrain.submission.schedulers.base import get_scheduler

    try:
        return get_scheduler(scheduler).requeue_hold_reasons
    except HpctrainError:
        return frozenset()


# The ranks' failure note names the rank it is about: "rank 0 failed: ...", "rank 1 killed by SIGKILL".
RANK_NOTE = re.compile(r"rank \d+ ")

_ENDED_BADLY = frozenset(s.value for s in (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED,
                                           JobState.PREEMPTED, JobState.MISSING))
_GOING = frozenset(s.value for s in JobState if s.is_active)


def why_it_ended(chain: list[Submission], run: Run, no_requeue: str | None = None) -> str:
    """The reason (the ranks' failure note or the scheduler's words) plus the exit code / signal of the run's
    newest job, e.g. ``rank 0: train.decay.steps: ...; exit code 2``; a job that stopped at its checkpoint says how
    to go on (``no_requeue``: why its queue did not let it requeue itself)."""
    parts = run.state_reason.split("; ") if run.state_reason else []
    newest = next((s for s in reversed(chain) if s.ok), None)
    code = newest.exit_code if newest is not None else None
    if run.state == JobState.TIMEOUT.value:
        # The code of a job ended at its time limit is the scheduler's signal (-15, 0:15), not the user's.
        parts = [p for p in parts if "exit code" not in p and not SIGNAL_DEATH.fullmatch(p)]
        parts += [] if any("walltime" in p for p in parts) else ["its walltime ran out"]
        code = None
    if code == EXIT_REQUEUE and not any(f"code {code}" in p for p in parts):
        parts.append(f"stopped at its checkpoint; resume with `hpctrain resume {run.run_id}`" + (
            f" (no requeue: {no_requeue})" if no_requeue else f" (exit code {code})"))
    elif code is not None and death_signal(code) is not None:
        # One statement of the death, as the job log's number reads: a scheduler's shorter words for it give way.
        # Where the ranks' note already says which rank failed or died, the launcher's 128 + S is the peers it
        # killed after that rank: the status as the log prints it, without a second story of the death.
        parts = [p for p in parts if not SIGNAL_DEATH.fullmatch(p)]
        named = code > 0 and any(RANK_NOTE.match(p) for p in parts)
        parts.append(f"exit status {code}" if named else ended_text(code))
    elif code is not None and not any(f"code {code}" in p or SIGNAL_DEATH.fullmatch(p) for p in parts):
        # (Slurm's 0:9 leaves exit code 0 beside the signal its parser has already named)
        parts.append(f"exit code {code}")
    return "; ".join(parts)


def is_terminal(state: str) -> bool:
    """True for states that will not change by themselves (including a failed submission)."""
    if state == SUBMIT_FAILED:
        return True
    try:
        return JobState(state).is_terminal
    except ValueError:
        return False
