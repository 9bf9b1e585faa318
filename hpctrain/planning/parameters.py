"""Every number the planner uses, with where it came from: measured, the job, the site profile, an assumption,
a fit, or ``--set``. One table names them all, so a typo in ``--set`` is an error listing the valid keys.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from hpctrain.config.backends import COMBINERS
from hpctrain.errors import ConfigError

SOURCES = ("measured", "job", "site", "assumed", "fitted", "set", "study")
Value = float | bool | str


@dataclass(frozen=True)
class Spec:
    """What a parameter means: its unit, its type (float, int, bool, or a tuple of choices), a description, and
    the range a value must lie in (``at_least`` .. ``at_most``, both inclusive; ``positive``: 0 is not a value,
    being a divisor). Every number has an upper bound: a planner input beyond any machine or model there is
    is a typo, and the model's work and arithmetic stay finite inside the bounds."""

    unit: str
    kind: type | tuple[str, ...]
    description: str
    at_most: float | None = None
    positive: bool = False
    at_least: float = 0.0


# Upper bounds shared by several parameters.
SECONDS = 1e6  # about 11 days: longer than any step or job start-up
BYTES = 1e13  # 10 TB: larger than any model's gradient or a rank's per-step read
GBPS = 1e5  # 100 TB/s: above any link or memory
RANKS_PER_NODE = 4096
MICROSECONDS = 1e7

