"""Cobalt's answers to discovery: queues and their limits (``qstat -Q``: MaxTime, MaxUserNodes, TotalNodes)
and which nodes serve which queue (``partlist``). Cobalt says nothing about a node's cores or memory: those
come from the login node and are listed as guessed.
"""

from __future__ import annotations

from hpctrain.config.numbers import plain_count
from hpctrain.config.walltime import parse_walltime
from hpctrain.submission.discovery.facts import QueueFacts, SchedulerFacts, guess, learned
from hpctrain.submission.discovery.probe import Probe

QSTAT_Q_COLUMNS = ("Name", "Users", "MinTime", "MaxTime", "MaxRunning", "MaxQueued", "MaxUserNodes",
                   "MaxNodeHours", "TotalNodes", "State")
DEFAULT_WALLTIME_S = 24 * 3600


def table(text: str) -> list[dict[str, str]]:
    """Rows of a Cobalt table (a header line, a line of ``=``, rows; columns separated by spaces)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(lines[:-1]):
        if set(lines[i + 1].strip()) == {"="}:
            header = line.split()
            return [dict(zip(header, row.split(), strict=False)) for row in lines[i + 2:]
                    if len(row.split()) == len(header)]
    return []


def is_cobalt_queue_table(text: str) -> bool:
    """True for ``qstat -Q`` as Cobalt prints it (PBS and Torque print ``Queue  Max  Tot ...`` instead)."""
    rows = [ln.split() for ln in text.splitlines() if ln.strip()]
    return bool(rows) and rows[0][:4] == list(QSTAT_Q_COLUMNS[:4])


def _count(value: str | None) -> int | None:
    return plain_count(value) or None


def nodes_per_queue(partlist: str) -> dict[str, int]:
    """How many partitions (on Cray systems, nodes) ``partlist`` shows for each queue (``a:b`` = both)."""
    counts: dict[str, int] = {}
    for row in table(partlist):
        for queue in filter(None, row.get("Queue", "").split(":")):
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def read_cobalt(probe: Probe) -> SchedulerFacts:
    """Queues and their limits from ``qstat -Q`` and ``partlist``."""
    facts = SchedulerFacts(name="cobalt", answered=False)
    rows = table(probe.answered("qstat_queues") or "")
    served = nodes_per_queue(probe.answered("cobalt_partlist") or "")
    for row in rows:
        name = row.get("Name", "")
        if not name:
            continue
        src = f"qstat -Q {name}"
        bounds = [(n, f"{src}: MaxUserNodes={n}") for n in [_count(row.get("MaxUserNodes"))] if n]
        bounds += [(n, f"{src}: TotalNodes={n}") for n in [_count(row.get("TotalNodes"))] if n]
        bounds += [(n, f"partlist: {n} nodes serve {name}") for n in [served.get(name)] if n]
        if bounds:
            nodes = learned(*min(bounds))
        else:
            nodes = guess(1, f"{src}: no MaxUserNodes or TotalNodes, and partlist names no node for it")
        max_time = row.get("MaxTime", "None")
        try:
            walltime = learned(parse_walltime(max_time), f"{src}: MaxTime={max_time}")
        except ValueError:
            walltime = guess(DEFAULT_WALLTIME_S, f"{src}: MaxTime={max_time}")
        state = row.get("State", "running")
        facts.queues[name] = QueueFacts(name=name, max_nodes=nodes, max_walltime_s=walltime,
                                        description="" if state == "running" else f"state {state} when discovered")
    if "default" in facts.queues:
        facts.default_queue = learned("default", "Cobalt sends jobs without -q to the queue named default")
    elif facts.queues:
        facts.default_queue = guess(next(iter(facts.queues)), "no queue named default; the first one listed")
    facts.answered = bool(facts.queues)
    if not facts.answered:
        failure = probe.failure("qstat_queues")
        facts.notes.append(f"qstat -Q failed: {failure}" if failure else "qstat -Q listed no queues")
    return facts
