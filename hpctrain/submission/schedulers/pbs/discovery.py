"""PBS Pro's answers to discovery: queues and their ``resources_max``/``resources_min`` (``qstat -Q -f``, JSON
with ``-F json`` where supported), routing queues' ``route_destinations`` and the execution queues reached only
through them (``from_route_only``), per-user limits (``max_queued``, ``max_run``, ``max_run_res.nodect`` as
``[u:PBS_GENERIC=N]``), the server's default queue (``qstat -B -f``) and node resources (``pbsnodes -a``: PBS
Pro's ``resources_available.*``, or Torque's ``np``/``status`` as its wrappers print).

No PBS server runs in the tests: this parser is tested against recorded and hand-written ``qstat`` output.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hpctrain.config.numbers import plain_count
from hpctrain.config.walltime import parse_walltime
from hpctrain.submission.discovery.facts import (
    Fact,
    NodeFacts,
    QueueFacts,
    SchedulerFacts,
    gpu_kind_of,
    guess,
    learned,
    most_common,
    node_kinds_note,
    size_gb,
)
from hpctrain.submission.discovery.probe import Probe

DEFAULT_WALLTIME_S = 24 * 3600  # written (and listed as guessed) when PBS reports no walltime limit


def _set_dotted(target: dict[str, Any], key: str, value: str) -> None:
    head, dot, rest = key.partition(".")
    if dot:
        inner = target.setdefault(head, {})
        if isinstance(inner, dict):
            inner[rest] = value
    else:
        target[key] = value


def attribute_blocks(text: str, header: str | None) -> dict[str, dict[str, Any]]:
    """``qstat -f``-style text as ``{name: {attribute: value}}``; dotted names nest (``resources_max.nodect``).

    ``header`` is the block's first word (``Queue:``, ``Server:``); None reads ``pbsnodes -a`` blocks, whose
    first line is the bare node name. Long values continue on lines without `` = `` and are joined.
    """
    blocks: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    last_key: str | None = None
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indented = raw[0] in " \t"
        if not indented:
            words = raw.split(None, 1)
            if header is None:
                name = raw.strip()
            elif words[0] == header and len(words) == 2:
                name = words[1].strip()
            else:
                current, last_key = None, None
                continue
            current, last_key = blocks.setdefault(name, {}), None
            continue
        if current is None:
            continue
        key, sep, value = raw.strip().partition(" = ")
        if sep:
            last_key = key.strip()
            _set_dotted(current, last_key, value.strip())
        elif last_key is not None:
            # PBS wraps long values onto tab-indented continuation lines.
            head, _, rest = last_key.partition(".")
            holder = current.get(head) if rest else current
            name = rest or last_key
            if isinstance(holder, dict) and isinstance(holder.get(name), str):
                holder[name] += raw.strip()
    return blocks


def _json(text: str | None, key: str) -> dict[str, dict[str, Any]] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python's parser can hold
        return None
    found = data.get(key) if isinstance(data, dict) else None
    if not isinstance(found, dict):
        return None
    return {name: entry for name, entry in found.items() if isinstance(entry, dict)}


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _int(value: Any) -> int | None:
    return plain_count(value if isinstance(value, str) else str(value) if isinstance(value, int) else None)


def node_from_pbs(name: str, attrs: dict[str, Any]) -> NodeFacts | None:
    """A node's shape from PBS Pro's ``resources_available`` or Torque's ``np``/``gpus``/``status``."""
    available = attrs.get("resources_available")
    status: dict[str, str] = {}
    if isinstance(attrs.get("status"), str):  # Torque: status = k=v,k=v,...
        status = dict(p.split("=", 1) for p in attrs["status"].split(",") if "=" in p)
    if isinstance(available, dict) and _int(available.get("ncpus")) is not None:
        src = "pbsnodes resources_available"
        cpus = _int(available["ncpus"]) or 1
        gpus = _int(available.get("ngpus", 0)) or 0
        mem = size_gb(str(available.get("mem", "")))
        model = str(available.get("gputype") or available.get("gpu_model") or "")
        cpus_src = f"{src}.ncpus={cpus}"
    elif _int(attrs.get("np")) is not None or _int(status.get("ncpus")) is not None:
        src = "pbsnodes (Torque layout)"
        cpus = _int(attrs.get("np")) or _int(status.get("ncpus")) or 1
        gpus = _int(attrs.get("gpus", 0)) or 0
        mem_text = status.get("physmem") or status.get("totmem") or status.get("availmem") or ""
        mem = size_gb(mem_text)
        model = ""
        cpus_src = f"{src}: np={cpus}"
    else:
        return None
    if gpus == 0:
        kind = learned("none", f"{src}: no GPUs")
    elif gpu_kind_of(model):
        kind = learned(gpu_kind_of(model) or "", f"{src}: gputype {model}")
    else:
        kind = guess("nvidia", f"{src} names no GPU type")
    return NodeFacts(
        cores=learned(cpus, cpus_src + " (PBS counts CPUs: cores, or hardware threads where configured so)"),
        threads_per_core=guess(1, f"{src} does not say how many hardware threads a core has"),
        gpus=learned(gpus, f"{src}: ngpus={gpus}"),
        gpu_kind=kind,
        memory_gb=(learned(mem, f"{src}: mem") if mem else guess(1.0, f"{src} gives no memory size")),
        count=1, ncpus_only=True,
    )