SPECS: dict[str, Spec] = {
    # -- measured on one node (a run's profile), or given
    "compute_s": Spec("s", float, "mean per-step compute of one rank: forward, backward, optimizer",
                      at_most=SECONDS, positive=True, at_least=1e-9),
    "compute_std_s": Spec("s", float, "spread (standard deviation) of the per-step compute time", at_most=SECONDS),
    "overlap_window_s": Spec("s", float, "time from the first gradient bucket being ready to the end of backward",
                             at_most=SECONDS),
    "input_s": Spec("s", float, "per-step time to produce the next batch (read, crop, augment)", at_most=SECONDS),
    "input_std_s": Spec("s", float, "spread of the per-step input time", at_most=SECONDS),
    "startup_s": Spec("s", float, "start-up on one node: process start to the first step", at_most=SECONDS),
    "grad_bytes": Spec("B", float, "gradient bytes each rank reduces per step", at_most=BYTES),
    "adacomp_ratio": Spec("", float, "AdaComp: bytes on the wire / dense gradient bytes", at_most=1.0),
    "calibration_ranks_per_node": Spec("", int, "ranks per node in the run the measurements come from",
                                       at_most=RANKS_PER_NODE, positive=True, at_least=1),
    # -- the job
    "ranks_per_node": Spec("", int, "ranks per node", at_most=RANKS_PER_NODE, positive=True, at_least=1),
    "threads_per_rank": Spec("", int, "threads per rank", at_most=RANKS_PER_NODE, positive=True, at_least=1),
    "batch_per_rank": Spec("samples", int, "samples per rank per step", at_most=1e9, positive=True, at_least=1),
    "bucket_mb": Spec("MB", float, "fused gradient bucket size", at_most=BYTES / 2**20, positive=True, at_least=1e-6),
    "fusion_cycle_s": Spec("s", float, "Horovod's cycle: each cycle fuses every gradient ready (up to bucket_mb) "
                           "into one all-reduce; 0: fixed buckets of bucket_mb (torch DDP, hpctrain)",
                           at_most=SECONDS),
    "combiner": Spec("", tuple(COMBINERS), "how gradients are combined"),
    "compression": Spec("", ("none", "fp16", "bf16"), "wire precision of the mean"),
    "dasgd_period": Spec("steps", int, "DaSGD: steps between model averages", at_most=1e6, positive=True, at_least=1),
    "dasgd_delay": Spec("steps", int, "DaSGD: steps an average stays in flight", at_most=1e6),
    "walltime_s": Spec("s", float, "walltime of one job (start-up is amortised over it)",
                       at_most=1e8, positive=True, at_least=1),
    "backend": Spec("", ("mpi", "gloo", "nccl", "xccl"), "communication backend"),
    "allreduce_algorithm": Spec("", ("auto", "ring", "tree", "recursive_doubling", "rabenseifner"),
                                "all-reduce algorithm across nodes: the backend's own choice by size, or forced"),
    "checkpoint_every_steps": Spec("steps", int, "steps between checkpoints", at_most=1e9, positive=True,
                                   at_least=1),
    "checkpoint_bytes": Spec("B", float, "bytes one checkpoint writes (model and optimizer state)",
                             at_most=BYTES * 100),
    # -- the site
    "site_nodes": Spec("", int, "compute nodes in the machine", at_most=1e7, positive=True, at_least=1),
    "node_threads": Spec("", int, "hardware threads per node usable by the job (cores x threads per core)",
                         at_most=1e5, positive=True, at_least=1),
    "background_load": Spec("", float, "runnable threads of other work on a node (load average minus the job)",
                            at_most=1e5),
    "all_core_speed": Spec("", float, "a thread's compute speed with every hardware thread of the node busy, "
                           "relative to one alone", at_most=1.0, positive=True, at_least=1e-3),
    "rank_speed_spread": Spec("", float, "spread of the ranks' compute speed between cores or nodes, held over a "
                              "run (standard deviation / mean)", at_most=1.0),
    "shared_core_latency_us": Spec("us", float, "extra latency of a message to a rank that shares its core, per "
                                   "runnable thread beyond one per hardware thread", at_most=MICROSECONDS),
    "latency_us": Spec("us", float, "inter-node message latency (alpha)", at_most=MICROSECONDS),
    "nics_per_node": Spec("", int, "network interfaces per node", at_most=64, positive=True, at_least=1),
    "nic_gbps": Spec("GB/s", float, "injection bandwidth of one network interface",
                     at_most=GBPS, positive=True, at_least=1e-6),
    "taper_nodes": Spec("", int, "nodes that reach each other at full injection bandwidth (a leaf switch, a "
                        "dragonfly group); 0: no taper", at_most=1e7),
    "taper": Spec("", float, "share of a node's injection bandwidth left once a job spans more than taper_nodes",
                  at_most=1.0, positive=True, at_least=1e-4),
    "hiccup_prob": Spec("", float, "probability per rank per step of a stall (OS noise, a collector)", at_most=1.0),
    "hiccup_s": Spec("s", float, "length of one such stall", at_most=SECONDS),
    "slow_node_fraction": Spec("", float, "fraction of the machine's nodes that compute slower", at_most=1.0),
    "slow_node_slowdown": Spec("", float, "how much slower a slow node computes (0.2: 20 % slower)", at_most=100.0),
    "intra_latency_us": Spec("us", float, "latency between ranks on one node", at_most=MICROSECONDS),
    "intra_bandwidth_gbps": Spec("GB/s", float, "bandwidth between ranks on one node",
                                 at_most=GBPS, positive=True, at_least=1e-6),
    "reduce_gbps": Spec("GB/s", float, "rate at which one rank sums two float32 vectors (gamma = 1/rate)",
                        at_most=GBPS, positive=True, at_least=1e-6),
    "filesystem_gbps": Spec("GB/s", float, "aggregate read bandwidth of the shared file system",
                            at_most=GBPS * 100, positive=True, at_least=1e-6),
    "metadata_ops_per_s": Spec("1/s", float, "file opens/stats per second the shared file system serves",
                               at_most=1e10, positive=True, at_least=1e-3),
    # -- design: how the job's runtime behaves
    "reduction_overlap": Spec("", bool, "gradient buckets are reduced during backward"),
    "input_overlap": Spec("", bool, "the next batch is read while the current one trains"),
    "input_sharding": Spec("", ("shard", "whole"), "each rank reads its 1/N of the input stream, or all of it"),
    "startup_staged": Spec("", bool, "the software environment is staged to the nodes, not read by every rank"),
    # -- costs not measured on one node
    "multinode_overhead_s": Spec("s", float, "fixed per-step cost once a job spans nodes, beyond the collectives",
                                 at_most=SECONDS),
    "launch_overhead_s": Spec("s", float, "software cost of starting one collective", at_most=1e3),
    "control_allreduces": Spec("", float, "small all-reduces per step besides the gradients' (the stop vote)",
                               at_most=1e3),
    "half_gamma_factor": Spec("", float, "how much slower a rank sums fp16/bf16 than float32",
                              at_most=1e3, positive=True, at_least=1e-3),
    "record_s": Spec("s", float, "cost of one record of the input stream (read + parse)", at_most=1e3),
    "input_bytes": Spec("B", float, "bytes each rank reads from the shared file system per step", at_most=BYTES),
    "stream_bytes": Spec("B", float, "size of the input stream (read at start-up; by every rank if 'whole')",
                         at_most=BYTES * 100),
    "env_files": Spec("", float, "files a rank opens to start (the Python environment)", at_most=1e9),
    "env_bytes": Spec("B", float, "bytes of the Python environment (what staging copies)", at_most=BYTES),
}


