"""``--check``: an existing site profile against what the machine reports now.

A difference is something the profile states that the scheduler now contradicts: a queue gone or renamed,
a node or walltime limit changed, a queue policy the scheduler enforces that the profile lacks or states
otherwise (minimum walltime, routing destinations, per-user limits, a QOS's walltime and per-user limits for a
queue that submits with it, as the back-end's ``with_qos`` combines them), a different node shape or default
queue. Values the machine did not report are not compared; partitions the profile does not mention are notes,
not differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.config.common import walltime_seconds
from hpctrain.config.node_shape import NodeShape
from hpctrain.config.site import Queue, SiteProfile
from hpctrain.config.walltime import format_hms
from hpctrain.errors import SchedulerError
from hpctrain.submission.discovery.facts import NO_LIMIT_S, NO_LIMIT_TEXT, Findings, NodeFacts, QosFacts, QueueFacts
from hpctrain.submission.schedulers.base import get_scheduler

MEMORY_TOLERANCE = 0.10  # schedulers report usable memory, a bit below what sites publish


@dataclass(frozen=True)
class Difference:
    """One key of the profile that the machine contradicts."""

    key: str
    profile: str
    machine: str
    source: str
    marked_guessed: bool = False

    def text(self) -> str:
        guessed = " (the profile marks it guessed)" if self.marked_guessed else ""
        return f"{self.key}: profile {self.profile}, machine {self.machine}{guessed}  [{self.source}]"


@dataclass
class CheckResult:
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _walltime(seconds: int) -> str:
    return "no limit" if seconds >= NO_LIMIT_S else format_hms(seconds)


def _profile_walltime(text: str) -> str:
    seconds = walltime_seconds(text)
    return "no limit" if seconds >= NO_LIMIT_S or text == NO_LIMIT_TEXT else format_hms(seconds)


def _limits(queue: QueueFacts) -> tuple[int, int, int]:
    """Max nodes, max walltime (s) and min nodes: what makes a renamed queue recognisable."""
    return (queue.max_nodes.value, queue.max_walltime_s.value,
            queue.min_nodes.value if queue.min_nodes is not None else 1)


class _Checker:
    def __init__(self, profile: SiteProfile, findings: Findings) -> None:
        self.profile, self.findings = profile, findings
        self.scheduler = get_scheduler(findings.scheduler.name)
        self.result = CheckResult()

    def differ(self, key: str, profile: object, machine: object, source: str) -> None:
        if any(d.key == key for d in self.result.differences):
            return  # several partitions on the profile's one node shape: say it once
        guessed = any(key == g or key.startswith(g + ".") for g in self.profile.guessed)
        self.result.differences.append(Difference(key, str(profile), str(machine), source, guessed))

    def node(self, prefix: str, mine: NodeShape, theirs: NodeFacts) -> None:
        """Node fields the machine reported (not guessed) and the profile fixes (not 'auto')."""
        if isinstance(mine.cores, int) and not theirs.cores.guessed:
            # The scheduler may count the cores the system keeps (Aurora's 0 and 52) or leave them out.
            cores = {mine.cores, mine.physical_cores}
            fits = cores | {c * mine.threads_per_core for c in cores} if theirs.ncpus_only else cores
            if theirs.cores.value not in fits:
                self.differ(f"{prefix}.cores", mine.cores, theirs.cores.value, theirs.cores.source)
        if not theirs.threads_per_core.guessed and mine.threads_per_core != theirs.threads_per_core.value:
            self.differ(f"{prefix}.threads_per_core", mine.threads_per_core, theirs.threads_per_core.value,
                        theirs.threads_per_core.source)
        # A profile counts the devices ranks get (Aurora's 12 tiles); a scheduler may count GPU packages (6).
        if isinstance(mine.gpus, int) and not theirs.gpus.guessed and theirs.gpus.value not in {
                mine.gpus, mine.gpus // mine.devices_per_gpu}:
            self.differ(f"{prefix}.gpus", mine.gpus, theirs.gpus.value, theirs.gpus.source)
        if (not theirs.gpu_kind.guessed and theirs.gpus.value > 0 and mine.gpu_kind != theirs.gpu_kind.value):
            self.differ(f"{prefix}.gpu_kind", mine.gpu_kind, theirs.gpu_kind.value, theirs.gpu_kind.source)
        memory = theirs.memory_gb
        if isinstance(mine.memory_gb, int | float) and not memory.guessed:
            if abs(mine.memory_gb - memory.value) > MEMORY_TOLERANCE * max(mine.memory_gb, memory.value):
                self.differ(f"{prefix}.memory_gb", mine.memory_gb, memory.value, memory.source)

    def policies(self, key: str, mine: Queue, theirs: QueueFacts) -> None:
        """The queue rules the scheduler states, against the profile's (a rule the profile lacks differs too)."""
        for rule, fact in theirs.policies().items():
            if fact.guessed:
                continue
            if rule == "min_walltime":
                ours: object = mine.min_walltime and walltime_seconds(mine.min_walltime)
                if ours != fact.value:
                    self.differ(f"queues.{key}.min_walltime", mine.min_walltime or "none", format_hms(fact.value),
                                fact.source)
                continue
            ours = getattr(mine, rule)
            if ours != fact.value:
                shown = (", ".join(ours) or "none") if isinstance(ours, list) else ("none" if ours is None else ours)
                theirs_shown = ", ".join(fact.value) if isinstance(fact.value, list) else fact.value
                self.differ(f"queues.{key}.{rule}", shown, theirs_shown, fact.source)

    def qos(self, key: str, mine: Queue, theirs: QosFacts) -> None:
        """A queue that is a QOS (queue_option: qos): its walltime and per-user limits."""
        wall = theirs.max_walltime_s
        if wall is not None and walltime_seconds(mine.max_walltime) != wall.value:
            self.differ(f"queues.{key}.max_walltime", _profile_walltime(mine.max_walltime), _walltime(wall.value),
                        wall.source)
        for rule in ("max_nodes_per_user", "max_running_per_user", "max_queued_per_user"):
            fact = getattr(theirs, rule)
            if fact is not None and getattr(mine, rule) != fact.value:
                self.differ(f"queues.{key}.{rule}", getattr(mine, rule) or "none", fact.value, fact.source)

    def queue(self, key: str, theirs: QueueFacts) -> None:
        mine = self.profile.queues[key]
        if mine.qos and mine.qos in self.findings.scheduler.qos:
            theirs = self.scheduler.with_qos(theirs, self.findings.scheduler.qos[mine.qos])
        if not theirs.max_nodes.guessed and mine.max_nodes != theirs.max_nodes.value:
            self.differ(f"queues.{key}.max_nodes", mine.max_nodes, theirs.max_nodes.value, theirs.max_nodes.source)
        if theirs.min_nodes is not None and mine.min_nodes != theirs.min_nodes.value:
            self.differ(f"queues.{key}.min_nodes", mine.min_nodes, theirs.min_nodes.value, theirs.min_nodes.source)
        wall = theirs.max_walltime_s
        if not wall.guessed and min(walltime_seconds(mine.max_walltime), NO_LIMIT_S) != min(wall.value, NO_LIMIT_S):
            self.differ(f"queues.{key}.max_walltime", _profile_walltime(mine.max_walltime), _walltime(wall.value),
                        wall.source)
        self.policies(key, mine, theirs)
        if theirs.node is not None:
            shape = self.profile.node
            if mine.node is not None:
                shape = shape.model_copy(update=mine.node.model_dump(exclude_none=True))
            prefix = f"queues.{key}.node" if mine.node is not None else "node"
            self.node(prefix, shape, theirs.node)

    def queues(self) -> None:
        profile, machine = self.profile, self.findings.scheduler.queues
        if profile.queue_option == "qos":
            qos = self.findings.scheduler.qos
            for key, mine in profile.queues.items():
                if (mine.submit_as or key) in qos:
                    self.qos(key, mine, qos[mine.submit_as or key])
            if not qos:
                self.result.notes.append(f"the profile's queues are QOS values (queue_option: qos) and "
                                         f"{self.scheduler.title} did not list QOS limits, so queues were not "
                                         "compared")
            return
        name_of = {key: q.submit_as or key for key, q in profile.queues.items()}
        unmentioned = [m for m in machine if m not in name_of.values()]
        for key, name in name_of.items():
            if name in machine:
                self.queue(key, machine[name])
                continue
            mine = profile.queues[key]
            twins = [m for m in unmentioned if _limits(machine[m]) == (
                mine.max_nodes, walltime_seconds(mine.max_walltime), mine.min_nodes)]
            if twins:
                self.differ(f"queues.{key}", name, f"has no {name!r}; {twins[0]!r} has the same limits: renamed? "
                            f"(set submit_as: {twins[0]} or rename the key)", "the scheduler's queue list")
                unmentioned.remove(twins[0])
            else:
                self.differ(f"queues.{key}", name, f"has no queue {name!r} (gone, or renamed with new limits)",
                            "the scheduler's queue list: " + (", ".join(machine) or "none"))
        for name in unmentioned:
            q = machine[name]
            self.result.notes.append(f"{name!r} ({q.max_nodes.value} nodes, {_walltime(q.max_walltime_s.value)}) "
                                     "is on the machine but not in the profile")
        default = self.findings.scheduler.default_queue
        if default is not None and not default.guessed and profile.default_queue is not None:
            mine_name = name_of.get(profile.default_queue, profile.default_queue)
            if mine_name != default.value and profile.default_queue in profile.queues:
                self.differ("default_queue", f"{profile.default_queue} ({mine_name})", default.value, default.source)


def compare_profile(profile: SiteProfile, findings: Findings) -> CheckResult:
    """What in ``profile`` the machine contradicts now (plus notes on what was not compared)."""
    checker = _Checker(profile, findings)
    facts = findings.scheduler
    if facts.name != profile.scheduler:
        checker.differ("scheduler", profile.scheduler, f"{facts.name} ({get_scheduler(facts.name).title})",
                       f"the commands found on {findings.host}")
        if get_scheduler(facts.name).runs_here and profile.login_host and not findings.remote:
            checker.result.notes.append(f"this machine has no scheduler: check on the login node with "
                                        f"--remote USER@{profile.login_host}")
        return checker.result
    if not facts.answered:
        raise SchedulerError(f"cannot check: {get_scheduler(facts.name).title} did not answer on {findings.host}",
                             hint="; ".join(facts.notes) or "try again when the scheduler answers")
    if get_scheduler(facts.name).runs_here:
        checker.node("node", profile.node, findings.node)
        return checker.result
    checker.queues()
    if not any(q.node is not None for q in facts.queues.values()) and facts.node is not None:
        checker.node("node", profile.node, facts.node)
    checker.result.notes += facts.notes
    return checker.result
