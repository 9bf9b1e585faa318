"""Job specs: what to train and at what size, validated by the pydantic models below.

``load_job(path, overrides)`` reads a spec, applies command-line overrides (``--set train.lr=0.01``,
``--nodes``, ``--walltime``, ``--queue``) and validates the result once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, model_validator

from hpctrain.config.backends import COMBINERS
from hpctrain.config.common import (
    MAX_COUNT,
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
from hpctrain.config.job_catalog import locate_job
from hpctrain.config.metrics import MetricsConfig
from hpctrain.config.node_shape import MAX_MEMORY_GB
from hpctrain.config.origin import JobOrigin
from hpctrain.config.precision import PrecisionRequest
from hpctrain.config.site import Directives
from hpctrain.config.staging import JobStaging
from hpctrain.config.validation import validate_model
from hpctrain.config.yamlio import LoadedYaml, load_yaml_file, parse_yaml
from hpctrain.errors import ConfigError


def _named(value: object) -> object:
    """Let ``optimizer: adam`` stand for ``optimizer: {name: adam}`` (likewise combiner, warmup, decay)."""
    return {"name": value} if isinstance(value, str) else value


def _kinded(value: object) -> object:
    return {"kind": value} if isinstance(value, str) else value


def _pair(value: object) -> object:
    """YAML has no tuples: ``betas: [0.9, 0.999]`` arrives as a list."""
    return tuple(value) if isinstance(value, list) else value


# Schedulers take whole megabytes, and Slurm reads --mem=0 as "all of the node's memory".
MIN_MEMORY_GB = 0.001
# Buckets below 1 KB would mean a reduction per handful of numbers (and memory per bucket): a typo, not a plan.
MIN_BUCKET_MB = 0.001
MAX_BUCKET_MB = float(1 << 16)
# Steps, step counts and intervals: far more than any run takes, small enough for every counter.
MAX_STEPS = 10 ** 12
MAX_LR = 1e6
# Seconds in 366 days, the longest walltime any field accepts.
MAX_SECONDS = 366 * 86400
# Requeues beyond this are a loop, not a plan (and the count is compared in the script's shell arithmetic).
MAX_REQUEUES = 1000
# Linux PATH_MAX: a longer working directory cannot be entered.
MAX_PATH = 4096
_HOME_PATH = re.compile(r"(?:~|\$HOME|\$\{HOME\})(?:/.*)?", re.DOTALL)


def _check_workdir(value: str) -> str:
    """An absolute or home-relative directory without control characters (it becomes a quoted ``cd``)."""
    if not (value.startswith("/") or _HOME_PATH.fullmatch(value)):
        raise ValueError("the working directory must be absolute or start with ~/ or $HOME/ "
                         "(relative to what? the job starts in its run directory)")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value) or len(value) > MAX_PATH:
        raise ValueError(f"the working directory holds a control character or is longer than {MAX_PATH}")
    return value


class OptimizerConfig(Strict):
    """Keys left out take torch's defaults; each optimizer accepts only its own keys."""

    name: Literal["sgd", "adam", "lamb"] = "sgd"
    momentum: float | None = Field(None, ge=0, lt=1, description="sgd")
    nesterov: bool | None = Field(None, description="sgd")
    dampening: float | None = Field(None, ge=0, description="sgd")
    weight_decay: float | None = Field(None, ge=0, description="all (decoupled for lamb)")
    betas: Annotated[tuple[float, float] | None, BeforeValidator(_pair)] = Field(None, description="adam, lamb")
    eps: float | None = Field(None, gt=0, description="adam, lamb")
    amsgrad: bool | None = Field(None, description="adam")

    @model_validator(mode="after")
    def _keys_fit_name(self) -> OptimizerConfig:
        allowed = {"sgd": {"momentum", "nesterov", "dampening", "weight_decay"},
                   "adam": {"betas", "eps", "weight_decay", "amsgrad"},
                   "lamb": {"betas", "eps", "weight_decay"}}[self.name]
        given = {k for k in type(self).model_fields if k != "name" and getattr(self, k) is not None}
        if given - allowed:
            raise ValueError(f"optimizer {self.name!r} takes {sorted(allowed)}, not {sorted(given - allowed)}")
        return self


class WarmupConfig(Strict):
    kind: Literal["none", "linear", "legw"] = "none"
    steps: int | None = Field(None, ge=0, le=MAX_STEPS, description="Warm-up length in steps")
    epochs: float | None = Field(None, ge=0, le=MAX_STEPS,
        description="Warm-up length in epochs at the base batch (legw)")
    start: Literal["zero", "base"] = Field("zero", description="LR at step 0: zero, or the one-rank LR")


