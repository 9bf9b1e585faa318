"""The plan as text tables and as JSON: parameters with their sources, then one row per node count with the
step time, efficiency, throughput, time to the target, the dominant loss, the advice and the warnings.
"""

from __future__ import annotations

import math
from typing import Any

from hpctrain.planning.inputs import PlanInputs
from hpctrain.planning.model import LOSS_TERMS, Prediction
from hpctrain.planning.parameters import SPECS

JSON_VERSION = 1


def _finite(value: Any) -> Any:
    """JSON has no infinity: an impossible time is ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def as_json(inputs: PlanInputs, predictions: list[Prediction], target: dict[str, float] | None) -> dict[str, Any]:
    """The whole plan as one JSON-ready mapping (``hpctrain plan --json``)."""
    params = inputs.workload.params
    return _finite({
        "version": JSON_VERSION,
        "job": inputs.job_name,
        "site": inputs.site_name,
        "sample_unit": inputs.sample_unit,
        "target": target,
        "notes": list(inputs.notes),
        "parameters": {name: {"value": p.value, "unit": SPECS[name].unit, "source": p.source, "detail": p.detail}
                       for name, p in sorted(params.items())},
        "buckets": [{"bytes": b.nbytes, "lead_s": b.lead_s} for b in inputs.workload.buckets],
        "predictions": [p.as_dict() for p in predictions],
    })


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _step(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def parameter_rows(inputs: PlanInputs) -> list[list[str]]:
    """name, value, source, where from: assumptions first (they are what a reader should question)."""
    order = {"assumed": 0, "fitted": 1, "set": 2, "measured": 3, "study": 4, "site": 5, "job": 6}
    params = sorted(inputs.workload.params.values(), key=lambda p: (order.get(p.source, 9), p.name))
    return [[p.name, p.text(), p.source, p.detail] for p in params]


def prediction_rows(predictions: list[Prediction], unit: str) -> tuple[list[str], list[list[str]]]:
    headers = ["nodes", "ranks", "step", "efficiency", f"{unit}/s", "to target", "dominant loss",
               *[f"{t}%" for t in LOSS_TERMS]]
    rows = []
    for p in predictions:
        rows.append([str(p.nodes), str(p.ranks), _step(p.step_s), f"{p.efficiency:.3f}",
                     f"{p.samples_per_s:.3g}", _duration(p.time_to_target_s), p.dominant_loss,
                     *[f"{100 * p.losses[t]:.1f}" for t in LOSS_TERMS]])
    return headers, rows


def advice_lines(predictions: list[Prediction]) -> list[str]:
    """One block per node count: LR rule, batch per rank, warnings."""
    lines = []
    for p in predictions:
        lines.append(f"{p.nodes} node{'s' * (p.nodes != 1)} ({p.ranks} rank{'s' * (p.ranks != 1)}):")
        lines.append(f"  LR scaling: {p.advice.get('lr_scaling', '-')}")
        lines.append(f"  batch per rank: {p.advice.get('batch_per_rank', '-')}")
        lines.extend(f"  warning: {w}" for w in p.warnings)
    return lines
