"""A site's queue policies applied to one job: node and walltime limits by size, minimum walltime, routing queues,
per-user limits and whether the job may requeue itself (docs/rendering.md, 'Queue policies').

Each refusal is one FitError naming the rule, the page it comes from (``SiteProfile.rule_source``) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.config.common import walltime_seconds
from hpctrain.config.site import Queue, SiteProfile
from hpctrain.errors import FitError


@dataclass(frozen=True)
class QueueChoice:
    """Where a job lands: the queue it is submitted to, the execution queue a routing queue sends it to (the same
    queue where nothing routes), notes on what hpctrain chose, and whether a requeue chain may be rendered."""

    execution_queue: str
    notes: tuple[str, ...] = ()
    requeue: bool = True
    no_requeue_reason: str | None = None


def _name(site: SiteProfile, queue_name: str) -> str:
    return f"queue {queue_name!r} of site {site.name!r}"


def _span(queue: Queue) -> str:
    return f"{queue.min_nodes}-{queue.max_nodes} nodes" if queue.min_nodes > 1 else f"up to {queue.max_nodes} nodes"


def _takers(site: SiteProfile, nodes: int) -> str:
    """Queues a user may submit to that take ``nodes`` nodes, for a hint."""
    names = [n for n, q in site.queues.items() if q.direct_submit and q.min_nodes <= nodes <= q.max_nodes]
    return ", ".join(names)


def _sizes_for(queues: list[tuple[str, Queue]], seconds: int) -> list[int]:
    """The smallest node count of each bin (or queue without bins) whose limit allows ``seconds``."""
    sizes = []
    for _, queue in queues:
        bins = [(b.min_nodes, b.max_walltime) for b in queue.walltime_by_nodes] or [
            (queue.min_nodes, queue.max_walltime)]
        sizes += [lo for lo, limit in bins if walltime_seconds(limit) >= seconds]
    return sorted(sizes)


def _refusal(site: SiteProfile, queue_name: str, queue: Queue, nodes: int, walltime: str,
             siblings: list[tuple[str, Queue]]) -> FitError | None:
    """The first rule of ``queue`` that a job of ``nodes`` nodes for ``walltime`` breaks, as a FitError."""
    where = _name(site, queue_name)
    if nodes > queue.max_nodes:
        takers = _takers(site, nodes)
        return FitError(f"{nodes} nodes requested but {where} allows at most {queue.max_nodes} "
                        f"({site.rule_source(queue_name, 'max_nodes')})", key="resources.nodes",
                        hint="lower --nodes or pick a larger queue" + (f": {takers}" if takers else ""))
    if nodes < queue.min_nodes:
        takers = _takers(site, nodes)
        return FitError(f"{nodes} nodes requested but {where} needs at least {queue.min_nodes} "
                        f"({site.rule_source(queue_name, 'min_nodes')})", key="resources.nodes",
                        hint=f"ask for {queue.min_nodes} nodes" + (f" or pick a queue that takes {nodes}: {takers}"
                                                                    if takers else ""))
    if queue.max_nodes_per_user is not None and nodes > queue.max_nodes_per_user:
        return FitError(f"{nodes} nodes requested but one user's jobs may hold at most {queue.max_nodes_per_user} "
                        f"nodes at once in {where} ({site.rule_source(queue_name, 'max_nodes_per_user')})",
                        key="resources.nodes", hint=f"ask for at most {queue.max_nodes_per_user} nodes")
    seconds = walltime_seconds(walltime)
    if queue.min_walltime is not None and seconds < walltime_seconds(queue.min_walltime):
        return FitError(f"walltime {walltime} is under the minimum of {where} ({queue.min_walltime}) "
                        f"({site.rule_source(queue_name, 'min_walltime')})", key="resources.walltime",
                        hint=f"ask for at least {queue.min_walltime}")
    limit, size = queue.walltime_limit(nodes)
    if seconds <= walltime_seconds(limit):
        return None
    larger = [n for n in _sizes_for(siblings, seconds) if n > nodes]
    if size is None:
        return FitError(f"walltime {walltime} is over the limit of {where} ({limit}) "
                        f"({site.rule_source(queue_name, 'max_walltime')})", key="resources.walltime",
                        hint=(f"ask for {larger[0]} nodes or at most {limit}" if larger else "shorten the walltime")
                        + "; checkpoints let the run continue")
    fix = f"ask for {larger[0]} nodes or at most {limit}" if larger else f"ask for at most {limit}"
    return FitError(f"{nodes} nodes for {walltime} on {where}: at most {limit} from {size.min_nodes} to "
                    f"{size.max_nodes} nodes ({site.rule_source(queue_name, 'walltime_by_nodes')})",
                    key="resources.walltime", hint=fix + "; checkpoints let a shorter run continue")


def choose_queue(site: SiteProfile, queue_name: str, queue: Queue, nodes: int, walltime: str) -> QueueChoice:
    """Apply the queue's policies to a job of ``nodes`` nodes for ``walltime``: the execution queue it lands in
    and whether it may requeue, or a FitError naming the rule, its source and the fix."""
    if not queue.direct_submit:
        router = site.routing_queue_of(queue_name)
        raise FitError(f"{_name(site, queue_name)} takes jobs only through "
                       + (f"the routing queue {router!r}" if router else "a routing queue")
                       + f" ({site.rule_source(queue_name, 'direct_submit')})", key="resources.queue",
                       hint=f"set resources.queue: {router}; it routes by size" if router else None)
    refusal = _refusal(site, queue_name, queue, nodes, walltime, [(queue_name, queue)])
    if refusal is not None:
        raise refusal
    if not queue.routes_to:
        requeue, reason = requeue_rule(site, [queue_name])
        return QueueChoice(queue_name, _requeue_notes(reason), requeue, reason)

    targets = [(t, site.queues[t]) for t in queue.routes_to]
    for target, execution in targets:
        if _refusal(site, target, execution, nodes, walltime, targets) is None:
            requeue, reason = requeue_rule(site, [queue_name, target])
            note = (f"{_name(site, queue_name)} routes {nodes} nodes for {walltime} to its execution queue "
                    f"{target!r} ({site.rule_source(queue_name, 'routes_to')})")
            return QueueChoice(target, (note, *_requeue_notes(reason)), requeue, reason)
    # No destination takes it: name the one that takes this many nodes (PBS's "rejected by all possible
    # destinations" says nothing more).
    sized = [(t, q) for t, q in targets if q.min_nodes <= nodes <= q.max_nodes]
    if not sized:
        spans = "; ".join(f"{t}: {_span(q)}" for t, q in targets)
        raise FitError(f"{nodes} nodes requested but no execution queue behind routing queue {queue_name!r} of site "
                       f"{site.name!r} takes them ({spans}) ({site.rule_source(queue_name, 'routes_to')})",
                       key="resources.nodes", hint="ask for a node count one of them takes")
    target, execution = sized[0]
    refusal = _refusal(site, target, execution, nodes, walltime, targets)
    assert refusal is not None
    raise FitError(f"routing queue {queue_name!r} sends {nodes} nodes to {target!r}: {refusal.message}",
                   key=refusal.key, hint=refusal.hint)


def refusal_text(site: SiteProfile, queue_name: str | None, nodes: int, walltime: str) -> str | None:
    """Why the queue would refuse a job of ``nodes`` nodes for ``walltime`` (for ``plan``'s node counts), or None."""
    if queue_name is None or queue_name not in site.queues:
        return None
    try:
        choose_queue(site, queue_name, site.queues[queue_name], nodes, walltime)
    except FitError as exc:
        return f"{exc.message}" + (f"; {exc.hint}" if exc.hint else "")
    return None


def requeue_rule(site: SiteProfile, queue_names: list[str]) -> tuple[bool, str | None]:
    """Whether a job in these queues (the submit queue, then its execution queue) may requeue itself or submit
    its successor, and if not, why: the queue forbids chaining, or takes one queued job per user."""
    for name in queue_names:
        queue = site.queues[name]
        if not queue.chaining:
            return False, f"{_name(site, name)} forbids job chaining ({site.rule_source(name, 'chaining')})"
        if queue.max_queued_per_user == 1:
            return False, (f"{_name(site, name)} takes one queued job per user, so the job cannot queue its "
                           f"successor ({site.rule_source(name, 'max_queued_per_user')})")
    return True, None


def _requeue_notes(reason: str | None) -> tuple[str, ...]:
    if reason is None:
        return ()
    return (f"no requeue: {reason}; the job checkpoints at the walltime warning and stops there, resume it with "
            "`hpctrain resume RUN`",)