class DecayConfig(Strict):
    kind: Literal["none", "cosine", "step", "exponential", "polynomial"] = "none"
    steps: int | None = Field(None, ge=1, le=MAX_STEPS,
        description="cosine/polynomial: decay length (default: to the end)")
    gamma: float | None = Field(None, gt=0, description="step/exponential: factor per period or per step")
    every: int | None = Field(None, ge=1, le=MAX_STEPS, description="step: steps between decays")
    every_epochs: float | None = Field(None, gt=0, le=MAX_STEPS, description="step: epochs between decays")
    power: float | None = Field(None, gt=0, description="polynomial: exponent")
    min_lr: float | None = Field(None, ge=0, description="cosine/polynomial: final LR")

    @model_validator(mode="after")
    def _keys_fit_kind(self) -> DecayConfig:
        allowed = {"none": set(), "cosine": {"steps", "min_lr"}, "step": {"gamma", "every", "every_epochs"},
                   "exponential": {"gamma"}, "polynomial": {"steps", "min_lr", "power"}}[self.kind]
        optional = ("steps", "gamma", "every", "every_epochs", "power", "min_lr")
        given = {k for k in optional if getattr(self, k) is not None}
        if given - allowed:
            raise ValueError(f"decay kind {self.kind!r} takes {sorted(allowed) or 'no other keys'}, "
                             f"not {sorted(given - allowed)}")
        return self


class CombinerConfig(Strict):
    name: Annotated[str, AfterValidator(COMBINERS.check)] = Field("mean", description=(
        "A registered gradient combiner: " + ", ".join(COMBINERS.builtin) + ", or one an installed package adds "
        "(entry point group hpctrain.combiners)"), json_schema_extra={"examples": list(COMBINERS.builtin)})
    compression: Literal["none", "fp16", "bf16"] = "none"
    bucket_mb: float = Field(4.0, ge=MIN_BUCKET_MB, le=MAX_BUCKET_MB, description="Fused bucket size in MB")
    adasum_on: Literal["gradient", "delta"] = Field(
        "delta", description="Adasum over raw gradients, or over the optimizer's update as Horovod does"
    )
    bin_len: dict[Literal["conv", "linear", "other"], int] = Field(
        default_factory=lambda: {"conv": 50, "linear": 500, "other": 50},
        description="AdaComp bin length L_T per layer type",
    )
    period: int = Field(1, ge=1, le=MAX_COUNT, description="DaSGD: average every this many steps")
    delay: int = Field(1, ge=0, le=MAX_COUNT,
        description="DaSGD: steps the average stays in flight before it is merged")


class TrainConfig(Strict):
    steps: int = Field(ge=1, le=MAX_STEPS)
    batch_per_rank: int = Field(ge=1, le=MAX_COUNT)
    optimizer: Annotated[OptimizerConfig, BeforeValidator(_named)] = Field(default_factory=OptimizerConfig)
    lr: float = Field(gt=0, le=MAX_LR, description="Learning rate of one rank at batch_per_rank (before lr_scaling)")
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    warmup: Annotated[WarmupConfig, BeforeValidator(_kinded)] = Field(default_factory=WarmupConfig)
    decay: Annotated[DecayConfig, BeforeValidator(_kinded)] = Field(default_factory=DecayConfig)
    combiner: Annotated[CombinerConfig, BeforeValidator(_named)] = Field(default_factory=CombinerConfig)
    seed: int = Field(0, ge=-(2 ** 63), le=2 ** 64 - 1)
    log_every: int = Field(10, ge=1, le=MAX_STEPS)
    comm_backend: Literal["auto", "mpi", "gloo", "nccl", "xccl"] = "auto"
    collective_timeout_s: float = Field(
        300.0, gt=0, le=MAX_SECONDS,
            description="Abort when a collective takes longer; the one setting every communication "
        "timeout derives from (docs/runtime.md, 'Timeouts')")
    grad_clip: float | None = Field(None, gt=0)
    precision: PrecisionRequest = Field(
        "float32", description="Arithmetic of the forward pass and its backward: float32, bfloat16 autocast (float32 "
        "weights, gradients and loss), or auto: bfloat16 where the device computes it natively (AMX CPUs, CUDA GPUs "
        "with bfloat16), else float32 (docs/runtime.md, 'Precision')")