@dataclass(frozen=True)
class Param:
    """One parameter's value and where it came from (``detail``: the file, key, run or reason)."""

    name: str
    value: Value
    source: str
    detail: str

    @property
    def spec(self) -> Spec:
        return SPECS[self.name]

    def text(self) -> str:
        """The value with its unit, e.g. ``1.5 us``."""
        v = self.value
        shown = (("yes" if v else "no") if isinstance(v, bool) else
                 f"{v:.4g}" if isinstance(v, float) else str(v))
        return f"{shown} {self.spec.unit}".rstrip()


class Parameters(Mapping[str, Param]):
    """An immutable set of parameters; ``value(name)`` reads one, ``updated`` returns a changed copy."""

    def __init__(self, params: Mapping[str, Param]) -> None:
        unknown = set(params) - set(SPECS)
        if unknown:
            raise ValueError(f"unknown planner parameters: {sorted(unknown)}")
        self._params = dict(params)

    def __getitem__(self, name: str) -> Param:
        return self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def value(self, name: str) -> Value:
        try:
            return self._params[name].value
        except KeyError:
            raise ConfigError(f"the planner has no value for {name!r}",
                              hint=f"give one with --set {name}=VALUE ({SPECS[name].description})") from None

    def num(self, name: str) -> float:
        value = self.value(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"planner parameter {name!r} is {value!r}, not a number")
        return float(value)

    def flag(self, name: str) -> bool:
        return bool(self.value(name))

    def updated(self, *params: Param) -> Parameters:
        merged = dict(self._params)
        merged.update({p.name: p for p in params})
        return Parameters(merged)

    def set_value(self, name: str, value: Value, source: str, detail: str) -> Parameters:
        return self.updated(Param(name, check_value(name, value), source, detail))


def check_value(name: str, value: Value) -> Value:
    """``value`` converted to the parameter's type; a ConfigError naming the key when it does not fit."""
    spec = SPECS[name]
    kind = spec.kind
    if isinstance(kind, tuple):
        if value not in kind:
            raise ConfigError(f"{value!r} is not one of {', '.join(kind)}", key=name)
        return value
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{value!r} is not yes/no", key=name)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{value!r} is not a number", key=name, hint=f"unit: {spec.unit or 'none'}") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{value!r} must be a finite number >= 0", key=name, hint=_range_text(spec))
    if spec.positive and number < max(spec.at_least, 5e-324):
        raise ConfigError(f"{value!r} must be at least {spec.at_least:g}", key=name, hint=_range_text(spec))
    if spec.at_most is not None and number > spec.at_most:
        raise ConfigError(f"{value!r} must be at most {spec.at_most:g}", key=name, hint=_range_text(spec))
    if kind is int:
        if number != int(number):
            raise ConfigError(f"{value!r} must be a whole number", key=name)
        return float(int(number))
    return number


def _range_text(spec: Spec) -> str:
    low = f"{spec.at_least:g}" if spec.positive else "0"
    high = f"{spec.at_most:g}" if spec.at_most is not None else "any"
    return f"{spec.description}: from {low} to {high} {spec.unit}".rstrip()


def parse_assignment(text: str) -> tuple[str, str]:
    """``latency_us=2.5`` -> ("latency_us", "2.5"); an unknown name lists the closest valid ones."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name or not raw.strip():
        raise ConfigError(f"--set {text!r}: expected NAME=VALUE, e.g. --set latency_us=2.5")
    if name not in SPECS:
        close = difflib.get_close_matches(name, list(SPECS), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "planner parameters: " + ", ".join(SPECS)
        raise ConfigError(f"--set {name}: not a planner parameter", hint=hint)
    return name, raw.strip()


def apply_sets(params: Parameters, sets: list[str]) -> Parameters:
    """``params`` with every ``NAME=VALUE`` of ``--set`` applied (source ``set``)."""
    for text in sets:
        name, raw = parse_assignment(text)
        params = params.set_value(name, raw, "set", f"--set {name}={raw}")
    return params
