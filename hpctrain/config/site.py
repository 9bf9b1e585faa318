"""Site profiles: one YAML file per machine, validated by the pydantic models below.

A profile is found by name in ``$HPCTRAIN_SITES``, ``~/.config/hpctrain/sites/`` and the shipped
``site_configs/``, or given as a path. ``extends`` inherits another profile (deep merge, lists replaced).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from hpctrain.config.backends import LAUNCHERS, SCHEDULERS, SITE_FOLDERS
from hpctrain.config.common import (
    MAX_COUNT,
    DirectiveValue,
    EnvVars,
    FieldProblem,
    Name,
    PlainName,
    QueueName,
    Strict,
    Walltime,
    Word,
    walltime_seconds,
)
from hpctrain.config.node_shape import MAX_RATE, NodeOverride, NodeShape
from hpctrain.config.scheduler_rules import scheduler_rules
from hpctrain.config.search_path import is_file, named_files, search_path
from hpctrain.config.staging import Staging
from hpctrain.config.validation import validate_model
from hpctrain.config.yamlio import LoadedYaml, load_yaml_file
from hpctrain.errors import ConfigError, ConfigErrors


def _scheduler_name(name: str) -> str:
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler {name!r} is not installed: pip install the package that provides it (an entry "
                         f"point {name} in group {SCHEDULERS.group}); installed: {', '.join(SCHEDULERS.names())}")
    return name


# A registered scheduler back-end (config/backends.py): the built-ins or an installed package's entry point.
SchedulerName = Annotated[str, AfterValidator(_scheduler_name)]
MPIEXEC = "mpiexec"  # the profile's word for the scheduler's own mpiexec (its back-end's mpiexec_launcher)


def _launcher_name(name: str) -> str:
    return name if name == MPIEXEC else LAUNCHERS.check(name)


# A registered launcher (config/backends.py), or ``mpiexec``: the one the scheduler's machines run.
LauncherName = Annotated[str, AfterValidator(_launcher_name)]
BackendName = Literal["mpi", "gloo", "nccl", "xccl"]
# The collective library each GPU kind reduces with through torch.distributed: NCCL on NVIDIA, RCCL on AMD (torch's
# ROCm build names it nccl), oneCCL on Intel (torch.xpu's xccl).
DEVICE_BACKENDS: dict[str, str] = {"nvidia": "nccl", "amd": "nccl", "intel": "xccl"}
_DIRECTIVE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_DIRECTIVE_VALUE = re.compile(r"[A-Za-z0-9_./+:@=,%*-]+")
def _check_directives(directives: dict[str, DirectiveValue]) -> dict[str, DirectiveValue]:
    for key, value in directives.items():
        if not _DIRECTIVE_KEY.fullmatch(key):
            raise ValueError(f"directive name {key!r} must be a plain option name like 'constraint'")
        if isinstance(value, str) and not _DIRECTIVE_VALUE.fullmatch(value):
            raise ValueError(
                f"directive {key!r}: value {value!r} may hold only letters, digits and _ . / + : @ = , % * -"
            )
    return directives


def directive_problems(scheduler: str, directives: dict[str, DirectiveValue],
                       where: tuple[str | int, ...], *, job: bool = False, trusted: bool = False) -> None:
    """Refuse directives (a site's, a queue's, or with ``job`` a job's) that would override what hpctrain writes,
    carry what the back-end refuses in a value, or (unless ``trusted``: the site's environment.directives) are
    not on the scheduler's allow-list."""
    rules = scheduler_rules(scheduler)
    for key, value in directives.items():
        if key in rules.reserved_directives:
            raise FieldProblem((*where, key), f"{scheduler} option {key!r} is written by hpctrain from the job "
                               "(nodes, walltime, queue, account, logs): set it in the job spec, not as a directive")
        if not trusted and not rules.directive_allowed(key):
            if key in rules.trusted_only_directives:
                raise FieldProblem((*where, key), f"{scheduler} option {key!r} chooses the job's shell, interpreter, "
                                   "container or environment: only the site profile's environment.directives "
                                   "(trusted, like environment.setup) may set it")
            raise FieldProblem((*where, key), f"{scheduler} option {key!r} is not one a profile or job may set: "
                               "resources, placement, accounting, mail and timing options only (the list: "
                               "docs/rendering.md, 'Trusted shell and data')")
        if job and key in rules.job_key_directives:
            raise FieldProblem((*where, key), f"{scheduler} option {key!r} is a key of the job's resources: set "
                               f"resources.{key}, not a directive")
        problem = rules.directive_value_problem(key, value)
        if problem is not None:
            raise FieldProblem((*where, key), problem)


Directives = Annotated[dict[str, DirectiveValue], AfterValidator(_check_directives)]
class WalltimeBin(Strict):
    """The walltime limit of a queue for jobs of ``min_nodes`` to ``max_nodes`` nodes (Frontier's batch partition:
    2 h up to 91 nodes)."""

    min_nodes: int = Field(ge=1, le=MAX_COUNT)
    max_nodes: int = Field(ge=1, le=MAX_COUNT)
    max_walltime: Walltime


# The rules of a queue a refusal can name; ``Queue.sources`` maps any of them to the page that states it.
QUEUE_RULES: tuple[str, ...] = (
    "max_nodes", "min_nodes", "max_walltime", "min_walltime", "walltime_by_nodes", "routes_to", "direct_submit",
    "max_queued_per_user", "max_running_per_user", "max_nodes_per_user", "chaining")
# Rules beyond a node range and a walltime: a profile that sets one says where it comes from (``source``,
# ``sources`` or the profile's ``guessed``).
_SOURCED_RULES: tuple[str, ...] = (
    "min_walltime", "walltime_by_nodes", "routes_to", "max_queued_per_user", "max_running_per_user",
    "max_nodes_per_user")


class Queue(Strict):
    """A queue, partition or QOS with its limits and the policies the centre states for it (docs/rendering.md,
    'Queue policies')."""

    description: str = ""
    max_nodes: int = Field(ge=1, le=MAX_COUNT)
    min_nodes: int = Field(1, ge=1, le=MAX_COUNT)
    max_walltime: Walltime
    min_walltime: Walltime | None = Field(None, description="Shortest walltime the queue accepts (Theta: 00:30:00)")
    walltime_by_nodes: list[WalltimeBin] = Field(
        default_factory=list, description="Walltime limit by job size: bins sorted by nodes, contiguous, covering "
        "min_nodes..max_nodes; none: max_walltime at every size")
    routes_to: list[Word] = Field(
        default_factory=list, description="A routing queue's execution queues (keys of this profile), tried in "
        "order: the job lands in the first whose nodes and walltime take it (Polaris' prod)")
    direct_submit: bool = Field(True, description="False for an execution queue that takes jobs only through a "
                                "routing queue")
    max_queued_per_user: int | None = Field(None, ge=1, le=MAX_COUNT, description="Jobs one user may have queued "
                                            "(PBS max_queued, Slurm MaxSubmitPU)")
    max_running_per_user: int | None = Field(None, ge=1, le=MAX_COUNT, description="Jobs one user may run at once "
                                             "(PBS max_run, Slurm MaxJobsPU)")
    max_nodes_per_user: int | None = Field(None, ge=1, le=MAX_COUNT, description="Nodes one user's jobs may hold "
                                           "at once (Slurm MaxTRESPU node=)")
    chaining: bool = Field(True, description="Whether the centre lets a job requeue itself or submit its successor "
                           "(false: Frontier's debug QOS)")
    source: str | None = Field(None, description="Where the queue's rules come from: the page, its address and the "
                               "date it was read")
    sources: dict[str, str] = Field(default_factory=dict, description="A rule whose source differs from source "
                                    "(keys: the rule names above; 'guessed' for an estimate)")
    submit_as: QueueName | None = Field(None, description="Name passed to the scheduler if it differs from the key")
    qos: QueueName | None = Field(None, description="Slurm QOS the queue stands for, beside its partition "
                             "(Frontier's debug: --qos=debug on the batch partition)")
    node: NodeOverride | None = None
    directives: Directives = Field(default_factory=dict)
    comm_backend: BackendName | None = None

    @model_validator(mode="after")
    def _policies(self) -> Queue:
        if self.min_nodes > self.max_nodes:
            raise FieldProblem(("min_nodes",), f"min_nodes {self.min_nodes} is above max_nodes {self.max_nodes}")
        longest = walltime_seconds(self.max_walltime)
        if self.min_walltime is not None and walltime_seconds(self.min_walltime) > longest:
            raise FieldProblem(("min_walltime",), f"min_walltime {self.min_walltime} is above max_walltime "
                               f"{self.max_walltime}")
        expected = self.min_nodes
        for i, size in enumerate(self.walltime_by_nodes):
            if size.min_nodes != expected:
                raise FieldProblem(("walltime_by_nodes", i, "min_nodes"), (
                    f"bins must be sorted and contiguous from min_nodes {self.min_nodes}: this one starts at "
                    f"{size.min_nodes}, expected {expected}"))
            if size.max_nodes < size.min_nodes:
                raise FieldProblem(("walltime_by_nodes", i, "max_nodes"), f"max_nodes {size.max_nodes} is below "
                                   f"min_nodes {size.min_nodes}")
            if walltime_seconds(size.max_walltime) > longest:
                raise FieldProblem(("walltime_by_nodes", i, "max_walltime"), (
                    f"{size.max_walltime} is above the queue's max_walltime {self.max_walltime}"))
            expected = size.max_nodes + 1
        if self.walltime_by_nodes and expected != self.max_nodes + 1:
            raise FieldProblem(("walltime_by_nodes",), f"the bins end at {expected - 1} nodes; they must end at "
                               f"max_nodes {self.max_nodes}")
        for key in self.sources:
            if key not in QUEUE_RULES:
                raise FieldProblem(("sources", key), f"{key!r} is not a queue rule; rules: {', '.join(QUEUE_RULES)}")
        return self

    def walltime_limit(self, nodes: int) -> tuple[str, WalltimeBin | None]:
        """The longest walltime for a job of ``nodes`` nodes, and the bin that sets it (None: max_walltime)."""
        for size in self.walltime_by_nodes:
            if size.min_nodes <= nodes <= size.max_nodes:
                return size.max_walltime, size
        return self.max_walltime, None

    def set_rules(self) -> list[str]:
        """The policy rules this queue sets beyond a node range and a walltime (each needs a source)."""
        rules = [r for r in _SOURCED_RULES if getattr(self, r) not in (None, [])]
        if not self.chaining:
            rules.append("chaining")
        if not self.direct_submit:
            rules.append("direct_submit")
        return rules


class Collectives(Strict):
    """The collective library's environment as the centre documents it (NCCL and its network plug-in, RCCL,
    oneCCL): the script sets it in a block of its own, after the site's modules and setup, so that a user sees it
    and a job's ``env`` overrides any of its variables (docs/rendering.md, 'Collective-library environment')."""

    library: str = Field("", description="What the block configures, named in the script's comment (e.g. 'NCCL "
                         "+ aws-ofi-nccl plug-in')")
    source: str | None = Field(None, description="The page that lists these settings and the date it was read")
    modules: list[Word] = Field(default_factory=list, description="Modules loaded first (a plug-in's module)")
    env: EnvVars = Field(default_factory=dict, description="Variables exported next (values quoted); a job's env "
                         "sets its own value instead")
    setup: list[str] = Field(default_factory=list, description="Shell lines run last, as written (trusted: a "
                             "library path that holds the plug-in's version)")


class Environment(Strict):
    """How a job's shell is prepared before the launcher runs."""

    modules: list[Word] = Field(default_factory=list, description="Modules loaded with 'module load'")
    setup: list[str] = Field(
        default_factory=list, description="Shell lines run as written (trusted: written by the site's admin)"
    )
    env: EnvVars = Field(default_factory=dict, description="Environment variables exported (values quoted)")
    venv: str | None = Field(None, description="Python virtual environment to activate on the compute nodes")
    python: str | None = Field(None, description="Python interpreter on the compute nodes (default: venv's)")
    collectives: Collectives = Field(default_factory=Collectives, description="The collective library's "
                                     "environment, rendered as its own block")
    directives: Directives = Field(default_factory=dict, description="Scheduler options that choose the job's "
                                   "shell, interpreter, container or exported environment (Slurm export, container; "
                                   "PBS S, v, V): trusted, written by the site's admin; rendered after all others")


class Network(Strict):
    """Interconnect and file-system figures for the scaling planner; one left out becomes a named assumption."""

    topology: str = ""
    nodes: int | None = Field(None, ge=1, le=MAX_COUNT,
        description="Compute nodes in the machine (the planner's upper bound)")
    latency_us: float | None = Field(None, gt=0, le=MAX_RATE, description="Message latency between nodes, microseconds")
    nics_per_node: int = Field(1, ge=1, le=64, description="Network interfaces per node")
    nic_gbps: float | None = Field(None, gt=0, le=MAX_RATE, description="Injection bandwidth of one interface, GB/s")
    intra_latency_us: float | None = Field(None, gt=0, le=MAX_RATE,
        description="Latency between ranks on one node, microseconds")
    intra_bandwidth_gbps: float | None = Field(None, gt=0, le=MAX_RATE,
        description="Bandwidth between ranks on one node, GB/s")
    reduce_gbps: float | None = Field(None, gt=0, le=MAX_RATE,
        description="Rate at which one rank sums float32 vectors, GB/s")
    shared_core_latency_us: float | None = Field(
        None, gt=0, le=MAX_RATE,
            description="Extra latency of a message to a rank that shares its core with other runnable "
        "threads (it waits for the core), per thread beyond one per hardware thread, microseconds")
    filesystem_gbps: float | None = Field(None, gt=0, le=MAX_RATE,
        description="Aggregate read bandwidth of the shared file system")
    metadata_ops_per_s: float | None = Field(None, gt=0, le=MAX_RATE,
        description="File opens per second of the shared file system")
    taper_nodes: int | None = Field(None, ge=0, le=MAX_COUNT, description="Nodes that reach each other at full "
                                    "injection bandwidth (a leaf switch, a dragonfly group); 0: no taper")
    taper: float | None = Field(None, gt=0, le=1, description="Share of a node's injection bandwidth left for "
                                "traffic beyond taper_nodes (fat-tree taper, dragonfly global links)")


class MPISetup(Strict):
    """How mpi4py is built against the site's own MPI, and how a job checks it runs on it."""

    modules: list[Word] = Field(default_factory=list)
    mpicc: str | None = Field(None, description="Compiler wrapper for building mpi4py (e.g. 'cc' on Cray)")
    expected_library: str | None = Field(
        None, description="Substring of MPI.Get_library_version() that proves the site's MPI is used"
    )


class SiteStaging(Staging):
    """A site's ``staging:`` (config/staging.py) and the scheduler options that give a job its node-local storage."""

    directives: Directives = Field(default_factory=dict, description="Scheduler options added when a job stages "
                                   "(Frontier: C: nvme; Theta: attrs: ssds=required:ssd_size=128)")


class SiteProfile(Strict):
    """A machine: scheduler, launcher, node shape, queues, environment and network."""

    name: Name
    description: str = ""
    extends: str | None = None
    guessed: list[str] = Field(default_factory=list, description="Keys whose values are estimates, not published")
    scheduler: SchedulerName = Field(description=(
        "A registered scheduler back-end: " + ", ".join(sorted(SCHEDULERS.builtin)) + ", or one an installed "
        "package adds (entry point group hpctrain.schedulers)"), json_schema_extra={"examples": sorted(
            SCHEDULERS.builtin)})
    launcher: LauncherName = Field(description=(
        "How ranks start: " + ", ".join(sorted({MPIEXEC, *LAUNCHERS.builtin} - {"mpiexec-hydra", "mpiexec-pals"}))
        + " (mpiexec: the scheduler's own, PALS under PBS Pro, else MPICH's hydra), or a launcher an installed "
        "package adds (entry point group hpctrain.launchers)"))
    launcher_args: list[Word] = Field(default_factory=list)
    cpu_bind: Word | None = Field(None, description="CPU binding for the launcher (srun --cpu-bind, mpiexec)")
    login_host: str | None = None
    remote_root: str | None = Field(None, description="Directory on the login node where run directories go")
    node: NodeShape
    queues: dict[QueueName, Queue] = Field(default_factory=dict)
    default_queue: str | None = None
    queue_option: Word | None = Field(None, description=(
        "The scheduler option carrying the queue name where the back-end offers a choice (its rules list them; "
        "Slurm: partition, the default, or qos)"))
    account: Word | None = None
    account_required: bool = False
    directives: Directives = Field(default_factory=dict)
    filesystems: list[PlainName] = Field(
        default_factory=list, description="File systems the job needs (PBS '-l filesystems=', Cobalt --attrs)")
    environment: Environment = Field(default_factory=Environment)
    comm_backend: BackendName = "mpi"
    network: Network | None = None
    mpi: MPISetup = Field(default_factory=MPISetup)
    intel_extension: bool = Field(False, description="Use intel-extension-for-pytorch on Intel CPUs where the "
                                  "installed torch is one it supports (never for GPUs: torch.xpu needs no IPEX)")
    staging: SiteStaging = Field(default_factory=SiteStaging, description="Node-local storage and what jobs copy "
                                 "there once per node (docs/scaling.md, 'Staging')")

    @model_validator(mode="after")
    def _consistent(self) -> SiteProfile:
        if self.default_queue is not None and self.default_queue not in self.queues:
            raise FieldProblem(("default_queue",), f"default_queue {self.default_queue!r} is not one of the queues: "
                               f"{', '.join(self.queues) or 'none'}")
        if self.queues and self.default_queue is None:
            raise FieldProblem(("default_queue",), "a site with queues needs default_queue")
        if self.comm_backend in ("nccl", "xccl"):
            if self.node.gpus == 0:
                raise FieldProblem(("comm_backend",), f"comm_backend {self.comm_backend} needs GPUs in node.gpus")
            wanted = DEVICE_BACKENDS.get(self.node.gpu_kind)
            if self.node.gpus != "auto" and self.comm_backend != wanted:
                raise FieldProblem(("comm_backend",), f"{self.node.gpu_kind} GPUs reduce with {wanted}, not "
                                   f"{self.comm_backend}")
        directive_problems(self.scheduler, self.directives, ("directives",))
        directive_problems(self.scheduler, self.environment.directives, ("environment", "directives"), trusted=True)
        directive_problems(self.scheduler, self.staging.directives, ("staging", "directives"))
        rules = scheduler_rules(self.scheduler)
        if self.queue_option is not None and self.queue_option not in rules.queue_options:
            raise FieldProblem(("queue_option",), (
                f"{rules.title} takes queue_option {' or '.join(rules.queue_options)}, not {self.queue_option!r}"
                if rules.queue_options else f"{rules.title} has no choice of queue option: remove queue_option"))
        for name, queue in self.queues.items():
            directive_problems(self.scheduler, queue.directives, ("queues", name, "directives"))
            if queue.qos and (not rules.has_qos or self.queue_option == "qos"):
                raise FieldProblem(("queues", name, "qos"), (
                    f"a queue's qos is a {rules.title} QOS beside its partition" if rules.has_qos else
                    f"{self.scheduler} has no QOS: name the queue itself"))
            self._check_policies(name, queue)
        if self.default_queue is not None and not self.queues[self.default_queue].direct_submit:
            raise FieldProblem(("default_queue",), f"queue {self.default_queue!r} takes jobs only through a routing "
                               "queue (direct_submit: false): make that queue the default")
        return self

    def _check_policies(self, name: str, queue: Queue) -> None:
        """Routing targets exist and route no further; every policy rule names where it comes from."""
        for i, target in enumerate(queue.routes_to):
            if target not in self.queues:
                raise FieldProblem(("queues", name, "routes_to", i), f"{target!r} is not one of the queues: "
                                   f"{', '.join(self.queues)}")
            if self.queues[target].routes_to or target == name:
                raise FieldProblem(("queues", name, "routes_to", i), f"{target!r} is itself a routing queue: "
                                   "route to execution queues")
        for rule in queue.set_rules():
            if queue.source is None and rule not in queue.sources and not self.is_guessed(name, rule):
                raise FieldProblem(("queues", name, rule), (
                    f"the {rule} rule needs its source: set queues.{name}.source (the page and the date read), "
                    f"queues.{name}.sources.{rule}, or list queues.{name}.{rule} under guessed"))

    def is_guessed(self, queue_name: str, rule: str) -> bool:
        """Whether the profile lists the queue's rule (or the whole queue, or all queues) under ``guessed``."""
        key = f"queues.{queue_name}.{rule}"
        return any(key == g or key.startswith(g + ".") for g in self.guessed)

    def rule_source(self, queue_name: str, rule: str) -> str:
        """Where one rule of a queue comes from, as a refusal cites it."""
        queue = self.queues[queue_name]
        if rule in queue.sources:
            return queue.sources[rule]
        if self.is_guessed(queue_name, rule):
            return f"guessed in site profile {self.name!r}"
        return queue.source or f"site profile {self.name!r}"

    def routing_queue_of(self, queue_name: str) -> str | None:
        """The routing queue that leads to ``queue_name``, if one does."""
        return next((n for n, q in self.queues.items() if queue_name in q.routes_to), None)

    def queue(self, name: str | None) -> tuple[str | None, Queue | None]:
        """The queue a job lands in (its own or the default) and its limits; unknown names are errors."""
        chosen = name or self.default_queue
        if chosen is None:
            return None, None
        if not self.queues:
            raise ConfigError(f"site {self.name!r} has no queues, but queue {chosen!r} was asked for",
                              key="resources.queue", hint="remove resources.queue for this site")
        if chosen not in self.queues:
            guess = difflib.get_close_matches(chosen, list(self.queues), n=1)
            hint = f"did you mean {guess[0]!r}?" if guess else f"queues of {self.name}: {', '.join(self.queues)}"
            raise ConfigError(f"site {self.name!r} has no queue {chosen!r}", key="resources.queue", hint=hint)
        return chosen, self.queues[chosen]

    def node_for(self, queue_name: str | None) -> NodeShape:
        """Node shape in a queue (queue overrides applied, 'auto' resolved)."""
        node = self.node
        if queue_name and self.queues.get(queue_name) and self.queues[queue_name].node:
            update = self.queues[queue_name].node.model_dump(exclude_none=True)
            if "gpus" in update and "gpu_order" not in update:
                update["gpu_order"] = None  # the base node's order names other devices
            node = node.model_copy(update=update)
        return node.resolved()


# ---------------------------------------------------------------------------------------------------------
# Finding and loading profiles


def shipped_sites_dir() -> Path:
    """The profiles shipped with hpctrain: package data (``hpctrain/site_configs/``), the same directory in a
    checkout (where the top-level ``site_configs/`` links to it) and in any installed copy."""
    return Path(__file__).resolve().parents[1] / "site_configs"


def site_search_path() -> list[Path]:
    """Directories searched for ``NAME.yaml``, first match wins: the user's, hpctrain's, then those installed
    back-end packages ship (entry point group ``hpctrain.sites``)."""
    return [*search_path("HPCTRAIN_SITES", "sites", shipped_sites_dir()), *plugin_site_dirs()]


def plugin_site_dirs() -> list[Path]:
    """The site profile folders installed packages declare; one that cannot be loaded hides no other."""
    found = []
    for name in SITE_FOLDERS.names():
        try:
            found.append(Path(SITE_FOLDERS.load(name)))
        except (ConfigError, TypeError):
            continue
    return found


def available_sites() -> dict[str, Path]:
    """Every profile name visible on the search path, mapped to its file (first match wins)."""
    return named_files(site_search_path())


def locate_site(name_or_path: str) -> Path:
    """Path of the profile named ``name_or_path`` (or the path itself if it is a file)."""
    candidate = Path(name_or_path).expanduser()
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if is_file(candidate):
            return candidate
        raise ConfigError("site profile file not found", path=name_or_path)
    sites = available_sites()
    if name_or_path in sites:
        return sites[name_or_path]
    guess = difflib.get_close_matches(name_or_path, list(sites), n=1)
    hint = f"did you mean {guess[0]!r}?" if guess else "known sites: " + ", ".join(sorted(sites))
    raise ConfigError(f"no site profile named {name_or_path!r}", hint=hint + "; or give a path to a YAML file")


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``: mappings merge key by key, everything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# Real profiles extend one or two others; a longer chain is a mistake (and each level is a recursion).
MAX_EXTENDS = 16


def _load_raw(path: Path, chain: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[LoadedYaml]]:
    """A profile's data with every ``extends`` merged in, and the files read (this one first)."""
    loaded = load_yaml_file(path)
    if not isinstance(loaded.data, dict):
        raise ConfigError("a site profile must be a mapping of keys", path=str(path), line=1)
    parent_name = loaded.data.get("extends")
    if parent_name is None:
        return loaded.data, [loaded]
    if not isinstance(parent_name, str):
        raise ConfigError("extends names one site profile", path=str(path), line=loaded.line_of(("extends",)),
                          key="extends")
    try:
        resolved = str(path.resolve())
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"cannot resolve the path: {exc}", path=str(path)) from None
    if len(chain) >= MAX_EXTENDS:
        raise ConfigError(f"more than {MAX_EXTENDS} profiles extend each other", path=str(path), key="extends",
                          line=loaded.line_of(("extends",)), hint="flatten the chain of profiles")
    if resolved in chain:
        raise ConfigError("profiles extend each other in a cycle", path=str(path), key="extends",
                          line=loaded.line_of(("extends",)), hint=" -> ".join(chain + (resolved,)))
    try:
        parent_path = locate_site(parent_name) if not parent_name.endswith((".yaml", ".yml")) else (
            (path.parent / parent_name) if not Path(parent_name).is_absolute() else Path(parent_name))
        if not is_file(parent_path):
            raise ConfigError("site profile file not found", path=str(parent_path))
    except ConfigError as exc:
        raise ConfigError(f"extends {parent_name!r}: {exc}", path=str(path), line=loaded.line_of(("extends",)),
                          key="extends") from None
    parent_data, parents = _load_parent(parent_path, chain + (resolved,))
    return deep_merge(parent_data, loaded.data), [loaded, *parents]


def _load_parent(path: Path, chain: tuple[str, ...]) -> tuple[dict[str, Any], list[LoadedYaml]]:
    """An extended profile: a YAML mapping of site-profile keys, or one error that names the file and, at most,
    a line of it (never its text: the file extended need not be the extending profile's author's)."""
    hint = f"`hpctrain sites validate {path}` shows the details"
    try:
        data, files = _load_raw(path, chain)
    except ConfigErrors as exc:
        raise ConfigError(f"cannot be extended: it does not read as a site profile ({len(exc.errors)} "
                          "problem(s))", path=str(path), line=exc.errors[0].line, hint=hint) from None
    except ConfigError as exc:
        if exc.key == "extends" or exc.line is None:  # the chain itself, or a file that cannot be read
            raise
        raise ConfigError("cannot be extended: it does not read as a site profile", path=exc.path or str(path),
                          line=exc.line, hint=f"`hpctrain sites validate {exc.path or path}` shows the details"
                          ) from None
    stranger = next((key for key in files[0].data if key not in SiteProfile.model_fields), None)
    if stranger is not None:
        raise ConfigError("cannot be extended: it holds keys a site profile does not have", path=str(path),
                          line=files[0].line_of((stranger,)), hint="extend a site profile") from None
    return data, files


def load_site_file(path: str | Path) -> SiteProfile:
    """Load and validate one profile file, resolving ``extends``."""
    data, files = _load_raw(Path(path))
    return validate_model(SiteProfile, files[0], data, extended=files[1:])


def load_site(name_or_path: str | None = None) -> SiteProfile:
    """Load a profile by name or path; ``None`` is the embedded default, ``local``."""
    if name_or_path is None:
        name_or_path = "local"
    try:
        path = locate_site(name_or_path)
    except ConfigError:
        if name_or_path == "local":
            return embedded_local_site()
        raise
    return load_site_file(path)


def embedded_local_site() -> SiteProfile:
    """The default site, ``local`` (this machine, no scheduler): the shipped ``local.yaml``, read from the
    package whatever the search path holds — the one definition of the default."""
    path = shipped_sites_dir() / "local.yaml"
    if not is_file(path):
        raise ConfigError("hpctrain's shipped site profiles are missing (no local.yaml)", path=str(path),
                          hint="reinstall hpctrain: its package data hpctrain/site_configs/*.yaml holds them")
    return load_site_file(path)
