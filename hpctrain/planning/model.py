"""The step-time model: what one synchronous step costs at N nodes, term by term, from plain numbers.

step(N) = compute (+ the share lost to ranks sharing cores and to a busier node) + the reduction not hidden behind
backward and the stop vote + the straggler wait (expected maximum of the ranks' step times) + a fixed multi-node
overhead + the input time not overlapped; start-up is amortised over the walltime. Efficiency is against one rank
alone on one node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hpctrain.planning import collectives
from hpctrain.planning.collectives import Link
from hpctrain.planning.parameters import Parameters
from hpctrain.planning.stragglers import straggler_delay

# Loss terms in the order they are stacked in tables and plots; "compute" is the useful part.
TERMS = ("compute", "oversubscription", "reduction", "straggler", "overhead", "input", "startup")
LOSS_TERMS = TERMS[1:]


@dataclass(frozen=True)
class BucketTiming:
    """One fused gradient bucket: its bytes and how long before the end of backward it was ready."""

    nbytes: float
    lead_s: float


def even_buckets(grad_bytes: float, bucket_bytes: float, window_s: float) -> tuple[BucketTiming, ...]:
    """The layout when none was measured: buckets of ``bucket_bytes`` ready evenly across the window."""
    if grad_bytes <= 0:
        return ()
    count = max(1, math.ceil(grad_bytes / bucket_bytes))
    sizes = [bucket_bytes] * (count - 1) + [grad_bytes - bucket_bytes * (count - 1)]
    return tuple(BucketTiming(size, window_s * (count - 1 - i) / max(1, count - 1) if count > 1 else 0.0)
                 for i, size in enumerate(sizes))


@dataclass(frozen=True)
class Workload:
    """Everything the model reads: the parameters and the gradient bucket layout (in launch order)."""

    params: Parameters
    buckets: tuple[BucketTiming, ...]

    @property
    def grad_bytes(self) -> float:
        return sum(b.nbytes for b in self.buckets)


@dataclass(frozen=True)
class StepCost:
    """Seconds per step of each term at one scale, and facts about the reduction."""

    nodes: int
    ranks: int
    terms: dict[str, float]
    startup_s: float
    algorithm: str
    reduction_total_s: float

    @property
    def steady_s(self) -> float:
        """Step time without the start-up share."""
        return sum(v for k, v in self.terms.items() if k != "startup")

    @property
    def total_s(self) -> float:
        return sum(self.terms.values())


@dataclass(frozen=True)
class Prediction:
    """What the planner says about one node count."""

    cost: StepCost
    reference: StepCost
    batch_per_rank: int
    losses: dict[str, float]
    advice: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    time_to_target_s: float | None = None

    @property
    def nodes(self) -> int:
        return self.cost.nodes

    @property
    def ranks(self) -> int:
        return self.cost.ranks

    @property
    def step_s(self) -> float:
        return self.cost.steady_s

    @property
    def efficiency(self) -> float:
        """Per-rank throughput against one rank alone, start-up amortised over the walltime."""
        return self.reference.total_s / self.cost.total_s

    @property
    def steady_efficiency(self) -> float:
        """The same without start-up: what a scaling figure of steady-state throughput shows."""
        return self.reference.steady_s / self.cost.steady_s

    @property
    def samples_per_s(self) -> float:
        return self.ranks * self.batch_per_rank / self.cost.total_s

    @property
    def hidden_fraction(self) -> float:
        """The share of the reduction's communication hidden behind backward (1 when there is none)."""
        total = self.cost.reduction_total_s
        return 1.0 - min(1.0, self.cost.terms["reduction"] / total) if total > 0 else 1.0

    @property
    def dominant_loss(self) -> str:
        """The loss term costing most at this scale ('none' when every loss is under 0.5 %)."""
        name, value = max(self.losses.items(), key=lambda kv: kv[1])
        return name if value >= 0.005 else "none"

    def as_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "ranks": self.ranks, "step_s": self.step_s,
            "efficiency": self.efficiency, "steady_efficiency": self.steady_efficiency,
            "samples_per_s": self.samples_per_s, "startup_s": self.cost.startup_s,
            "time_to_target_s": self.time_to_target_s, "dominant_loss": self.dominant_loss,
            "terms_s": dict(self.cost.terms), "losses": dict(self.losses),
            "reduction": {"algorithm": self.cost.algorithm, "total_s": self.cost.reduction_total_s,
                          "exposed_s": self.cost.terms["reduction"], "hidden_fraction": self.hidden_fraction},
            "advice": dict(self.advice), "warnings": list(self.warnings),
        }


# ----------------------------------------------------------------------------------------------------------
# The terms


