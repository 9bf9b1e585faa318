"""Validation 1: the FFN-on-Theta scaling study (Dong et al., "Scaling Distributed Training of Flood-Filling
Networks on HPC Infrastructure for Brain Mapping", DLS@SC 2019, arXiv 1905.06236) as planner parameters.

Its published conditions, the Theta profile's network figures, two fitted unknowns (a fixed multi-node
overhead and the per-record cost of the coordinate stream every rank reads whole), and hpctrain's own
design on the same machine. docs/planning.md explains every figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.config.site import SiteProfile
from hpctrain.planning.inputs import ASSUMED, site_parameters
from hpctrain.planning.model import BucketTiming, Prediction, Workload, even_buckets, predict
from hpctrain.planning.parameters import Param, Parameters
from hpctrain_bench.fit import fit_nonnegative

# Weak-scaling efficiency against one node, read from the study's scaling figure (each +-0.02).
PUBLISHED = {2: 0.88, 4: 0.90, 8: 0.85, 16: 0.82, 32: 0.81, 64: 0.80, 128: 0.79, 256: 0.81, 512: 0.78,
             1024: 0.73, 2048: 0.68}
READING_ERROR = 0.02
TOLERANCE = 0.05
FOV_PER_S = 0.7  # per KNL node, one rank of 128 threads
BATCH = 1
GRAD_BYTES = 2.5e6  # depth 12, 32 features: 638,433 float32 parameters
COMPUTE_CV = 0.02
FITTED = ("multinode_overhead_s", "record_s")
PAPER = "Dong et al. 2019 (arXiv 1905.06236)"


def _p(name: str, value: float | bool | str, source: str, detail: str) -> Param:
    return Param(name, value, source, detail)


def study_parameters(theta: SiteProfile, compute_cv: float = COMPUTE_CV) -> Parameters:
    """The study's conditions on ``theta`` (site_configs/theta.yaml), its two unknowns still at zero."""
    compute = BATCH / FOV_PER_S
    params = {p.name: p for p in site_parameters(theta)}
    for name, (value, why) in ASSUMED.items():
        params.setdefault(name, _p(name, value, "assumed", why))
    study = [
        _p("compute_s", compute, "study", f"about {FOV_PER_S} FOV/s per KNL node ({PAPER}), {BATCH} FOV per step"),
        _p("compute_std_s", compute_cv * compute, "assumed",
           f"{compute_cv:.0%} step-time spread of a compute-bound KNL node (the study publishes none)"),
        _p("input_s", 0.0, "study", "HDF5 reads are inside the published 0.7 FOV/s; unoverlapped in both designs"),
        _p("input_std_s", 0.0, "study", "inside the compute spread"),
        _p("grad_bytes", GRAD_BYTES, "study", f"2.5 MB gradient ({PAPER})"),
        _p("batch_per_rank", float(BATCH), "assumed",
           "one FOV per rank per step (jobs/ffn-theta.yaml); the fitted values scale with it, the fit does not"),
        _p("ranks_per_node", 1.0, "study", "one rank per KNL node"),
        _p("calibration_ranks_per_node", 1.0, "study", "one rank per KNL node"),
        _p("threads_per_rank", 128.0, "study", "128 threads per rank (2 per core)"),
        _p("backend", "mpi", "study", "Horovod over Cray MPICH"),
        _p("combiner", "mean", "study", "synchronous mean of the gradients"),
        _p("compression", "none", "study", "float32 gradients"),
        _p("bucket_mb", 64.0, "study", "Horovod's 64 MB fusion buffer holds the whole gradient"),
        _p("dasgd_period", 1.0, "study", "not used"),
        _p("dasgd_delay", 0.0, "study", "not used"),
        _p("reduction_overlap", False, "study", "Horovod's fused all-reduce runs after backward"),
        _p("input_overlap", False, "study", "HDF5 reads not overlapped"),
        _p("input_sharding", "whole", "study", "every rank reads the whole coordinate stream, keeping every N-th"),
        _p("startup_staged", False, "study", "Python and TensorFlow imported from Lustre by every rank"),
        _p("walltime_s", 6 * 3600.0, "assumed", "a 6-hour job (jobs/ffn-theta.yaml)"),
        _p("startup_s", 120.0, "assumed", "one node: imports, graph build, HDF5 open"),
        _p("stream_bytes", 100e6, "assumed", "the FIB-25 coordinate stream as TFRecords, about 100 MB"),
        _p("half_gamma_factor", 16.0, "assumed", "not used (float32 on the wire)"),
        _p("checkpoint_bytes", 0.0, "study", "the scaling figure reports training throughput, checkpoints apart"),
        _p("checkpoint_every_steps", 1.0, "study", "not used (no checkpoint cost)"),
        _p("multinode_overhead_s", 0.0, "fitted", "to be fitted"),
        _p("record_s", 0.0, "fitted", "to be fitted"),
    ]
    params.update({p.name: p for p in study})
    return Parameters(params)


