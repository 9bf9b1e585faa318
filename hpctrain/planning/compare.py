"""Plan against reality: the prediction at a run's own scale next to what the run measured, so that every real
run checks the model (``hpctrain plan JOB --from RUN --compare [OTHER_RUN]``).

Each row pairs one predicted quantity with the run's measurement of the same thing: the wall time per step
(``loop_s``: the step, the stop vote and the work between steps), the time ranks wait for the gradient
reduction and the stop vote after backward (``reduction_wait_s`` + ``control_s``), the compute, and the
start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.planning.measurements import Measurements
from hpctrain.planning.model import Prediction


@dataclass(frozen=True)
class Row:
    """One quantity: predicted and measured seconds (measured None where the run did not record it)."""

    name: str
    predicted: float
    measured: float | None

    @property
    def ratio(self) -> float | None:
        """measured / predicted (1: the model is right)."""
        if self.measured is None or self.predicted <= 0:
            return None
        return self.measured / self.predicted


def run_nodes(m: Measurements) -> int:
    """The nodes a run spanned, from its ranks and ranks per node."""
    return max(1, -(-m.ranks // max(1, m.ranks_per_node)))


def compare(prediction: Prediction, run: Measurements) -> list[Row]:
    """The predicted step's parts next to the run's measurements of them."""
    terms = prediction.cost.terms
    control = run.control.mean if run.control is not None else 0.0
    measured_step = run.loop.mean if run.loop is not None and run.loop.count else run.step.mean + control
    return [
        Row("step (wall time per step)", prediction.step_s, measured_step),
        Row("compute + work between steps", terms["compute"] + terms["oversubscription"],
            run.compute.mean + run.between_steps_s),
        Row("reduction wait + stop vote", terms["reduction"] + terms["straggler"], run.reduction_wait.mean + control),
        Row("input", terms["input"], run.input.mean),
        Row("start-up", prediction.cost.startup_s, run.startup_s),
    ]


def as_json(prediction: Prediction, run: Measurements, rows: list[Row]) -> dict[str, Any]:
    return {"run": run.where, "nodes": prediction.nodes, "ranks": prediction.ranks,
            "rows": [{"name": r.name, "predicted_s": r.predicted, "measured_s": r.measured, "ratio": r.ratio}
                     for r in rows]}


def table(rows: list[Row]) -> list[list[str]]:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.2f} ms" if v < 10 else f"{v:.1f} s"

    return [[r.name, ms(r.predicted), ms(r.measured), "-" if r.ratio is None else f"{r.ratio:.2f}"] for r in rows]