def _link(p: Parameters, nodes: int, ranks_per_node: int, half: bool) -> Link:
    """Costs between two ranks: shared memory within a node, the network across nodes (its injection
    bandwidth shared by the node's ranks, except under NCCL whose rings cross each node once per NIC).
    Where ranks share cores (more runnable threads than hardware threads), every message also waits for its
    receiver to get a core again: ``shared_core_latency_us`` per thread beyond one per hardware thread."""
    intra_bw = p.num("intra_bandwidth_gbps") * 1e9
    if nodes <= 1:
        alpha, bandwidth = p.num("intra_latency_us") * 1e-6, intra_bw
    else:
        node_bw = p.num("nics_per_node") * p.num("nic_gbps") * 1e9
        per_rank = node_bw if p.value("backend") in ("nccl", "xccl") else node_bw / ranks_per_node
        alpha, bandwidth = p.num("latency_us") * 1e-6, min(intra_bw, per_rank)
    alpha += (_core_share(p, ranks_per_node) - 1.0) * p.num("shared_core_latency_us") * 1e-6
    gamma = 1.0 / (p.num("reduce_gbps") * 1e9)
    if half:
        gamma *= p.num("half_gamma_factor")
    return Link(alpha, 1.0 / bandwidth, gamma)


def _core_share(p: Parameters, ranks_per_node: float) -> float:
    """How much slower a rank computes when the node's ranks x threads, with the other work running there,
    exceed its hardware threads (the scheduler then shares them out evenly)."""
    wanted = ranks_per_node * p.num("threads_per_rank") + p.num("background_load")
    return max(1.0, wanted / max(1.0, p.num("node_threads")))


def _busy_slowdown(p: Parameters, ranks_per_node: float) -> float:
    """How much slower a thread computes with this many of the node's hardware threads busy than alone:
    1 with one busy, 1 / ``all_core_speed`` with all busy (lower clocks, shared caches and memory bandwidth),
    linear in between."""
    threads = max(1.0, p.num("node_threads"))
    busy = min(threads, ranks_per_node * p.num("threads_per_rank") + p.num("background_load"))
    if threads <= 1:
        return 1.0
    return 1.0 + (1.0 / p.num("all_core_speed") - 1.0) * max(0.0, busy - 1.0) / (threads - 1.0)


def _bucket_cost(p: Parameters, ranks: int, nbytes: float, link: Link) -> tuple[float, str]:
    combiner, backend = p.value("combiner"), str(p.value("backend"))
    launch = p.num("launch_overhead_s")
    if combiner == "adasum":
        return collectives.adasum_exchange(ranks, nbytes, link) + launch, "adasum pairwise exchange"
    if combiner == "adacomp":
        sent = nbytes * p.num("adacomp_ratio")
        decode = ranks * sent * link.gamma  # every rank scatters every rank's selected elements back
        return collectives.allgather(ranks, sent, link) + decode + launch, "allgather (variable length)"
    if p.value("compression") in ("fp16", "bf16"):
        seconds, algorithm = collectives.allreduce(backend, ranks, nbytes / 2, link)
        convert = 2 * nbytes * link.gamma / p.num("half_gamma_factor")  # to half precision and back
        return seconds + convert + launch, algorithm
    seconds, algorithm = collectives.allreduce(backend, ranks, nbytes, link)
    return seconds + launch, algorithm


def reduction_time(w: Workload, nodes: int, ranks_per_node: int, compute_s: float) -> tuple[float, float, str]:
    """(exposed seconds per step, total seconds of communication, algorithm) of the gradient reduction.

    Buckets are reduced one after another, each starting when its gradients are ready (``lead_s`` before
    backward ends) and the previous one is done; the last is reduced after backward. Without overlap every
    bucket waits for the end of backward. DaSGD averages the model every ``dasgd_period`` steps and lets the
    average run behind ``dasgd_delay`` steps of compute.
    """
    p = w.params
    ranks = nodes * ranks_per_node
    if ranks <= 1 or not w.buckets:
        return 0.0, 0.0, "none"
    link = _link(p, nodes, ranks_per_node, p.value("compression") in ("fp16", "bf16"))
    if p.value("combiner") == "dasgd":
        seconds, algorithm = collectives.allreduce(str(p.value("backend")), ranks, w.grad_bytes, link)
        hidden = p.num("dasgd_delay") * compute_s
        period = max(1.0, p.num("dasgd_period"))
        return max(0.0, seconds - hidden) / period, seconds / period, algorithm
    overlap = p.flag("reduction_overlap") and p.value("combiner") != "adasum"  # Adasum combines the update
    finish = 0.0
    total = 0.0
    algorithm = ""
    last = len(w.buckets) - 1
    for i, bucket in enumerate(w.buckets):
        cost, algorithm = _bucket_cost(p, ranks, bucket.nbytes, link)
        ready = -bucket.lead_s if overlap and i < last else 0.0
        start = max(ready, finish) if i else ready
        finish = start + cost
        total += cost
    return max(0.0, finish), total, algorithm


CONTROL_BYTES = 16.0  # the stop vote: two float64 flags


def control_time(p: Parameters, nodes: int, ranks_per_node: int) -> float:
    """The per-step control all-reduces (the stop vote after every step): small, latency-bound, never hidden."""
    ranks = nodes * ranks_per_node
    if ranks <= 1:
        return 0.0
    link = _link(p, nodes, ranks_per_node, False)
    seconds, _ = collectives.allreduce(str(p.value("backend")), ranks, CONTROL_BYTES, link)
    return p.num("control_allreduces") * (seconds + p.num("launch_overhead_s"))


