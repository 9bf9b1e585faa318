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

from hpctrain.errors import ConfigError
from hpctrain.planning import collectives
from hpctrain.planning.collectives import Link
from hpctrain.planning.parameters import Parameters
from hpctrain.planning.stragglers import straggler_delay

# Loss terms in the order they are stacked in tables and plots; "compute" is the useful part.
TERMS = ("compute", "oversubscription", "reduction", "straggler", "overhead", "input", "checkpoint", "startup")
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


def _gamma(p: Parameters, half: bool) -> float:
    gamma = 1.0 / (p.num("reduce_gbps") * 1e9)
    return gamma * p.num("half_gamma_factor") if half else gamma


def _shared_core_alpha(p: Parameters, ranks_per_node: int) -> float:
    """Where ranks share cores (more runnable threads than hardware threads), every message also waits for its
    receiver to get a core again: ``shared_core_latency_us`` per thread beyond one per hardware thread."""
    return (_core_share(p, ranks_per_node) - 1.0) * p.num("shared_core_latency_us") * 1e-6


def node_bandwidth(p: Parameters, nodes: int) -> float:
    """A node's network bandwidth (bytes/s) in a job of ``nodes`` nodes: its NICs' injection bandwidth, cut to
    ``taper`` once the job spans more than ``taper_nodes`` nodes (a fat tree's tapered upper level, a
    dragonfly's global links between groups), so that traffic leaves the group through fewer links."""
    bandwidth = p.num("nics_per_node") * p.num("nic_gbps") * 1e9
    group = p.num("taper_nodes")
    if group > 0 and nodes > group:
        bandwidth *= p.num("taper")
    return bandwidth


def intra_link(p: Parameters, ranks_per_node: int, half: bool) -> Link:
    """Costs between two ranks of one node (shared memory, NVLink, Infinity Fabric)."""
    alpha = p.num("intra_latency_us") * 1e-6 + _shared_core_alpha(p, ranks_per_node)
    return Link(alpha, 1.0 / (p.num("intra_bandwidth_gbps") * 1e9), _gamma(p, half))


def inter_link(p: Parameters, nodes: int, ranks_per_node: int, half: bool) -> Link:
    """Costs between two nodes with the whole node's network bandwidth (hierarchical reduction divides it
    among the node's ranks itself)."""
    alpha = p.num("latency_us") * 1e-6 + _shared_core_alpha(p, ranks_per_node)
    return Link(alpha, 1.0 / node_bandwidth(p, nodes), _gamma(p, half))


def _flat_link(p: Parameters, nodes: int, ranks_per_node: int, half: bool) -> Link:
    """One rank's share of the links when every rank exchanges with every other (Adasum's pairwise exchanges,
    AdaComp's allgather): within a node shared memory; across nodes the node's bandwidth split among its ranks
    (every rank's messages leave the node)."""
    if nodes <= 1:
        return intra_link(p, ranks_per_node, half)
    link = inter_link(p, nodes, ranks_per_node, half)
    bandwidth = min(p.num("intra_bandwidth_gbps") * 1e9, 1.0 / link.beta / ranks_per_node)
    return Link(link.alpha, 1.0 / bandwidth, link.gamma)


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


def _allreduce(p: Parameters, nodes: int, ranks_per_node: int, nbytes: float, half: bool) -> tuple[float, str]:
    return collectives.hierarchical_allreduce(
        str(p.value("backend")), nodes, ranks_per_node, nbytes, intra_link(p, ranks_per_node, half),
        inter_link(p, nodes, ranks_per_node, half), str(p.value("allreduce_algorithm")),
        element_size=2 if half else collectives.FLOAT32_BYTES)


def _bucket_cost(p: Parameters, nodes: int, ranks_per_node: int, nbytes: float) -> tuple[float, str]:
    combiner = p.value("combiner")
    ranks = nodes * ranks_per_node
    launch = p.num("launch_overhead_s")
    if combiner == "adasum":
        link = _flat_link(p, nodes, ranks_per_node, False)
        return collectives.adasum_exchange(ranks, nbytes, link) + launch, "adasum pairwise exchange"
    if combiner == "adacomp":
        link = _flat_link(p, nodes, ranks_per_node, False)
        sent = nbytes * p.num("adacomp_ratio")
        decode = ranks * sent * link.gamma  # every rank scatters every rank's selected elements back
        return collectives.allgather(ranks, sent, link) + decode + launch, "allgather (variable length)"
    if combiner != "mean":  # a registered combiner this model has no cost for is not costed as a mean
        raise ConfigError(f"hpctrain plan has no cost model for combiner {combiner!r}", key="combiner",
                          hint="plan with --set combiner=mean for a bound, or add its cost to planning/model.py")
    if p.value("compression") in ("fp16", "bf16"):
        seconds, algorithm = _allreduce(p, nodes, ranks_per_node, nbytes / 2, True)
        convert = 2 * nbytes * _gamma(p, False)  # to half precision and back
        return seconds + convert + launch, algorithm
    seconds, algorithm = _allreduce(p, nodes, ranks_per_node, nbytes, False)
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
    if p.value("combiner") == "dasgd":
        seconds, algorithm = _allreduce(p, nodes, ranks_per_node, w.grad_bytes, False)
        hidden = p.num("dasgd_delay") * compute_s
        period = max(1.0, p.num("dasgd_period"))
        return max(0.0, seconds - hidden) / period, seconds / period, algorithm
    overlap = p.flag("reduction_overlap") and p.value("combiner") != "adasum"  # Adasum combines the update
    if p.num("fusion_cycle_s") > 0:
        return _cycle_fusion(w, nodes, ranks_per_node, overlap)
    finish = 0.0
    total = 0.0
    algorithm = ""
    last = len(w.buckets) - 1
    for i, bucket in enumerate(w.buckets):
        cost, algorithm = _bucket_cost(p, nodes, ranks_per_node, bucket.nbytes)
        ready = -bucket.lead_s if overlap and i < last else 0.0
        start = max(ready, finish) if i else ready
        finish = start + cost
        total += cost
    return max(0.0, finish), total, algorithm