def study_workload(params: Parameters) -> Workload:
    """One fused bucket holding the whole gradient, ready when backward ends."""
    return Workload(params, (BucketTiming(params.num("grad_bytes"), 0.0),))


@dataclass(frozen=True)
class StudyFit:
    """The fitted unknowns, the study's workload with them, and the predicted efficiency at each point."""

    workload: Workload
    predicted: dict[int, float]

    @property
    def max_error(self) -> float:
        return max(abs(self.predicted[n] - PUBLISHED[n]) for n in PUBLISHED)

    def fitted(self) -> dict[str, float]:
        return {name: self.workload.params.num(name) for name in FITTED}


def _with(params: Parameters, values: list[float], how: str) -> Parameters:
    return params.updated(*[Param(name, v, "fitted", how) for name, v in zip(FITTED, values, strict=True)])


def fit_study(theta: SiteProfile, compute_cv: float = COMPUTE_CV) -> StudyFit:
    """Fit the two unknowns to the eleven published efficiencies, minimising the largest deviation (the
    validation's criterion is a bound on every point); steady state: the study's figure reports training
    throughput, start-up excluded."""
    base = study_parameters(theta, compute_cv)
    nodes = sorted(PUBLISHED)
    how = f"smallest largest deviation from the {len(nodes)} published efficiencies (2 to 2048 nodes)"

    def residuals(x: list[float]) -> list[float]:
        w = study_workload(_with(base, x, how))
        return [predict(w, n).steady_efficiency - PUBLISHED[n] for n in nodes]

    compute = base.num("compute_s")
    x, _ = fit_nonnegative(residuals, [0.1 * compute, 1e-4 * compute], [0.05 * compute, 5e-5 * compute],
                           minimax=True)
    workload = study_workload(_with(base, x, how))
    return StudyFit(workload, {n: predict(workload, n).steady_efficiency for n in nodes})


def hpctrain_design(fit: StudyFit, *, keep_study_overhead: bool = False) -> Workload:
    """hpctrain on the same machine: each rank reads 1/N of the coordinate stream, gradient buckets are reduced
    during backward, the environment is staged. The fitted multi-node overhead belongs to the study's software
    (Horovod + TensorFlow); hpctrain's own is not measured, so it is zero unless ``keep_study_overhead``."""
    p = fit.workload.params
    changed = [
        _p("input_sharding", "shard", "assumed", "hpctrain: each rank reads its own 1/N of the coordinates"),
        _p("reduction_overlap", True, "assumed", "hpctrain: buckets reduced during backward"),
        _p("startup_staged", True, "assumed", "hpctrain's design: the environment staged to the nodes"),
        _p("bucket_mb", 4.0, "assumed", "hpctrain's default bucket"),
        _p("overlap_window_s", 2 / 3 * p.num("compute_s"), "assumed",
           "backward is about two thirds of a step (twice the forward's work)"),
    ]
    if not keep_study_overhead:
        changed.append(_p("multinode_overhead_s", 0.0, "assumed",
                          "hpctrain's own multi-node overhead: not measured (the study's fit is Horovod's)"))
    params = p.updated(*changed)
    layout = even_buckets(params.num("grad_bytes"), params.num("bucket_mb") * 2**20, params.num("overlap_window_s"))
    return Workload(params, layout)


def compare(study: Workload, design: Workload, nodes: int) -> tuple[Prediction, Prediction]:
    """The study's and hpctrain's predictions at ``nodes``, for the table of what makes the difference."""
    return predict(study, nodes), predict(design, nodes)
