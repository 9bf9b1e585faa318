"""The run's measured efficiency next to what ``hpctrain plan`` predicts at its size, through the planner's own
``--compare`` path: the prediction at the run's nodes and ranks per node, from the run's profile.

Efficiency is per-rank throughput against one rank alone. Predicted: the planner's steady efficiency. Measured:
the planner's one-rank step (built from the run's own measured compute and input) over the run's measured wall
time per step. Both share the one-rank reference, so their ratio is the measured over the predicted step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import HpctrainError


@dataclass(frozen=True)
class Efficiency:
    nodes: int
    ranks: int
    predicted: float
    measured: float | None
    rows: tuple[tuple[str, float, float | None], ...]  # (quantity, predicted s, measured s)


def compare_with_plan(job_file: Path, site_file: Path | None, site_name: str, profile_text: str,
                      where: str) -> Efficiency:
    """The plan at the run's scale next to its measurements; HpctrainError when the planner cannot say."""
    from hpctrain.config.job import load_job
    from hpctrain.config.site import load_site, load_site_file
    from hpctrain.planning import compare
    from hpctrain.planning.inputs import plan_inputs
    from hpctrain.planning.measurements import parse_profile
    from hpctrain.planning.model import predict

    job = load_job(job_file)
    site = load_site_file(site_file) if site_file is not None and site_file.is_file() else load_site(site_name or None)
    measured = parse_profile(profile_text, where)
    inputs = plan_inputs(job, str(job_file), site, measured, [f"ranks_per_node={measured.ranks_per_node}"])
    nodes = compare.run_nodes(measured)
    prediction = predict(inputs.workload, nodes)
    rows = compare.compare(prediction, measured)
    step = rows[0].measured
    measured_eff = prediction.reference.steady_s / step if step else None
    return Efficiency(nodes, prediction.ranks, prediction.steady_efficiency, measured_eff,
                      tuple((r.name, r.predicted, r.measured) for r in rows))


def try_compare(job_file: Path, site_file: Path | None, site_name: str, profile_text: str | None,
                where: str) -> tuple[Efficiency | None, str]:
    """(comparison, '') or (None, why there is none) — a report is still written without it."""
    if profile_text is None:
        return None, "the run has no step profile (profile.json) yet: it has not trained its first timed steps"
    if not job_file.is_file():
        return None, f"the run's job spec ({job_file.name}) is not there to plan from"
    try:
        return compare_with_plan(job_file, site_file, site_name, profile_text, where), ""
    except HpctrainError as exc:
        return None, f"the planner could not compare: {exc.message}"