MAX_CYCLES = 10_000  # cycles costed per step: a cycle shorter than window / MAX_CYCLES is costed as that


def _cycle_fusion(w: Workload, nodes: int, ranks_per_node: int, overlap: bool) -> tuple[float, float, str]:
    """Horovod's tensor fusion (Horovod docs, "Tensor Fusion"): once per ``fusion_cycle_s`` its background thread
    fuses every gradient that is ready, up to ``bucket_mb``, into one all-reduce, and the next cycle starts when
    that is done. Backward produces the gradient evenly across the overlap window (``overlap_window_s``, or the
    first bucket's lead where that is longer), so a slow all-reduce makes the next one larger: the fused size
    adapts to the network. The first tick comes half a cycle after the first gradient, on average."""
    p = w.params
    grad = w.grad_bytes
    lead = max((b.lead_s for b in w.buckets), default=0.0)
    window = max(lead, p.num("overlap_window_s")) if overlap else 0.0
    cycle = max(p.num("fusion_cycle_s"), window / MAX_CYCLES)
    limit = p.num("bucket_mb") * 2**20
    sent = total = 0.0
    finish = -window
    tick = -window - cycle / 2  # the cycle's clock is not backward's: the first tick comes half a cycle in
    algorithm = ""
    while sent < grad:
        tick = max(finish, tick + cycle)
        ready = grad if tick >= 0 or window <= 0 else grad * (tick + window) / window
        while sent < ready:
            nbytes = min(ready - sent, limit)
            cost, algorithm = _bucket_cost(p, nodes, ranks_per_node, nbytes)
            finish = max(finish, tick) + cost
            total += cost
            sent += nbytes
    return max(0.0, finish), total, algorithm


CONTROL_BYTES = 16.0  # the stop vote: two float64 flags


def control_time(p: Parameters, nodes: int, ranks_per_node: int) -> float:
    """The per-step control all-reduces (the stop vote after every step): small, latency-bound, never hidden."""
    ranks = nodes * ranks_per_node
    if ranks <= 1:
        return 0.0
    seconds, _ = _allreduce(p, nodes, ranks_per_node, CONTROL_BYTES, False)
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


def _tail_delay(p: Parameters, nodes: int, ranks: int, compute_s: float) -> float:
    """What the Gaussian spread leaves out: a heavy tail of rare per-rank stalls (OS noise, a page fault
    storm, a collector), each ``hiccup_s`` long with probability ``hiccup_prob`` per rank per step, so a step
    of P ranks waits for one with probability 1 - (1 - q)^P; and slow nodes (a throttled GPU, a bad DIMM):
    a fraction ``slow_node_fraction`` of the machine's nodes computes ``slow_node_slowdown`` slower, and a
    job of N nodes holds at least one with probability 1 - (1 - f)^N."""
    q, f = p.num("hiccup_prob"), p.num("slow_node_fraction")
    stall = p.num("hiccup_s") * -math.expm1(ranks * math.log1p(-q)) if 0 < q < 1 else p.num("hiccup_s") * q
    slow = compute_s * p.num("slow_node_slowdown") * (-math.expm1(nodes * math.log1p(-f)) if f < 1 else 1.0)
    return stall + slow


def checkpoint_time(p: Parameters, nodes: int, ranks_per_node: int) -> float:
    """The checkpoint's share of a step: ``checkpoint_bytes`` written every ``checkpoint_every_steps`` steps
    by one rank through its node's network to the shared file system (hpctrain's ranks wait for the write)."""
    if p.num("checkpoint_bytes") <= 0:
        return 0.0
    rate = min(p.num("filesystem_gbps") * 1e9, p.num("nics_per_node") * p.num("nic_gbps") * 1e9)
    return p.num("checkpoint_bytes") / rate / p.num("checkpoint_every_steps")


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
        "straggler": straggler_delay(math.sqrt(spread), ranks) + _tail_delay(p, nodes, ranks, compute),
        "overhead": p.num("multinode_overhead_s") if nodes > 1 else 0.0,
        "input": input_exposed,
        "checkpoint": checkpoint_time(p, nodes, r),
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