class ResourcesConfig(Strict):
    nodes: int = Field(1, ge=1, le=MAX_COUNT)
    ranks_per_node: int = Field(1, ge=1, le=MAX_COUNT)
    threads_per_rank: int = Field(1, ge=1, le=MAX_COUNT)
    gpus_per_rank: int = Field(0, ge=0, le=MAX_COUNT)
    walltime: Walltime = "01:00:00"
    queue: QueueName | None = None
    account: Word | None = None
    memory_gb: float | None = Field(None, ge=MIN_MEMORY_GB, le=MAX_MEMORY_GB,
                                    description="Memory per node to request (at least 1 MB)")
    exclusive: bool = Field(False, description="Nodes for this job alone (Slurm --exclusive, PBS place=scatter:excl)")
    reservation: PlainName | None = Field(None, description="Run in this reservation (Slurm --reservation; on PBS "
                                          "and Cobalt a reservation is a queue: -q NAME)")
    directives: Directives = Field(default_factory=dict, description="Scheduler options for this job, on top of the "
                                   "site's and the queue's (none that hpctrain writes itself)")
    workdir: Annotated[str, AfterValidator(_check_workdir)] | None = Field(
        None, description="Directory the ranks start in (absolute or ~/...); logs and checkpoints stay in the run "
        "directory")
    node_check: bool | None = Field(
        None, description="Check every node before training (one step on all nodes: interpreter, torch, memory, "
        "node-local disk, devices, the first node's address, clock); default: on for more than one node")
    node_check_timeout_s: int = Field(120, ge=10, le=3600, description="Seconds the node check may take in all; a "
                                      "node that has not answered by then is named bad")
    spare_nodes: int = Field(0, ge=0, le=MAX_COUNT, description="Nodes asked for beyond `nodes`: training runs on "
                             "`nodes` healthy ones, the others replace a node the check or a failure blames")
    straggler_factor: float = Field(1.3, gt=1.0, le=100.0, description="A node whose step time (busy time, or its "
                                    "link's time) stays above the nodes' median by this factor is named a straggler")
    straggler_window_steps: int = Field(100, ge=1, le=MAX_STEPS, description="Steps over which a straggler's time "
                                        "must stay above the median")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def allocated_nodes(self) -> int:
        """The nodes asked of the scheduler: the training nodes and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def checks_nodes(self) -> bool:
        """Whether the job checks its nodes before training (``node_check``, default on beyond one node or with
        spare nodes)."""
        return self.node_check if self.node_check is not None else self.allocated_nodes > 1

    @property
    def memory_mb(self) -> int | None:
        """``memory_gb`` in whole MiB, rounded up (what ``--mem=NM`` and ``mem=Nmb`` carry)."""
        return None if self.memory_gb is None else math.ceil(self.memory_gb * 1024)


class CheckpointConfig(Strict):
    every_steps: int = Field(100, ge=1, le=MAX_STEPS)
    dir: str = "checkpoints"
    keep: int = Field(3, ge=1, le=MAX_COUNT)
    max_requeues: int = Field(3, ge=0, le=MAX_REQUEUES)
    signal: Literal["USR1", "USR2", "TERM", "INT", "HUP", "XCPU"] = "USR2"
    signal_lead_s: int = Field(120, ge=10, le=MAX_COUNT,
                               description="Seconds before the walltime the warning signal comes (below the walltime)")
    stop_check_every: int = Field(1, ge=1, le=MAX_COUNT,
                                  description="Steps between the ranks' stop votes (one small all-reduce each); a "
                                              "stop signal is acted on at the next vote, so keep this many steps well "
                                              "inside signal_lead_s")
    layout: Literal["node", "rank"] = Field(
        "node", description="Rank states in one file per node (packed by the node's local rank 0) or one file per "
                            "rank (docs/checkpoints.md, 'Per-node files')")


class JobSpec(Strict):
    name: Name
    description: str = ""
    model: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_]*)?$")]
    model_args: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    train: TrainConfig
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    env: EnvVars = Field(default_factory=dict, description="Extra environment variables for the ranks")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Where the training metrics go besides "
                                   "metrics.jsonl (docs/report.md, 'TensorBoard and MLflow')")
    staging: JobStaging | None = Field(None, description="What to copy to node-local storage once per node; each key "
                                       "set replaces the site's (docs/scaling.md, 'Staging')")
    _origin: JobOrigin | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        warm = self.train.warmup
        if warm.kind != "none" and (warm.steps is None) == (warm.epochs is None):
            raise ValueError("train.warmup needs exactly one of steps or epochs")
        if warm.kind == "legw" and self.train.lr_scaling != "sqrt":
            raise ValueError("LEGW warm-up pairs with lr_scaling: sqrt (You et al.: peak LR grows with sqrt(k))")
        walltime = walltime_seconds(self.resources.walltime)
        if self.checkpoint.signal_lead_s >= walltime:
            raise FieldProblem(("checkpoint", "signal_lead_s"), (
                f"{self.checkpoint.signal_lead_s} s is not below resources.walltime "
                f"({self.resources.walltime} = {walltime} s): the stop signal would come as the job starts; "
                "lower signal_lead_s or lengthen the walltime"))
        return self

    @property
    def origin(self) -> JobOrigin | None:
        """The file lines and flags the values came from (None for a spec built in Python)."""
        return self._origin

    def schedule_config(self) -> dict[str, Any]:
        """The ``train`` keys that runtime.schedule.LRSchedule.from_spec reads (only keys the user set)."""
        return {"lr": self.train.lr, "lr_scaling": self.train.lr_scaling, "steps": self.train.steps,
                "warmup": self.train.warmup.model_dump(exclude_none=True),
                "decay": self.train.decay.model_dump(exclude_none=True)}

    def spec_hash(self) -> str:
        """Stable short hash of the validated spec (for the run registry)."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------
