"""Advice printed with each prediction: the learning-rate scaling rule, the batch per rank, and warnings where
input, start-up, stragglers or the reduction take a large share of the step.

The LR rule comes from one study, FFN on Theta (Dong et al., DLS@SC 2019, arXiv 1905.06236): linear scaling with
warm-up was best up to 16 nodes (one rank per node), square-root scaling beyond. It is given, labelled as that
study's, only where its conditions hold: a flood-filling network trained with the mean of the gradients, at most
the study's 2048 ranks; elsewhere the plan says there is no rule for the job.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hpctrain.planning.model import Prediction, Workload, step_cost

SQRT_BEYOND_RANKS = 16  # the study's crossover, in data-parallel ranks (one per KNL node there)
STUDY_MAX_RANKS = 2048  # the largest run of the study
STUDY = "from one study: FFN on Theta, Dong et al. 2019"
STUDY_MODELS = ("ffn",)  # model names (job spec `model`) of the study's network
WARN_SHARE = 0.10  # a loss term above this share of the step gets a warning
GOOD_EFFICIENCY = 0.90
BATCH_FACTORS = (2, 4, 8, 16)

_WHAT_TO_DO = {
    "input": "the input is read on the training thread: shard it (each rank reads 1/N of the stream) and "
             "overlap reading with compute",
    "startup": "stage the software environment to the nodes (startup_staged) or ask for a longer walltime",
    "straggler": "the slowest rank sets the pace: narrow the step-time spread (pinned threads, no other load "
                 "on the nodes, a larger batch per rank) or let DaSGD absorb it",
    "reduction": "the reduction is not hidden behind backward: larger buckets, fp16/bf16 on the wire, or "
                 "AdaComp/DaSGD",
    "oversubscription": "ranks x threads (with the other work on the node) exceed its hardware threads: fewer "
                        "ranks per node or threads, or nodes to the job alone",
    "overhead": "a fixed cost per step once the job spans nodes: a larger batch per rank amortises it",
    "checkpoint": "checkpoints cost a large share of the step: write them less often (checkpoint.every_steps)",
}


def lr_rule(ranks: int, lr_scaling: str, warmup_kind: str, model: str = "ffn", combiner: str = "mean") -> str:
    """The LR scaling advice at ``ranks`` data-parallel ranks, against what the job sets."""
    if ranks <= 1:
        return "one rank: no LR scaling"
    names = set(model.lower().replace(":", ".").split("."))
    if not names & set(STUDY_MODELS) or combiner != "mean" or ranks > STUDY_MAX_RANKS:
        return (f"no rule for this job: the planner's rule ({STUDY}) holds for a flood-filling network with the "
                f"mean of the gradients up to {STUDY_MAX_RANKS} ranks; tune the LR at the target scale")
    if ranks <= SQRT_BEYOND_RANKS:
        wanted, why = "linear", f"linear with warm-up up to {SQRT_BEYOND_RANKS} ranks ({STUDY})"
        ok = lr_scaling == "linear" and warmup_kind != "none"
    else:
        wanted, why = "sqrt", f"sqrt beyond {SQRT_BEYOND_RANKS} ranks ({STUDY})"
        ok = lr_scaling == "sqrt"
    if ok:
        return f"{why}: the job's lr_scaling {lr_scaling} fits"
    changes = [f"train.lr_scaling: {wanted}"] if lr_scaling != wanted else []
    if wanted == "linear" and warmup_kind == "none":
        changes.append("a train.warmup")
    return f"{why}: set {' and '.join(changes)}"


def _scaled_batch(w: Workload, factor: int) -> Workload:
    """The workload with ``factor`` times the batch per rank: compute and input grow with it, the spread of
    the compute with its square root (independent per-sample times)."""
    p = w.params
    changed = [replace(p[name], value=p.num(name) * factor) for name in ("compute_s", "input_s")]
    changed += [replace(p[name], value=p.num(name) * math.sqrt(factor)) for name in ("compute_std_s", "input_std_s")]
    changed.append(replace(p["batch_per_rank"], value=p.num("batch_per_rank") * factor))
    return Workload(p.updated(*changed), w.buckets)


def batch_advice(w: Workload, prediction: Prediction) -> str:
    """Whether a larger batch per rank would amortise the fixed per-step costs at this scale."""
    batch = int(w.params.num("batch_per_rank"))
    if prediction.steady_efficiency >= GOOD_EFFICIENCY or prediction.ranks <= 1:
        return f"{batch} per rank ({prediction.ranks * batch} in all) keeps the step efficient"
    for factor in BATCH_FACTORS:
        bigger = _scaled_batch(w, factor)
        eff = step_cost(bigger, 1, 1).steady_s / step_cost(bigger, prediction.nodes).steady_s
        if eff >= GOOD_EFFICIENCY:
            return (f"{batch * factor} per rank (x{factor}, if memory allows) would reach steady efficiency "
                    f"{eff:.2f}; the global batch becomes {prediction.ranks * batch * factor}: check the LR")
    return f"no batch up to x{BATCH_FACTORS[-1]} reaches {GOOD_EFFICIENCY:.2f}: the loss is not per-step overhead"


def warnings_for(prediction: Prediction, walltime_s: float) -> list[str]:
    out = []
    if not math.isfinite(prediction.cost.total_s):
        out.append(f"start-up ({prediction.cost.startup_s:.0f} s) exceeds the walltime ({walltime_s:.0f} s)")
        return out
    for term, share in sorted(prediction.losses.items(), key=lambda kv: -kv[1]):
        if share >= WARN_SHARE:
            label = "start-up" if term == "startup" else term
            nodes = f"{prediction.nodes} node{'s' * (prediction.nodes != 1)}"
            out.append(f"{label} costs {share:.0%} of the step at {nodes}: {_WHAT_TO_DO[term]}")
    return out


def annotate(w: Workload, prediction: Prediction, lr_scaling: str, warmup_kind: str, model: str = "ffn") -> Prediction:
    """The prediction with its advice and warnings filled in."""
    combiner = str(w.params.value("combiner"))
    advice = {"lr_scaling": lr_rule(prediction.ranks, lr_scaling, warmup_kind, model, combiner),
              "batch_per_rank": batch_advice(w, prediction)}
    return replace(prediction, advice=advice, warnings=warnings_for(prediction, w.params.num("walltime_s")))

