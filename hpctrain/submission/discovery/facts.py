"""What discovery learned about a machine: every value with the command it came from, or marked as a guess.

Each back-end's reader (``Scheduler.read_discovery``) and environment.py fill these in; profile.py writes them
as a site profile with each source as a YAML comment, check.py compares them with an existing profile.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# A queue without a time limit (Slurm's UNLIMITED): the schema needs a walltime, a year stands for "none".
NO_LIMIT_S = 365 * 24 * 3600
NO_LIMIT_TEXT = "365-00:00:00"


@dataclass(frozen=True)
class Fact(Generic[T]):
    """A value and where it came from. ``guessed``: the machine did not say; the user must confirm it."""

    value: T
    source: str
    guessed: bool = False


def learned(value: T, source: str) -> Fact[T]:
    return Fact(value, source)


def guess(value: T, why: str) -> Fact[T]:
    return Fact(value, why, guessed=True)


@dataclass(frozen=True)
class NodeFacts:
    """One kind of compute node. ``ncpus_only``: the scheduler counts CPUs without saying whether they are
    cores or hardware threads (PBS ``ncpus``), so a profile's cores or cores x threads may match it."""

    cores: Fact[int]
    threads_per_core: Fact[int]
    gpus: Fact[int]
    gpu_kind: Fact[str]
    memory_gb: Fact[float]
    count: int = 0
    ncpus_only: bool = False

    def shape(self) -> tuple[int, int, int, str, float]:
        return (self.cores.value, self.threads_per_core.value, self.gpus.value, self.gpu_kind.value,
                self.memory_gb.value)


@dataclass(frozen=True)
class QueueFacts:
    """A partition or queue: its limits (walltime in seconds) and, where the scheduler says, its nodes.
    ``min_nodes`` is None when the scheduler does not report a minimum (Cobalt, PBS without resources_min)."""

    name: str
    max_nodes: Fact[int]
    max_walltime_s: Fact[int]
    min_nodes: Fact[int] | None = None
    node: NodeFacts | None = None
    description: str = ""
    # Policies, where the scheduler states them (None: it does not say): the schema's queue rules.
    min_walltime_s: Fact[int] | None = None
    routes_to: Fact[list[str]] | None = None
    direct_submit: Fact[bool] | None = None
    max_queued_per_user: Fact[int] | None = None
    max_running_per_user: Fact[int] | None = None
    max_nodes_per_user: Fact[int] | None = None

    def policies(self) -> dict[str, Fact[Any]]:
        """The policy rules the scheduler stated, by the schema's key (walltimes in seconds)."""
        found = {"min_walltime": self.min_walltime_s, "routes_to": self.routes_to,
                 "direct_submit": self.direct_submit, "max_queued_per_user": self.max_queued_per_user,
                 "max_running_per_user": self.max_running_per_user, "max_nodes_per_user": self.max_nodes_per_user}
        return {k: v for k, v in found.items() if v is not None}


@dataclass(frozen=True)
class QosFacts:
    """A QOS's limits (a named set of limits a queue may submit under, where the scheduler has them: the back-end's
    ``has_qos``): None where the QOS sets none."""

    name: str
    max_walltime_s: Fact[int] | None = None
    max_nodes: Fact[int] | None = None
    max_nodes_per_user: Fact[int] | None = None
    max_running_per_user: Fact[int] | None = None
    max_queued_per_user: Fact[int] | None = None


@dataclass
class SchedulerFacts:
    """What one scheduler's commands said. ``answered`` is False when its commands exist but all failed.

    A back-end's reader may return a subclass holding what only that back-end's own hooks read."""

    name: str
    answered: bool
    queues: dict[str, QueueFacts] = field(default_factory=dict)
    qos: dict[str, QosFacts] = field(default_factory=dict)  # the QOS limits, where the scheduler lists them
    default_queue: Fact[str] | None = None
    node: NodeFacts | None = None
    accounts: Fact[list[str]] | None = None
    cluster_name: str | None = None
    scratch: Fact[str] | None = None
    notes: list[str] = field(default_factory=list)  # what did not answer, in words


@dataclass
class Findings:
    """Everything discovery learned from one login node, ready to become a profile or to check one."""

    host: str
    user: str
    remote: str | None
    scheduler: SchedulerFacts
    node: NodeFacts
    launcher: Fact[str]
    launcher_args: Fact[list[str]]
    comm_backend: Fact[str]
    mpi_library: Fact[str] | None = None
    mpi_modules: list[str] = field(default_factory=list)
    module_system: str | None = None
    loaded_modules: list[str] = field(default_factory=list)
    scratch: Fact[str] | None = None
    notes: list[str] = field(default_factory=list)


# --- small readers shared by the scheduler modules ------------------------------------------------------------

_GPU_KINDS = (
    ("nvidia", re.compile(r"nvidia|tesla|[ahlvpt]\d{2,3}|gh200|gb200|rtx|quadro|titan", re.I)),
    ("amd", re.compile(r"amd|mi\d{2,3}|instinct|gfx\d+|radeon", re.I)),
    ("intel", re.compile(r"intel|pvc|ponte|max.?1[15]\d0|xe|arc", re.I)),
)


def gpu_kind_of(model: str) -> str | None:
    """``nvidia``, ``amd`` or ``intel`` from a GPU model name the scheduler reports (``a100``, ``MI250X``)."""
    for kind, pattern in _GPU_KINDS:
        if pattern.search(model):
            return kind
    return None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b|w)?\s*$", re.I)
_SCALE = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40, "p": 2 ** 50}


def size_gb(text: str, default_unit: str = "") -> float | None:
    """GiB in a PBS/Torque size (``527672492kb``, ``128gb``, ``11845mb``; bare numbers are bytes unless
    ``default_unit`` says otherwise); None when it is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    number, prefix = float(m.group(1)), (m.group(2) or default_unit).lower()
    word = 8 if (m.group(3) or "").lower() == "w" else 1
    return round(number * _SCALE[prefix] * word / 2 ** 30, 1)


def most_common(shapes: list[NodeFacts]) -> NodeFacts | None:
    """The node kind with the most nodes (ties: the first seen), its count the sum over that kind."""
    if not shapes:
        return None
    counts: Counter[tuple[int, int, int, str, float]] = Counter()
    first: dict[tuple[int, int, int, str, float], NodeFacts] = {}
    for s in shapes:
        counts[s.shape()] += max(s.count, 1)
        first.setdefault(s.shape(), s)
    best = max(counts, key=lambda k: (counts[k], -list(first).index(k)))
    chosen = first[best]
    return NodeFacts(chosen.cores, chosen.threads_per_core, chosen.gpus, chosen.gpu_kind, chosen.memory_gb,
                     count=counts[best], ncpus_only=chosen.ncpus_only)


def describe_shape(shape: tuple[int, int, int, str, float]) -> str:
    cores, threads, gpus, kind, memory = shape
    return f"{cores} cores x {threads} threads, {memory:g} GB" + (f", {gpus} {kind} GPUs" if gpus else "")


def node_kinds_note(shapes: list[NodeFacts], what: str) -> str | None:
    """A note naming the node kinds when there is more than one (the profile then shows the commonest)."""
    kinds = Counter[tuple[int, int, int, str, float]]()
    for s in shapes:
        kinds[s.shape()] += max(s.count, 1)
    if len(kinds) <= 1:
        return None
    words = [f"{n} x ({describe_shape(shape)})" for shape, n in kinds.most_common()]
    return f"{what} has {len(kinds)} kinds of nodes: " + "; ".join(words)