# Overrides and loading


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """``train.lr=0.01`` → (['train', 'lr'], 0.01); the value is read as a YAML scalar or flow value."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. train.lr=0.01")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not parts or any(not p for p in parts):
        raise ConfigError(f"--set {text!r}: the key must be dotted names like train.lr")
    flag = f"--set {flag_text(text)}"
    try:
        value = parse_yaml(raw, flag).data if raw.strip() else ""
    except ConfigError as exc:  # the value is one line: blame the flag and the key, not "line 1"
        raise ConfigError(exc.message, path=flag, key=".".join(parts), hint=exc.hint) from None
    return parts, value


# Characters of a flag's value repeated in a message: enough to recognise it, never a screenful.
_FLAG_SHOWN = 80


def flag_text(text: str) -> str:
    """A flag's value as messages repeat it: cut to _FLAG_SHOWN characters (the message escapes it)."""
    return text if len(text) <= _FLAG_SHOWN else text[: _FLAG_SHOWN - 1] + "…"


def apply_assignment(data: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set a nested key in raw spec data, creating mappings on the way."""
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(parts)}: {part!r} is not a mapping")
        node = child
    node[parts[-1]] = value


def load_job(
    path: str | Path,
    *,
    sets: list[str] | tuple[str, ...] = (),
    nodes: int | None = None,
    walltime: str | None = None,
    queue: str | None = None,
) -> JobSpec:
    """Load a job spec (a file, or a name: ``config/job_catalog.py``) with command-line overrides applied; every
    error names the file, line and key."""
    loaded = load_yaml_file(locate_job(path))
    return job_from_loaded(loaded, sets=sets, nodes=nodes, walltime=walltime, queue=queue)


def job_from_loaded(
    loaded: LoadedYaml,
    *,
    sets: list[str] | tuple[str, ...] = (),
    nodes: int | None = None,
    walltime: str | None = None,
    queue: str | None = None,
) -> JobSpec:
    """Validate parsed spec data after applying overrides."""
    if not isinstance(loaded.data, dict):
        raise ConfigError("a job spec must be a mapping of keys", path=loaded.path, line=1)
    data = copy.deepcopy(loaded.data)
    # (key path, value, the flag that set it): errors under an overridden key name the flag, not the file.
    assignments = [(*parse_assignment(s), f"--set {flag_text(s)}") for s in sets]
    if nodes is not None:
        assignments.append((["resources", "nodes"], nodes, f"--nodes {nodes}"))
    if walltime is not None:
        assignments.append((["resources", "walltime"], walltime, f"--walltime {flag_text(walltime)}"))
    if queue is not None:
        assignments.append((["resources", "queue"], queue, f"--queue {flag_text(queue)}"))
    origins: dict[tuple[str | int, ...], str] = {}
    for parts, value, flag in assignments:
        apply_assignment(data, parts, value)
        origins[tuple(parts)] = flag
    job = validate_model(JobSpec, loaded, data, origins)
    job._origin = JobOrigin(loaded, origins)  # later checks (preflight) name the same file lines and flags
    return job


def dump_job(job: JobSpec) -> str:
    """The resolved spec as YAML (what a run directory holds and what ``hpctrain run`` reads back)."""
    import yaml

    return yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False)