def startup_time(p: Parameters, nodes: int, ranks_per_node: int) -> float:
    """Start-up at ``nodes``: the measured one-node start-up, plus what grows with the node count: every rank
    opening the environment's files on the shared file system (or a broadcast of the staged environment), and
    every rank reading the whole input stream when the input is not sharded."""
    ranks = nodes * ranks_per_node
    extra_ranks = max(0.0, ranks - p.num("calibration_ranks_per_node"))
    fs = p.num("filesystem_gbps") * 1e9
    seconds = p.num("startup_s")
    if p.flag("startup_staged"):
        if nodes > 1:
            node_bw = p.num("nics_per_node") * p.num("nic_gbps") * 1e9
            levels = math.ceil(math.log2(nodes))
            seconds += p.num("env_bytes") / fs + levels * (p.num("latency_us") * 1e-6 + p.num("env_bytes") / node_bw)
    else:
        seconds += extra_ranks * p.num("env_files") / p.num("metadata_ops_per_s")
    if p.value("input_sharding") == "whole":
        seconds += extra_ranks * p.num("stream_bytes") / fs
    return seconds


def step_cost(w: Workload, nodes: int, ranks_per_node: int | None = None) -> StepCost:
    """Every term of one step at ``nodes`` nodes of ``ranks_per_node`` ranks (default: the job's)."""
    p = w.params
    r = int(ranks_per_node if ranks_per_node is not None else p.num("ranks_per_node"))
    ranks = nodes * r
    calibrated = p.num("calibration_ranks_per_node")
    share = (_core_share(p, r) * _busy_slowdown(p, r)) / (_core_share(p, calibrated) * _busy_slowdown(p, calibrated))
    compute = p.num("compute_s") * share
    exposed, total, algorithm = reduction_time(w, nodes, r, compute)
    exposed += control_time(p, nodes, r)

    per_step_records = (ranks - 1) * p.num("batch_per_rank") if p.value("input_sharding") == "whole" else 0.0
    reading = p.num("input_s") + per_step_records * p.num("record_s")
    if p.num("input_bytes") > 0:
        reading = max(reading, ranks * p.num("input_bytes") / (p.num("filesystem_gbps") * 1e9))
    input_exposed = max(0.0, reading - compute) if p.flag("input_overlap") else reading

    # per-step noise, and how far apart the ranks' own speeds sit for the whole run (slow cores, slow nodes)
    spread = (p.num("compute_std_s") * share) ** 2 + (p.num("rank_speed_spread") * compute) ** 2
    if not p.flag("input_overlap"):
        spread += p.num("input_std_s") ** 2
    terms = {
        "compute": p.num("compute_s"),
        "oversubscription": compute - p.num("compute_s"),
        "reduction": exposed,
        "straggler": straggler_delay(math.sqrt(spread), ranks),
        "overhead": p.num("multinode_overhead_s") if nodes > 1 else 0.0,
        "input": input_exposed,
    }
    startup = startup_time(p, nodes, r)
    walltime = p.num("walltime_s")
    steady = sum(terms.values())
    # Start-up is paid once per job: a job of `walltime` seconds trains for walltime - startup of them.
    terms["startup"] = steady * startup / (walltime - startup) if startup < walltime else math.inf
    return StepCost(nodes, ranks, terms, startup, algorithm, total)


def losses(cost: StepCost, reference: StepCost) -> dict[str, float]:
    """Each loss term's share of the step at this scale, beyond what one rank alone pays for it."""
    total = cost.total_s
    if not math.isfinite(total):
        return {k: (1.0 if k == "startup" else 0.0) for k in LOSS_TERMS}
    out = {}
    for k in LOSS_TERMS:
        out[k] = max(0.0, cost.terms[k] - reference.terms[k]) / total
    return out


def steps_for(target_samples: float | None, target_steps: float | None, ranks: int, batch: int) -> float | None:
    """Steps to reach a number of samples (across all ranks) or a number of steps."""
    if target_steps is not None:
        return float(target_steps)
    if target_samples is not None:
        return math.ceil(target_samples / (ranks * batch))
    return None


def time_to_target(cost: StepCost, steps: float, walltime_s: float) -> float:
    """Wall time to run ``steps`` steps in jobs of ``walltime_s``, each paying the start-up again."""
    useful = walltime_s - cost.startup_s
    if useful <= 0 or not math.isfinite(cost.steady_s):
        return math.inf
    training = steps * cost.steady_s
    jobs = max(1, math.ceil(training / useful))
    return training + jobs * cost.startup_s


def predict(w: Workload, nodes: int, *, target_samples: float | None = None,
            target_steps: float | None = None) -> Prediction:
    """The prediction at ``nodes`` nodes (advice and warnings are added by ``advice.annotate``)."""
    cost = step_cost(w, nodes)
    reference = step_cost(w, 1, 1)
    batch = int(w.params.num("batch_per_rank"))
    steps = steps_for(target_samples, target_steps, cost.ranks, batch)
    when = time_to_target(cost, steps, w.params.num("walltime_s")) if steps is not None else None
    return Prediction(cost, reference, batch, losses(cost, reference), time_to_target_s=when)
