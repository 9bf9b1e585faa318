"""What a run measured about its steps, read from the ``profile.json`` the runtime writes in the run directory.

The file (written by rank 0, hpctrain/runtime/profile.py) holds per-step timings on the ranks of one run:
compute, input and reduction-wait statistics, the gradient buckets (bytes and how long before the end of
backward each was ready), the wire ratio of a compressing combiner, and the start-up time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import DataError
from hpctrain.planning.model import BucketTiming
from hpctrain.text import json_value

PROFILE_FILE = "profile.json"
PROFILE_VERSION = 1
_DAMAGED = "the profile is damaged: measure again (--calibrate)"


@dataclass(frozen=True)
class Stat:
    """Mean and spread of one per-step time, over ``count`` timed steps."""

    mean: float
    std: float
    count: int


@dataclass(frozen=True)
class Measurements:
    """One run's measured step profile; ``where`` names the run and file it came from."""

    where: str
    ranks: int
    ranks_per_node: int
    threads_per_rank: int
    backend: str
    combiner: str
    compute: Stat
    input: Stat
    reduction_wait: Stat
    step: Stat
    overlap_window_s: float
    buckets: tuple[BucketTiming, ...]
    wire_ratio: float | None
    startup_s: float | None
    samples_per_step: int
    sample_unit: str
    model_grad_bytes: float = 0.0
    loadavg_1m: float | None = None
    cpu: Stat | None = None
    background_cpus: float | None = None
    loop: Stat | None = None
    control: Stat | None = None
    node_threads: int | None = None  # hardware threads of the node the run measured on (older profiles: None)

    @property
    def between_steps_s(self) -> float:
        """Per-step time outside the timed step other than the control vote: metrics, logging, saves."""
        if self.loop is None or self.loop.count == 0:
            return 0.0
        control = self.control.mean if self.control is not None else 0.0
        return max(0.0, self.loop.mean - self.step.mean - control)

    @property
    def cpu_share(self) -> float | None:
        """The share of its threads' time a rank was on a CPU during a step (1: never waited for one)."""
        if self.cpu is None or self.step.mean <= 0:
            return None
        return min(1.0, self.cpu.mean / (self.step.mean * self.threads_per_rank))

    @property
    def grad_bytes(self) -> float:
        """The buckets' bytes, or the model's trainable parameter bytes when no bucket was recorded."""
        return sum(b.nbytes for b in self.buckets) or self.model_grad_bytes


def _number(data: dict[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise DataError(f"{where}: {key} is {value!r}, not a number >= 0",
                        hint=_DAMAGED)
    return float(value)


def _stat(data: dict[str, Any], key: str, where: str) -> Stat:
    block = data.get(key)
    if not isinstance(block, dict):
        raise DataError(f"{where}: {key} is missing", hint=_DAMAGED)
    count = _number(block, "count", f"{where}: {key}")
    return Stat(_number(block, "mean", f"{where}: {key}") or 0.0, _number(block, "std", f"{where}: {key}") or 0.0,
                int(count or 0))


def parse_profile(text: str, where: str) -> Measurements:
    """Measurements from the text of a profile.json; DataError naming ``where`` when it cannot be read."""
    try:
        data = json_value(text)
    except ValueError as exc:
        raise DataError(f"{where}: not JSON ({exc})", hint=_DAMAGED) from None
    if not isinstance(data, dict):
        raise DataError(f"{where}: not a profile (a JSON object was expected)")
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise DataError(f"{where}: profile version {version!r}; this hpctrain reads version {PROFILE_VERSION}",
                        hint="measure again with this hpctrain (--calibrate)")
    compute = _stat(data, "compute_s", where)
    if compute.count < 1:
        raise DataError(f"{where}: no timed steps yet", hint="wait until the run has trained a few steps")
    buckets = []
    for i, b in enumerate(data.get("buckets") or []):
        if not isinstance(b, dict):
            raise DataError(f"{where}: buckets[{i}] is not an object")
        buckets.append(BucketTiming(_number(b, "bytes", f"{where}: buckets[{i}]") or 0.0,
                                    _number(b, "lead_s", f"{where}: buckets[{i}]") or 0.0))
    return Measurements(
        where=where,
        ranks=int(_number(data, "ranks", where) or 1),
        ranks_per_node=int(_number(data, "ranks_per_node", where) or 1),
        threads_per_rank=int(_number(data, "threads_per_rank", where) or 1),
        backend=str(data.get("backend", "none")),
        combiner=str(data.get("combiner", "mean")),
        compute=compute,
        input=_stat(data, "input_s", where),
        reduction_wait=_stat(data, "reduction_wait_s", where),
        step=_stat(data, "step_s", where),
        overlap_window_s=_number(data, "overlap_window_s", where) or 0.0,
        buckets=tuple(buckets),
        wire_ratio=_number(data, "wire_ratio", where, optional=True),
        startup_s=_number(data, "startup_s", where, optional=True),
        samples_per_step=int(_number(data, "samples_per_step", where) or 1),
        sample_unit=str(data.get("sample_unit", "samples")),
        model_grad_bytes=_number(data, "grad_bytes", where, optional=True) or 0.0,
        loadavg_1m=_loadavg(data.get("loadavg")),
        cpu=_stat(data, "cpu_s", where) if isinstance(data.get("cpu_s"), dict) else None,
        background_cpus=_background_cpus(data.get("node_cpus"), where),
        loop=_optional_stat(data, "loop_s", where),
        control=_optional_stat(data, "control_s", where),
        node_threads=_node_threads(data.get("node_threads"), where),
    )


def _optional_stat(data: dict[str, Any], key: str, where: str) -> Stat | None:
    """A statistic that profiles of older hpctrain versions do not have."""
    return _stat(data, key, where) if isinstance(data.get(key), dict) else None


def _background_cpus(value: Any, where: str) -> float | None:
    """CPUs other work kept busy during the timed steps (``node_cpus``), when the run measured them."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DataError(f"{where}: node_cpus is not an object", hint=_DAMAGED)
    return _number(value, "background_cpus", f"{where}: node_cpus")


def _node_threads(value: Any, where: str) -> int | None:
    """The measuring node's hardware threads, when the run recorded them (a whole number >= 1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"{where}: node_threads is {value!r}, not a whole number >= 1", hint=_DAMAGED)
    return value


def _loadavg(value: Any) -> float | None:
    """The 1-minute load average the run saw, when it recorded one."""
    if isinstance(value, list) and value and isinstance(value[0], int | float) and not isinstance(value[0], bool):
        return float(value[0]) if math.isfinite(value[0]) and value[0] >= 0 else None
    return None
