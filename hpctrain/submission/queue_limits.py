"""Per-user queue limits checked at submission: how many jobs one user may have queued in a queue
(``max_queued_per_user``: Slurm's MaxSubmitPU, PBS's max_queued).

An array larger than the limit is refused from the profile alone; whether the user's jobs already queued leave
room is asked of the scheduler (through the transport, so over ssh too) just before submitting, never when a
job is only validated or rendered: the answer is only true at that moment, where the scheduler runs.
"""

from __future__ import annotations

from hpctrain.config.fit import Placement
from hpctrain.config.site import SiteProfile
from hpctrain.errors import FitError, HpctrainError
from hpctrain.submission.schedulers.base import get_scheduler
from hpctrain.submission.transport import Transport

COUNT_TIMEOUT_S = 60.0


def limited_queues(site: SiteProfile, placement: Placement) -> list[tuple[str, int]]:
    """The queues the job lands in (the one asked for, the execution queue a routing queue picks) that limit how
    many jobs one user may have queued, with the limit."""
    names = dict.fromkeys(n for n in (placement.queue_name, placement.execution_queue) if n)
    return [(n, limit) for n in names if (limit := site.queues[n].max_queued_per_user) is not None]


def check_array_size(site: SiteProfile, placement: Placement, count: int) -> None:
    """An array of more tasks than one user may have queued in the queue is refused before anything is written."""
    for name, limit in limited_queues(site, placement):
        if count > limit:
            raise FitError(f"an array of {count} tasks, but queue {name!r} of site {site.name!r} takes at most {limit} "
                           f"queued jobs per user ({site.rule_source(name, 'max_queued_per_user')})",
                           key="resources.queue", hint=f"submit at most {limit} tasks at once, or pick another queue")


def check_queued_jobs(transport: Transport, site: SiteProfile, placement: Placement, adding: int) -> None:
    """Refuse ``adding`` more jobs when the user's jobs already queued in the queue leave no room for them.

    A scheduler that cannot count, or a count that fails, leaves the decision to the scheduler (with a warning).
    """
    from hpctrain.config.preflight import warn

    scheduler = get_scheduler(site.scheduler)
    for name, limit in limited_queues(site, placement):
        probe = scheduler.queued_jobs_probe(site, name)
        if probe is None:
            continue
        try:
            done = transport.run(probe.argv, timeout=COUNT_TIMEOUT_S, check=False)
        except HpctrainError as exc:
            warn([f"could not count your jobs in queue {name!r} ({probe.name}: {exc}); the scheduler will judge"])
            continue
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
            warn([f"could not count your jobs in queue {name!r} ({probe.name} exited {done.returncode}: {said}); "
                  "the scheduler will judge"])
            continue
        have = probe.count(done.stdout)
        if have + adding > limit:
            jobs = "job" if have == 1 else "jobs"
            raise FitError(f"queue {name!r} of site {site.name!r} takes at most {limit} queued jobs per user "
                           f"({site.rule_source(name, 'max_queued_per_user')}) and you have {have} {jobs} pending "
                           f"or running there ({probe.name} on {transport.host})", key="resources.queue",
                           hint="wait for one to finish or cancel one: hpctrain cancel RUN")
