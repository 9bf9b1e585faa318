"""What the scheduler says at submission, before a job is queued: how many jobs one user may have queued in a
queue (``max_queued_per_user``: Slurm's MaxSubmitPU, PBS's max_queued), and whether the queue has as many usable
nodes as the job asks for (a job larger than what is not down or drained would wait until someone repairs them).

An array larger than the limit is refused from the profile alone; whether the user's jobs already queued leave
room is asked of the scheduler (through the transport, so over ssh too) just before submitting, never when a
job is only validated or rendered: the answer is only true at that moment, where the scheduler runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

    scheduler = get_scheduler(site.scheduler)
    for name, limit in limited_queues(site, placement):
        probe = scheduler.queued_jobs_probe(site, name)
        if probe is None:
            continue
        answer = _ask(transport, probe.argv, probe.name, f"count your jobs in queue {name!r}")
        if answer is None:
            continue
        have = probe.count(answer)
        if have + adding > limit:
            jobs = "job" if have == 1 else "jobs"
            raise FitError(f"queue {name!r} of site {site.name!r} takes at most {limit} queued jobs per user "
                           f"({site.rule_source(name, 'max_queued_per_user')}) and you have {have} {jobs} pending "
                           f"or running there ({probe.name} on {transport.host})", key="resources.queue",
                           hint="wait for one to finish or cancel one: hpctrain cancel RUN")


def check_usable_nodes(transport: Transport, site: SiteProfile, placement: Placement, nodes: int,
                       excluded: Mapping[str, str] | None = None, named: Sequence[str] = ()) -> dict[str, str]:
    """Refuse a job of ``nodes`` nodes when fewer of its queue's nodes are usable now (not down, drained or
    failing): it would wait in the queue until someone repairs them. Allocated nodes count as usable: the job
    waits for them as for any other. A scheduler that cannot list nodes, or a listing that fails, leaves it to
    the scheduler (with a warning for the failure).

    ``excluded`` (node -> why) are the nodes the job is to be kept off: returned as they are where enough usable
    nodes remain without them; where not, the blamed and remembered ones are given up with a warning (a job the
    scheduler can never place helps no one) and those a person ``named`` are refused."""
    from hpctrain.config.preflight import warn

    excluded = dict(excluded or {})
    scheduler = get_scheduler(site.scheduler)
    name = placement.execution_queue or placement.queue_name
    if not name or name not in site.queues:
        return excluded
    probe = scheduler.nodes_probe(site, name)
    answer = None if probe is None else _ask(transport, probe.argv, probe.name, f"list the nodes of queue {name!r}")
    if probe is None or answer is None:
        return excluded
    listed = probe.parse(answer)
    if not listed:  # a queue the scheduler does not know: sbatch says so itself
        return excluded
    usable = [n for n in listed if n.usable]
    others = [n for n in usable if n.name not in excluded]
    if nodes <= len(others):
        return excluded
    if nodes <= len(usable):
        asked = [n for n in named if n in excluded]
        if asked:
            raise FitError(f"the job asks for {nodes} nodes but queue {name!r} of site {site.name!r} has "
                           f"{len(others)} usable nodes besides {', '.join(excluded)}", key="--exclude",
                           hint="exclude fewer nodes (--include NODE gives one back)")
        warn([f"not keeping the job off {', '.join(excluded)}: queue {name!r} has {len(others)} usable nodes "
              f"besides them and the job needs {nodes}"])
        return {}
    broken = [n for n in listed if not n.usable]
    shown = ", ".join(f"{n.name} {n.state}" + (f" ({n.reason})" if n.reason else "") for n in broken[:8])
    more = f" and {len(broken) - 8} more" if len(broken) > 8 else ""
    raise FitError(f"the job asks for {nodes} nodes but queue {name!r} of site {site.name!r} has {len(usable)} of "
                   f"{len(listed)} nodes usable now ({probe.name} on {transport.host}: {shown}{more}); it would "
                   "wait until they are repaired", key="resources.nodes",
                   hint=f"ask for at most {len(usable)} nodes (--nodes {len(usable)}), or submit again once "
                        "the nodes are back")


def _ask(transport: Transport, argv: list[str], command: str, what: str) -> str | None:
    """The command's output, or None (with a warning saying it could not ``what``) when it failed: the scheduler
    then judges the job itself."""
    from hpctrain.config.preflight import warn

    try:
        done = transport.run(argv, timeout=COUNT_TIMEOUT_S, check=False)
    except HpctrainError as exc:
        warn([f"could not {what} ({command}: {exc}); the scheduler will judge"])
        return None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        warn([f"could not {what} ({command} exited {done.returncode}: {said}); the scheduler will judge"])
        return None
    return done.stdout