def _walltime(limits: Any) -> int | None:
    if isinstance(limits, dict) and limits.get("walltime"):
        try:
            return parse_walltime(str(limits["walltime"]))
        except ValueError:
            return None
    return None


def _nodect(limits: Any) -> int | None:
    if not isinstance(limits, dict):
        return None
    return _int(limits.get("nodect")) or _int(limits.get("nodes"))


_PER_USER = re.compile(r"\[u:PBS_GENERIC=(\d+)\]")


def _per_user(value: Any, src: str, attribute: str) -> Fact[int] | None:
    """A generic per-user limit (``[u:PBS_GENERIC=N]``; an old-style bare number is per user too)."""
    if value is None:
        return None
    text = str(value).strip()
    found = _PER_USER.search(text)
    number = plain_count(found.group(1)) if found else _int(text)
    return learned(number, f"{src}: {attribute} = {text}") if number else None


def _policies(name: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """The queue's policy facts (QueueFacts keywords) from its qstat -Q -f attributes."""
    src = f"qstat -Q -f {name}"
    found: dict[str, Any] = {}
    minimum = attrs.get("resources_min")
    if isinstance(minimum, dict) and minimum.get("walltime"):
        try:
            found["min_walltime_s"] = learned(parse_walltime(str(minimum["walltime"])),
                                              f"{src}: resources_min.walltime")
        except ValueError:
            pass
    if _true(attrs.get("from_route_only", "False")):
        found["direct_submit"] = learned(False, f"{src}: from_route_only = True")
    queued = _per_user(attrs.get("max_queued"), src, "max_queued") or _per_user(
        attrs.get("max_user_queuable"), src, "max_user_queuable")
    running = _per_user(attrs.get("max_run"), src, "max_run") or _per_user(
        attrs.get("max_user_run"), src, "max_user_run")
    run_res = attrs.get("max_run_res")
    nodes = _per_user(run_res.get("nodect"), src, "max_run_res.nodect") if isinstance(run_res, dict) else None
    found.update({k: v for k, v in (("max_queued_per_user", queued), ("max_running_per_user", running),
                                    ("max_nodes_per_user", nodes)) if v is not None})
    return found


def read_pbs(probe: Probe) -> SchedulerFacts:
    """Queues, the default queue and the commonest node shape from the probe's PBS sections."""
    facts = SchedulerFacts(name="pbs", answered=False)
    queues = _json(probe.answered("pbs_queues_json"), "Queue")
    if queues is None:
        queues = attribute_blocks(probe.answered("pbs_queues") or "", "Queue:")
    nodes = _json(probe.answered("pbs_nodes_json"), "nodes")
    nodes_source = "pbsnodes -a -F json"
    if nodes is None:
        nodes, nodes_source = attribute_blocks(probe.answered("pbs_nodes") or "", None), "pbsnodes -a"
    server_blocks = attribute_blocks(probe.answered("pbs_server") or "", "Server:")
    server = next(iter(server_blocks.values()), {})

    shapes = [s for n, a in nodes.items() if (s := node_from_pbs(n, a)) is not None]
    facts.node = most_common(shapes)
    note = node_kinds_note(shapes, "PBS")
    if note:
        facts.notes.append(note)
    machine_nodes = len(shapes)
    server_walltime = _walltime(server.get("resources_max"))

    skipped = []
    for name, attrs in queues.items():
        kind = str(attrs.get("queue_type", "Execution"))
        if not _true(attrs.get("enabled", "True")) or not _true(attrs.get("started", "True")):
            skipped.append(f"{name} (disabled)")
            continue
        src = f"qstat -Q -f {name}"
        max_nodes = _nodect(attrs.get("resources_max"))
        if max_nodes is not None:
            nodes_fact = learned(max_nodes, f"{src}: resources_max.nodect={max_nodes}")
        elif machine_nodes:
            nodes_fact = learned(machine_nodes, f"{src}: no resources_max.nodect; {nodes_source} lists "
                                               f"{machine_nodes} nodes")
        else:
            nodes_fact = guess(1, f"{src}: no resources_max.nodect and no node list")
        seconds = _walltime(attrs.get("resources_max"))
        if seconds is not None:
            walltime = learned(seconds, f"{src}: resources_max.walltime")
        elif server_walltime is not None:
            walltime = learned(server_walltime, "qstat -B -f: the server's resources_max.walltime")
        else:
            walltime = guess(DEFAULT_WALLTIME_S, f"{src}: PBS reports no resources_max.walltime")
        min_nodes = _nodect(attrs.get("resources_min"))
        route = str(attrs.get("route_destinations", ""))
        routing = kind.lower().startswith("route") and bool(route)
        policies = _policies(name, attrs)
        if routing:
            # Destinations on other servers (queue@server) are not queues of this profile.
            policies["routes_to"] = learned([d.strip() for d in route.split(",") if d.strip() and "@" not in d],
                                            f"{src}: route_destinations = {route}")
        facts.queues[name] = QueueFacts(
            name=name, max_nodes=nodes_fact, max_walltime_s=walltime,
            min_nodes=(learned(max(min_nodes, 1), f"{src}: resources_min.nodect={min_nodes}")
                       if min_nodes is not None else None),
            description=f"routing queue to {route}" if routing else "",
            **policies,
        )
    _routes_within(facts, skipped)
    if skipped:
        facts.notes.append("queues left out: " + ", ".join(skipped))

    default = str(server.get("default_queue", ""))
    if default in facts.queues:
        facts.default_queue = learned(default, "qstat -B -f: default_queue")
    elif facts.queues:
        first = "debug" if "debug" in facts.queues else next(iter(facts.queues))
        facts.default_queue = guess(first, "the server did not name its default_queue")
    facts.answered = bool(facts.queues or facts.node)
    if not facts.answered:
        for section, what in (("pbs_queues", "qstat -Q -f"), ("pbs_nodes", "pbsnodes -a")):
            failure = probe.failure(section)
            if failure:
                facts.notes.append(f"{what} failed: {failure}")
    return facts


def _routes_within(facts: SchedulerFacts, skipped: list[str]) -> None:
    """Routing queues route to the execution queues discovered (a disabled destination is dropped, a queue that
    routes further is not a destination a profile can hold); a routing queue's node and walltime range is that of
    its destinations where PBS gives it none."""
    from dataclasses import replace

    for name, queue in list(facts.queues.items()):
        if queue.routes_to is None:
            continue
        kept = [d for d in queue.routes_to.value if d in facts.queues and facts.queues[d].routes_to is None]
        if len(kept) < len(queue.routes_to.value):
            dropped = ", ".join(d for d in queue.routes_to.value if d not in kept)
            skipped.append(f"{name}'s destinations {dropped} (not execution queues found here)")
        if not kept:
            facts.queues[name] = replace(queue, routes_to=None)
            continue
        targets = [facts.queues[d] for d in kept]
        update: dict[str, Any] = {"routes_to": Fact(kept, queue.routes_to.source)}
        if queue.max_nodes.guessed or "no resources_max.nodect" in queue.max_nodes.source:
            top = max(targets, key=lambda t: t.max_nodes.value)
            update["max_nodes"] = Fact(top.max_nodes.value, f"its destinations: {top.name}'s limit")
        if queue.max_walltime_s.guessed or "resources_max.walltime" not in queue.max_walltime_s.source:
            top = max(targets, key=lambda t: t.max_walltime_s.value)
            update["max_walltime_s"] = Fact(top.max_walltime_s.value, f"its destinations: {top.name}'s limit")
        facts.queues[name] = replace(queue, **update)
