"""Validation on published scaling results: each study's machine as a site profile (its network and node figures)
and its workload as planner inputs, every figure with its source or marked ``guessed``, and the efficiencies the
study published. Nothing here is fitted: the planner predicts each point from these inputs alone.

docs/planning.md ("Validation on published scaling results") prints the table this module produces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hpctrain.planning.inputs import ASSUMED, SITE_DEFAULTS
from hpctrain.planning.model import Workload, even_buckets, step_cost
from hpctrain.planning.parameters import SPECS, Param, Parameters, Value

GUESSED = "guessed"
TOLERANCE = 0.05


@dataclass(frozen=True)
class Figure:
    """One input and where it comes from (a citation), or why it is a guess (``guessed: ...``)."""

    value: Value
    source: str

    @property
    def guessed(self) -> bool:
        return self.source.startswith(GUESSED)


def g(value: Value, why: str) -> Figure:
    return Figure(value, f"{GUESSED}: {why}")


@dataclass(frozen=True)
class Study:
    """A published data-parallel scaling result: the machine, the workload, and efficiency at node counts."""

    key: str
    citation: str
    system: str
    site: dict[str, Figure]
    workload: dict[str, Figure]
    published: dict[int, float]
    reference_nodes: int = 1
    reference_ranks: int | None = None  # ranks on the reference node; None: the node full (the study's ranks)
    what: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def figures(self) -> Iterator[tuple[str, Figure]]:
        yield from self.site.items()
        yield from self.workload.items()


# What every study shares unless it says otherwise: synchronous data parallelism, compute measured per rank with
# the node full (so no node-sharing terms), steady-state throughput (no start-up, checkpoints or input in the
# published figure), no stop vote.
COMMON: dict[str, Value] = {
    "threads_per_rank": 1.0, "node_threads": 1000.0, "background_load": 0.0, "all_core_speed": 1.0,
    "rank_speed_spread": 0.0, "shared_core_latency_us": 0.0, "input_s": 0.0, "input_std_s": 0.0,
    "startup_s": 0.0, "walltime_s": 1e7, "combiner": "mean", "compression": "none", "dasgd_period": 1.0,
    "dasgd_delay": 0.0, "adacomp_ratio": 0.02, "control_allreduces": 0.0, "half_gamma_factor": 1.0,
    "record_s": 0.0, "input_bytes": 0.0, "stream_bytes": 0.0, "checkpoint_bytes": 0.0,
    "checkpoint_every_steps": 1.0, "multinode_overhead_s": 0.0, "input_overlap": True, "input_sharding": "shard",
    "reduction_overlap": True, "startup_staged": True, "batch_per_rank": 1.0,
}
BACKWARD_SHARE = 2 / 3  # backward is about twice the forward's work: the window a reduction can hide in
COMPUTE_CV = 0.02  # the per-step spread the FFN-on-Theta validation assumes, for studies that publish none

P100_REDUCE = g(240.0, "P100 HBM2 732 GB/s / 3 (two vectors read, one written)")
V100_REDUCE = g(300.0, "V100 HBM2 900 GB/s / 3 (two vectors read, one written)")
KNL_REDUCE = g(2.0, "one KNL core summing float32 vectors, as site_configs/theta.yaml")
HOROVOD = "Horovod docs, Benchmarks page and README (Sergeev & Del Balso 2018, arXiv 1802.05799)"
TF_BENCH = "tensorflow.org/performance/benchmarks, P100 (DGX-1) synthetic data, as tabulated by e-bug/distributed-" \
           "tensorflow-benchmarks"
KURTH = "Kurth et al. 2018, Exascale Deep Learning for Climate Analytics (SC18, arXiv 1810.01993)"
DLPERF = "OneFlow DLPerf Benchmark Test Report V1.0, Aug 2020 (github.com/Oneflow-Inc/DLPerf, " \
         "reports/dlperf_benchmark_test_report_v1.md)"
NGC_DGX1 = "NVIDIA DeepLearningExamples, TensorFlow ResNet-50 v1.5 README, DGX-1 (8x V100 16G) training " \
           "performance (commit 709456c), as quoted in DLPerf's TensorFlow ResNet-50 README"
NCCL_TUNING = "NCCL's own cost model, src/graph/tuning.cc (NCCL 2.6-2.7)"

# Horovod fuses, once per cycle, every gradient that all ranks have ready, up to its fusion buffer (Horovod docs,
# "Tensor Fusion"); the defaults until v0.21 were a 5 ms cycle and a 64 MB buffer (v0.21.0 release notes: "changed
# default cycle time from 5ms to 1ms and fusion threshold from 64MB to 128MB").
HOROVOD_FUSION = "Horovod docs, Tensor Fusion; v0.21.0 release notes (5 ms cycle, 64 MB buffer before v0.21)"
HOROVOD_CYCLE = Figure(5e-3, f"HOROVOD_CYCLE_TIME default before v0.21 ({HOROVOD_FUSION})")
HOROVOD_BUFFER = Figure(64.0, f"HOROVOD_FUSION_THRESHOLD default before v0.21 ({HOROVOD_FUSION})")


NCCL_RING_ONLY = Figure("ring", "NCCL 2.0-2.3 build only rings (double binary trees came with NCCL 2.4, 2019)")
NCCL_NVLINK_STEP = Figure(3.4, f"an NVLink ring step of NCCL's Simple protocol ({NCCL_TUNING})")
NCCL_PCI_STEP = Figure(5.7, f"a PCIe ring step of NCCL's Simple protocol ({NCCL_TUNING})")


HOROVOD_NEGOTIATION = g(1e-4, "Horovod's negotiation of each fused buffer: every rank tells rank 0 which tensors "
                           "are ready, rank 0 answers (Horovod docs, Timeline)")


def _horovod(model: str, images_per_s: Figure, params_m: float, at_32: float, at_128: float) -> Study:
    """Horovod's tf_cnn_benchmarks runs: 4 Pascal GPUs per server, 25 Gbit/s RoCE, batch 64 per GPU, NCCL 2."""
    batch = 64.0
    return Study(
        key=f"horovod-{model.lower()}", citation=HOROVOD, what=f"{model}, batch 64 per GPU, synthetic data",
        system="servers of 4 Pascal GPUs, RoCE 25 Gbit/s",
        site={
            "nic_gbps": Figure(3.125, f"25 Gbit/s RoCE ({HOROVOD})"),
            "nics_per_node": g(1.0, "one 25 Gbit/s port per server"),
            "latency_us": g(5.0, "RoCE latency through NCCL 2's socket/verbs transport"),
            "intra_bandwidth_gbps": g(10.0, "PCIe 3.0 x16 between Pascal GPUs (no NVLink stated)"),
            "intra_latency_us": NCCL_PCI_STEP,
            "reduce_gbps": P100_REDUCE,
            "backend": Figure("nccl", f"NCCL 2 ring-allreduce ({HOROVOD})"),
            "allreduce_algorithm": NCCL_RING_ONLY,
            "ranks_per_node": Figure(4.0, f"4 GPUs per server ({HOROVOD})"),
        },
        workload={
            "compute_s": Figure(batch / float(images_per_s.value), f"batch 64 / {images_per_s.value} images/s per GPU "
                                f"({images_per_s.source})"),
            "grad_bytes": Figure(4 * params_m * 1e6, f"{params_m}M float32 parameters (the model's published size)"),
            "bucket_mb": HOROVOD_BUFFER, "fusion_cycle_s": HOROVOD_CYCLE,
            "overlap_window_s": g(BACKWARD_SHARE * batch / float(images_per_s.value), "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * batch / float(images_per_s.value), "2 % step spread, as for Theta"),
            "launch_overhead_s": HOROVOD_NEGOTIATION,
        },
        published={32: at_32, 128: at_128},
        notes=("efficiency against 1 GPU x N; 32 servers (128 GPUs) from the earlier README, 128 (512 GPUs) from "
               "the later one",),
    )


def _dlperf(framework: str, model: str, batch: int, throughput: tuple[float, float, float, float],
            params_m: float, reducer: str) -> Study:
    """One column of DLPerf's table: 1 GPU, then 1, 2 and 4 servers of 8 V100s; efficiency against 1 GPU x N."""
    one, *scaled = throughput
    compute = batch / one
    grad = 4 * params_m * 1e6
    window = BACKWARD_SHARE * compute
    if reducer == "ddp":
        bucket = g(25.0, "torch DDP's default bucket_cap_mb (torch docs); the report does not say whether the "
                         "NGC 20.03 example wraps the model in torch's or apex's DDP")
        launch = g(20e-6, "a DDP bucket's launch from its C++ reducer, as hpctrain's measured 20 us")
        backend = Figure("nccl", f"torch DistributedDataParallel over NCCL 2.6 (NGC 20.03 container, {DLPERF})")
    else:
        bucket = HOROVOD_BUFFER
        launch = HOROVOD_NEGOTIATION
        backend = Figure("nccl", f"Horovod 0.19 over NCCL 2.6.3 (NGC 20.03 container, {DLPERF})")
    table = f"{DLPERF}: {one} / " + " / ".join(str(t) for t in scaled) + " per second at 1 / 8 / 16 / 32 GPUs"
    return Study(
        key=f"dlperf-{framework.lower()}-{model.lower()}", citation=DLPERF,
        what=f"{model}, {framework}, FP32, batch {batch} per GPU",
        system="servers of 8 V100-SXM2-16GB (NVLink), one EDR InfiniBand 100 Gbit/s port each",
        site={
            "nic_gbps": Figure(12.5, f"InfiniBand 100 Gb/s (4X EDR), one mlx5_0 per server ({DLPERF})"),
            "nics_per_node": Figure(1.0, f"one mlx5_0 in the report's nvidia-smi topo ({DLPERF})"),
            "latency_us": g(2.0, "EDR InfiniBand; NCCL's own 9.6 us per network step is larger and is used"),
            "intra_bandwidth_gbps": g(50.0, "NVLink 2, 25 GB/s per link and direction, rings over bonded links"),
            "intra_latency_us": NCCL_NVLINK_STEP,
            "reduce_gbps": V100_REDUCE,
            "backend": backend,
            "ranks_per_node": Figure(8.0, f"8 V100 per server ({DLPERF})"),
        },
        workload={
            "compute_s": Figure(compute, f"batch {batch} / {one} per second on 1 GPU ({DLPERF})"),
            "grad_bytes": Figure(grad, f"{params_m}M float32 parameters (the model's published size)"),
            "bucket_mb": bucket,
            "fusion_cycle_s": HOROVOD_CYCLE if reducer == "horovod" else Figure(0.0, "DDP reduces fixed buckets"),
            "overlap_window_s": g(window, "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * compute, "2 % step spread, as for Theta"),
            "launch_overhead_s": launch,
        },
        published={n: round(t / (one * 8 * n), 3) for n, t in zip((1, 2, 4), scaled, strict=True)},
        reference_ranks=1,
        notes=(table,),
    )


# The DLPerf columns whose gradient reduction the planner has the inputs for: torch DDP (PyTorch) and Horovod
# (TensorFlow 1, MXNet), for ResNet-50 and BERT-base (batch 32, the only BERT batch every one of them ran).
# OneFlow's, PaddlePaddle's and TensorFlow 2's own reducers are left out, whatever their numbers.
DLPERF_RUNS: tuple[tuple[str, str, int, tuple[float, float, float, float], float, str], ...] = (
    ("PyTorch", "ResNet-50", 128, (354.40, 2719.07, 5307.21, 10632.33), 25.6, "ddp"),
    ("TF1", "ResNet-50", 128, (362.44, 2721.98, 5099.42, 9514.64), 25.6, "horovod"),
    ("MXNet", "ResNet-50", 96, (389.71, 2947.72, 5684.68, 10419.21), 25.6, "horovod"),
    ("TF1", "BERT-base", 32, (106.80, 806.56, 1090.20, 1923.68), 110.0, "horovod"),
    ("MXNet", "BERT-base", 32, (127.05, 928.03, 1136.44, 1895.50), 110.0, "horovod"),
)


STUDIES: tuple[Study, ...] = (
    _horovod("InceptionV3", Figure(142.0, TF_BENCH), 23.9, 0.90, 0.90),
    _horovod("ResNet-101", g(129.0, "between ResNet-50's 219 and ResNet-152's 91.8 images/s (TF benchmarks) by FLOPs"),
             44.7, 0.90, 0.90),
    _horovod("VGG-16", Figure(154.0, TF_BENCH), 138.4, 0.79, 0.68),
    Study(
        key="goyal-resnet50", what="ResNet-50, 32 images per GPU, 8 GPUs per server",
        citation="Goyal et al. 2017, Accurate, Large Minibatch SGD (arXiv 1706.02677)",
        system="Big Basin: 8 P100 (NVLink) per server, 50 Gbit/s Ethernet, Caffe2 + gloo",
        site={
            "nic_gbps": Figure(6.25, "50 Gbit/s Ethernet per server (Goyal et al. section 5)"),
            "nics_per_node": Figure(1.0, "one 50 Gbit/s port (Goyal et al.)"),
            "latency_us": g(10.0, "TCP over Ethernet through gloo"),
            "intra_bandwidth_gbps": g(20.0, "NVLink 1 between P100s in a hybrid cube mesh, one link"),
            "intra_latency_us": g(5.0, "an NVLink peer copy"),
            "reduce_gbps": P100_REDUCE,
            "backend": Figure("gloo", "Caffe2 with gloo, intra-server reduce, inter-server all-reduce, broadcast"),
            "allreduce_algorithm": Figure("rabenseifner", "recursive halving and doubling between servers (Goyal "
                                          "et al. section 4)"),
            "ranks_per_node": Figure(8.0, "8 GPUs per server"),
        },
        workload={
            "compute_s": g(32 / 219.0, "32 images / 219 images/s, ResNet-50 on a P100 (TF benchmarks)"),
            "grad_bytes": Figure(4 * 25.6e6, "25.6M float32 parameters (ResNet-50)"),
            "bucket_mb": g(4.0, "a layer's gradient at a time: Caffe2 reduces each as backprop produces it"),
            "overlap_window_s": g(BACKWARD_SHARE * 32 / 219.0, "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * 32 / 219.0, "2 % step spread, as for Theta"),
            "launch_overhead_s": g(50e-6, "a gloo collective's software cost"),
        },
        published={32: 0.90},
        notes=("~90 % scaling efficiency from 8 to 256 GPUs (one server is the reference)",),
    ),
    Study(
        key="kurth-daint", what="Tiramisu, 2 images per GPU, 1 GPU per node", citation=KURTH,
        system="Piz Daint: 1 P100 per node, Cray Aries dragonfly",
        site={
            "nic_gbps": g(10.0, "Aries injection bandwidth, as site_configs/theta.yaml"),
            "latency_us": g(1.5, "Aries MPI latency, as site_configs/theta.yaml"),
            "intra_bandwidth_gbps": g(10.0, "not used: one rank per node"),
            "intra_latency_us": g(1.0, "not used: one rank per node"),
            "reduce_gbps": P100_REDUCE,
            "backend": Figure("mpi", f"Horovod's hierarchical all-reduce: NCCL inside a node, MPI across nodes; with "
                              f"one GPU per node all of it is MPI ({KURTH})"),
            "ranks_per_node": Figure(1.0, "1 P100 per node"),
        },
        workload={
            "compute_s": g(0.5, "21.0 PF/s over 5300 GPUs = 4 TF/s per GPU; the step's FLOPs are not published"),
            "grad_bytes": g(4 * 7.0e6, "a Tiramisu of about 7M parameters"),
            "bucket_mb": HOROVOD_BUFFER, "fusion_cycle_s": HOROVOD_CYCLE,
            "overlap_window_s": g(BACKWARD_SHARE * 0.5, "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * 0.5, "2 % step spread, as for Theta"),
            "launch_overhead_s": HOROVOD_NEGOTIATION,
        },
        published={5300: 0.790},
    ),
    Study(
        key="kurth-summit", what="DeepLabv3+, FP32, 6 GPUs per node", citation=KURTH,
        system="Summit: 6 V100 per node (NVLink 2), 2 x EDR InfiniBand, non-blocking fat tree",
        site={
            "nic_gbps": Figure(12.5, "EDR InfiniBand 100 Gbit/s per port (OLCF Summit user guide)"),
            "nics_per_node": Figure(2.0, "dual-rail EDR (OLCF Summit user guide)"),
            "latency_us": g(1.5, "EDR MPI latency"),
            "intra_bandwidth_gbps": Figure(50.0, "NVLink 2 between GPUs of a socket, 50 GB/s (OLCF user guide)"),
            "intra_latency_us": g(2.0, "an NVLink peer copy"),
            "reduce_gbps": V100_REDUCE,
            "backend": Figure("mpi", f"Horovod's hierarchical all-reduce: NCCL reduce-scatter and allgather inside a "
                              f"node, MPI all-reduce across nodes ({KURTH})"),
            "ranks_per_node": Figure(6.0, "6 V100 per node"),
        },
        workload={
            "compute_s": g(1.0, "325.8 PF/s over 27360 GPUs = 11.9 TF/s per GPU; the step's FLOPs are not "
                            "published"),
            "grad_bytes": g(4 * 43.6e6, "DeepLabv3+ with a ResNet-50 backbone, about 44M parameters"),
            "bucket_mb": HOROVOD_BUFFER, "fusion_cycle_s": HOROVOD_CYCLE,
            "overlap_window_s": g(BACKWARD_SHARE * 1.0, "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * 1.0, "2 % step spread, as for Theta"),
            "launch_overhead_s": HOROVOD_NEGOTIATION,
        },
        published={4560: 0.907},
    ),
    Study(
        key="cosmoflow-cori", what="CosmoFlow 3-D CNN, 1 rank per KNL node",
        citation="Mathuriya et al. 2018, CosmoFlow (SC18, arXiv 1808.04728)",
        system="Cori: 1 KNL per node, Cray Aries dragonfly, Cray PE ML plugin (MPI)",
        site={
            "nic_gbps": Figure(8.0, "Aries: ~8 GB/s MPI bandwidth (NERSC Cori configuration page)"),
            "latency_us": Figure(1.5, "Aries: 0.25-3.7 us MPI latency (NERSC Cori configuration page), middle"),
            "intra_bandwidth_gbps": g(10.0, "not used: one rank per node"),
            "intra_latency_us": g(1.0, "not used: one rank per node"),
            "reduce_gbps": KNL_REDUCE,
            "backend": Figure("mpi", "Cray PE ML plugin over Cray MPICH"),
            "ranks_per_node": Figure(1.0, "one rank per KNL node (Mathuriya et al.)"),
        },
        workload={
            "compute_s": g(1.0, "3.5 PF/s over 8192 nodes = 0.43 TF/s per node; the step's FLOPs are not published"),
            "grad_bytes": g(4 * 7.0e6, "a 3-D CNN of about 7M parameters"),
            "bucket_mb": g(64.0, "the plugin's gradient buffer"),
            "overlap_window_s": g(BACKWARD_SHARE * 1.0, "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * 1.0, "2 % step spread, as for Theta"),
            "launch_overhead_s": g(1e-4, "a plugin all-reduce's software cost"),
        },
        published={8192: 0.77},
    ),
    *(_dlperf(*args) for args in DLPERF_RUNS),
    Study(
        key="ngc-dgx1-tf-rn50", what="ResNet-50 v1.5, TF1 + Horovod, FP32, 8 GPUs", citation=NGC_DGX1,
        system="DGX-1: 8 V100-SXM2-16GB (NVLink hybrid cube mesh)",
        site={
            "intra_bandwidth_gbps": g(50.0, "NVLink 2, 25 GB/s per link and direction, rings over bonded links"),
            "intra_latency_us": NCCL_NVLINK_STEP,
            "reduce_gbps": V100_REDUCE,
            "backend": Figure("nccl", f"Horovod over NCCL ({NGC_DGX1})"),
            "ranks_per_node": Figure(8.0, "8 GPUs"),
        },
        workload={
            "compute_s": g(128 / 364.9, f"batch 128 (as DLPerf compares it) / 364.9 images/s on 1 GPU ({NGC_DGX1})"),
            "grad_bytes": Figure(4 * 25.6e6, "25.6M float32 parameters (ResNet-50)"),
            "bucket_mb": HOROVOD_BUFFER, "fusion_cycle_s": HOROVOD_CYCLE,
            "overlap_window_s": g(BACKWARD_SHARE * 128 / 364.9, "backward: 2/3 of the step"),
            "compute_std_s": g(COMPUTE_CV * 128 / 364.9, "2 % step spread, as for Theta"),
            "launch_overhead_s": HOROVOD_NEGOTIATION,
        },
        published={1: round(2778.5 / (8 * 364.9), 3)},
        reference_ranks=1,
        notes=("8 GPUs 2778.5 images/s against 1 GPU 364.9 (x8)",),
    ),
)


def study_parameters(study: Study, changes: dict[str, Value] | None = None) -> Parameters:
    """Every planner parameter for ``study``: its figures, then what all studies share, then the planner's own
    assumptions for the rest; ``changes`` replaces figures (a sensitivity or a what-if)."""
    params: dict[str, Param] = {}
    for name, (value, why) in ASSUMED.items():
        params[name] = Param(name, value, "assumed", why)
    for name, (default, why) in SITE_DEFAULTS.items():
        params[name] = Param(name, default, "assumed", why)
    params["nics_per_node"] = Param("nics_per_node", 1.0, "assumed", "one network interface")
    for name, value in COMMON.items():
        params[name] = Param(name, value, "study", "every study: synchronous data parallel, steady state")
    for name, fig in study.figures():
        params[name] = Param(name, fig.value, "assumed" if fig.guessed else "study", fig.source)
    params["calibration_ranks_per_node"] = Param("calibration_ranks_per_node", params["ranks_per_node"].value,
                                                 "study", "per-GPU throughput measured with the node full")
    result = Parameters(params)
    for name, value in (changes or {}).items():
        result = result.set_value(name, value, "set", "what-if")
    return result


def workload(study: Study, changes: dict[str, Value] | None = None) -> Workload:
    p = study_parameters(study, changes)
    return Workload(p, even_buckets(p.num("grad_bytes"), p.num("bucket_mb") * 2**20, p.num("overlap_window_s")))


def efficiency(w: Workload, nodes: int, reference_nodes: int = 1, reference_ranks: int | None = None) -> float:
    """Per-rank throughput at ``nodes`` against the study's reference (one node, full or of
    ``reference_ranks`` ranks), steady state."""
    return step_cost(w, reference_nodes, reference_ranks).steady_s / step_cost(w, nodes).steady_s


def study_efficiency(study: Study, w: Workload, nodes: int) -> float:
    return efficiency(w, nodes, study.reference_nodes, study.reference_ranks)


@dataclass(frozen=True)
class Point:
    study: Study
    nodes: int
    published: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted - self.published


def validate(changes: dict[str, Value] | None = None) -> list[Point]:
    """Predicted against published efficiency at every published point of every study."""
    out = []
    for study in STUDIES:
        w = workload(study, changes)
        for nodes, published in sorted(study.published.items()):
            out.append(Point(study, nodes, published, study_efficiency(study, w, nodes)))
    return out


def sensitivity(study: Study) -> list[tuple[str, float, float, float]]:
    """(guessed figure, prediction at the largest point with it x0.5, as given, x2) for every numeric guess."""
    nodes = max(study.published)
    base = study_efficiency(study, workload(study), nodes)
    rows = []
    for name, fig in study.figures():
        if not fig.guessed or SPECS[name].kind is not float:
            continue
        low = study_efficiency(study, workload(study, {name: float(fig.value) * 0.5}), nodes)
        high = study_efficiency(study, workload(study, {name: float(fig.value) * 2}), nodes)
        rows.append((name, low, base, high))
    return rows


def table_rows(points: list[Point] | None = None) -> list[str]:
    """The validation table as Markdown rows: study, system, what ran, nodes, published, predicted, error."""
    rows = []
    for pt in points if points is not None else validate():
        s = pt.study
        rows.append(f"| {s.key} | {s.system} | {s.what} | {pt.nodes} | {pt.published:.3f} | {pt.predicted:.3f} "
                    f"| {pt.error:+.3f} |")
    return rows


def sensitivity_rows() -> list[str]:
    """The sensitivity table as Markdown rows: each guessed figure x0.5 and x2 at each study's largest point."""
    rows = []
    for study in STUDIES:
        for name, low, base, high in sensitivity(study):
            if max(abs(low - base), abs(high - base)) >= 0.005:
                rows.append(f"| {study.key} | {name} | {low:.3f} | {base:.3f} | {high:.3f} |")
    return rows
