"""Alpha-beta-gamma costs of the collectives a gradient reduction uses, and the algorithm each backend picks.

A message of n bytes between two ranks costs alpha + n*beta; reducing n bytes locally costs n*gamma. The
formulas are the textbook ones (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"); the choice by size follows each library: MPICH takes recursive doubling
up to MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 bytes) and reduce-scatter + allgather (Rabenseifner) above;
hpctrain's gloo path runs its own point-to-point all-reduce over every rank (runtime/comm/p2p_allreduce.py: recursive
doubling below 2048 bytes, Rabenseifner above, the same fold), costed round by round (``p2p_allreduce``), with
gloo's own ring (torch's choice) selectable; NCCL predicts ring and tree times and takes the faster
(oneCCL, torch's xccl on Intel GPUs, is modelled the same way), with the latencies of NCCL's own cost model
(``nccl_allreduce``). With several ranks per node every backend reduces hierarchically: within the node
first, then across nodes (``hierarchical_allreduce``); ``--set
allreduce_algorithm=...`` forces the algorithm of the inter-node phase, as NCCL_ALGO or MPICH_ALLREDUCE does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MPICH_SHORT_MSG_BYTES = 2048
# hpctrain's point-to-point all-reduce over gloo (runtime/comm/p2p_allreduce.py, RABENSEIFNER_MIN_BYTES): recursive
# doubling below this many bytes or for fewer elements than the power of two below the rank count, Rabenseifner's
# reduce-scatter + allgather otherwise. Kept here as a number: the planner imports no torch.
P2P_RABENSEIFNER_MIN_BYTES = 2048
FLOAT32_BYTES = 4

# NCCL's own cost model of an all-reduce (src/graph/tuning.cc of NCCL 2.6-2.7, the Simple protocol that carries
# gradient-sized messages): a fixed launch latency per collective (8.4 us for the ring), a latency per step that
# is NCCL's protocol's and not the wire's (a ring step through the network 9.6 us, a tree level through the
# network 50 us: the time to push one 256 kB pipeline chunk), and for a ring across nodes of a message of at
# least P/16 x 64 KiB a factor of 1.9 on the latency ("plateau effect of ring"). A site figure slower than
# NCCL's is kept.
NCCL_RING_BASE_S = 8.4e-6
NCCL_RING_NET_STEP_S = 9.6e-6
NCCL_TREE_NET_STEP_S = 50e-6
NCCL_RING_PLATEAU = 1.9
NCCL_PLATEAU_BYTES_PER_RANK = 65536 / 16


@dataclass(frozen=True)
class Link:
    """Costs between two ranks: alpha (s per message), beta (s per byte sent), gamma (s per byte reduced)."""

    alpha: float
    beta: float
    gamma: float


def _pof2_below(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def ring_allreduce(p: int, n: float, link: Link) -> float:
    """Reduce-scatter then allgather around a ring: 2(p-1) steps of n/p bytes each."""
    if p <= 1:
        return 0.0
    share = (p - 1) / p
    return 2 * (p - 1) * link.alpha + 2 * share * n * link.beta + share * n * link.gamma


def _fold(p: int, n: float, link: Link) -> tuple[int, float]:
    """MPICH's handling of a rank count that is not a power of two: the first 2r ranks pair up (one sends its
    vector to the other, which reduces it) before, and get the result back after; returns (pof2, extra time)."""
    pof2 = _pof2_below(p)
    if pof2 == p:
        return p, 0.0
    return pof2, 2 * (link.alpha + n * link.beta) + n * link.gamma


def recursive_doubling_allreduce(p: int, n: float, link: Link) -> float:
    """log2(p) exchange-and-reduce rounds of the whole vector (short messages)."""
    if p <= 1:
        return 0.0
    pof2, extra = _fold(p, n, link)
    return extra + math.log2(pof2) * (link.alpha + n * (link.beta + link.gamma))


def rabenseifner_allreduce(p: int, n: float, link: Link) -> float:
    """Reduce-scatter by recursive halving, then allgather by recursive doubling (long messages)."""
    if p <= 1:
        return 0.0
    pof2, extra = _fold(p, n, link)
    share = (pof2 - 1) / pof2
    return extra + 2 * math.log2(pof2) * link.alpha + 2 * share * n * link.beta + share * n * link.gamma


def tree_allreduce(p: int, n: float, link: Link) -> float:
    """NCCL's double binary tree, pipelined: a reduce up and a broadcast down the log2(p) levels; each rank
    sends and receives about n bytes per phase across the two trees."""
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * link.alpha + 2 * n * link.beta + n * link.gamma


ALGORITHMS = ("auto", "ring", "tree", "recursive_doubling", "rabenseifner")
_FORCED = {"ring": (ring_allreduce, "ring"), "tree": (tree_allreduce, "tree"),
           "recursive_doubling": (recursive_doubling_allreduce, "recursive doubling"),
           "rabenseifner": (rabenseifner_allreduce, "reduce-scatter + allgather")}


def allreduce(backend: str, p: int, n: float, link: Link, algorithm: str = "auto") -> tuple[float, str]:
    """(seconds, algorithm) of an all-reduce of ``n`` bytes over ``p`` ranks as ``backend`` runs it, or with
    the ``algorithm`` forced (NCCL_ALGO, MPICH_ALLREDUCE / I_MPI_ADJUST_ALLREDUCE, gloo's choice in torch)."""
    if p <= 1:
        return 0.0, "none"
    if algorithm != "auto":
        cost, name = _FORCED[algorithm]
        return cost(p, n, link), name
    if backend == "mpi":
        if n <= MPICH_SHORT_MSG_BYTES:
            return recursive_doubling_allreduce(p, n, link), "recursive doubling"
        return rabenseifner_allreduce(p, n, link), "reduce-scatter + allgather"
    if backend == "gloo":  # hpctrain's point-to-point all-reduce, all ranks on one kind of link
        if p2p_algorithm(p, n) == "rabenseifner":
            return rabenseifner_allreduce(p, n, link), "reduce-scatter + allgather"
        return recursive_doubling_allreduce(p, n, link), "recursive doubling"
    if backend in ("nccl", "xccl"):  # oneCCL (torch's xccl) also picks its algorithm by predicted cost
        ring, tree = ring_allreduce(p, n, link), tree_allreduce(p, n, link)
        return (tree, "tree") if tree < ring else (ring, "ring")
    raise ValueError(f"unknown backend {backend!r}")


def nccl_allreduce(nodes: int, per_node: int, n: float, intra: Link, inter: Link,
                   algorithm: str = "auto") -> tuple[float, str]:
    """NCCL's all-reduce of ``n`` bytes over ``nodes`` x ``per_node`` GPUs, costed as NCCL's tuner costs it.

    Ring: one ring through every GPU, leaving each node once: 2(P-1) steps of n/P bytes, each as slow as the
    slower of the node's internal link and its network; 2(N-1) of the steps cross the network (NCCL's step
    latency there), the others stay inside a node. Tree (across nodes only): a double binary tree of nodes with
    a chain through each node's GPUs, 2 log2(N) network levels. ``auto`` takes the faster, as NCCL does."""
    ranks = nodes * per_node
    if ranks <= 1:
        return 0.0, "none"
    if nodes <= 1:
        seconds, name = allreduce("nccl", ranks, n, intra, algorithm)
        return seconds + (NCCL_RING_BASE_S if name == "ring" else 0.0), name
    net_step = max(inter.alpha, NCCL_RING_NET_STEP_S)
    inter_steps = 2 * (nodes - 1)
    latency = (2 * (ranks - 1) - inter_steps) * intra.alpha + inter_steps * net_step
    if n >= ranks * NCCL_PLATEAU_BYTES_PER_RANK:
        latency *= NCCL_RING_PLATEAU
    share = (ranks - 1) / ranks
    ring = NCCL_RING_BASE_S + latency + 2 * share * n * max(intra.beta, inter.beta) + share * n * inter.gamma
    tree_link = Link(max(inter.alpha, NCCL_TREE_NET_STEP_S), inter.beta, inter.gamma)
    chain = 2 * (per_node - 1) * intra.alpha + 2 * n * intra.beta if per_node > 1 else 0.0
    tree = tree_allreduce(nodes, n, tree_link) + chain
    if algorithm == "ring" or (algorithm == "auto" and ring <= tree):
        return ring, "ring"
    return tree, "tree"


def ring_reduce_scatter(p: int, n: float, link: Link) -> float:
    """Each of ``p`` ranks ends with the sum of its 1/p of the vector: p-1 steps of n/p bytes."""
    if p <= 1:
        return 0.0
    return (p - 1) * (link.alpha + n / p * link.beta) + (p - 1) / p * n * link.gamma


def p2p_algorithm(p: int, n: float, element_size: int = FLOAT32_BYTES) -> str:
    """The algorithm hpctrain's point-to-point all-reduce takes for ``n`` bytes of ``element_size``-byte elements
    on ``p`` ranks: ``recursive doubling`` or ``rabenseifner`` (runtime/comm/p2p_allreduce.py's ``algorithm``)."""
    if n < P2P_RABENSEIFNER_MIN_BYTES or n / element_size < _pof2_below(max(1, p)):
        return "recursive doubling"
    return "rabenseifner"


def p2p_allreduce(nodes: int, per_node: int, n: float, intra: Link, inter: Link,
                  element_size: int = FLOAT32_BYTES) -> tuple[float, str]:
    """hpctrain's gloo all-reduce (runtime/comm/p2p_allreduce.py) of ``n`` bytes over ``nodes`` x ``per_node`` ranks,
    placed node by node as the launchers place them, costed round by round.

    Every rank takes the same rounds at once, each with one partner ``mask`` virtual ranks away. Recursive
    doubling: log2(p') rounds of the whole vector (p' the power of two below p). Rabenseifner: a reduce-scatter
    by recursive halving (the partner p'/2 away first, half the vector, then a quarter ...) and an allgather by
    recursive doubling back. The ranks beyond p' fold into their neighbour first and get the result back
    (2 (alpha + n beta) + n gamma). A round leaves the node when the partner's real distance (mask p / p') is at
    least the ranks per node; then all of the node's ranks cross the network at once and share its bandwidth,
    so a node with several ranks sends the vector over its network several times (no hierarchy)."""
    ranks = nodes * per_node
    if ranks <= 1:
        return 0.0, "none"
    name = p2p_algorithm(ranks, n, element_size)
    pof2 = _pof2_below(ranks)
    shared = Link(inter.alpha, inter.beta * per_node, inter.gamma)

    def link(mask: int) -> Link:
        return intra if nodes <= 1 or mask * ranks / pof2 < per_node else shared

    seconds = 0.0
    if pof2 != ranks:
        fold = link(1)
        seconds += 2 * (fold.alpha + n * fold.beta) + n * fold.gamma
    masks = [1 << k for k in range(pof2.bit_length() - 1)]
    if name == "recursive doubling":
        for mask in masks:
            lk = link(mask)
            seconds += lk.alpha + n * (lk.beta + lk.gamma)
        return seconds, "recursive doubling"
    for mask in masks:  # the reduce-scatter's round at mask m and the allgather's both move n m / p' bytes
        lk = link(mask)
        piece = n * mask / pof2
        seconds += 2 * (lk.alpha + piece * lk.beta) + piece * lk.gamma
    return seconds, "reduce-scatter + allgather"


def gloo_ring_allreduce(nodes: int, per_node: int, n: float, intra: Link, inter: Link) -> tuple[float, str]:
    """gloo's own ring (torch's choice for an all-reduce) through all ``nodes`` x ``per_node`` ranks: 2(p-1)
    steps of n/p bytes; every step moves a piece over every edge of the ring at once, so across nodes each step
    is as slow as the slower of the node's internal link and its network (one rank per node sends out)."""
    ranks = nodes * per_node
    if ranks <= 1:
        return 0.0, "none"
    if nodes <= 1:
        return ring_allreduce(ranks, n, intra), "ring"
    if per_node <= 1:
        return ring_allreduce(ranks, n, inter), "ring"
    slowest = Link(max(intra.alpha, inter.alpha), max(intra.beta, inter.beta), inter.gamma)
    return ring_allreduce(ranks, n, slowest), "ring"


def hierarchical_allreduce(backend: str, nodes: int, per_node: int, n: float, intra: Link, inter: Link,
                           algorithm: str = "auto", element_size: int = FLOAT32_BYTES) -> tuple[float, str]:
    """An all-reduce of ``n`` bytes over ``nodes`` x ``per_node`` ranks that crosses each node's network once.

    MPI (Cray MPICH's SMP-aware allreduce), and gloo with a recursive algorithm forced (as Goyal et al. 2017 ran
    it: an intra-server reduce, recursive halving and doubling between servers, a broadcast) go in three phases: a
    reduce-scatter within each node (each rank then holds the node's sum of its 1/per_node share), an
    all-reduce of each share across the nodes (the node's ranks in parallel, sharing its network bandwidth:
    ``inter`` is one node's link, so its beta is scaled by per_node), an allgather within the node. NCCL (and
    xccl) run a ring through every rank or a tree of nodes (``nccl_allreduce``). A node's network therefore
    carries the gradient once, not once per rank. hpctrain's gloo path is not hierarchical: its point-to-point
    all-reduce (``p2p_allreduce``) or gloo's ring (``gloo_ring_allreduce``) runs over all ranks."""
    if backend in ("nccl", "xccl") and algorithm in ("auto", "ring", "tree"):
        return nccl_allreduce(nodes, per_node, n, intra, inter, algorithm)
    if backend == "gloo" and algorithm == "auto":
        return p2p_allreduce(nodes, per_node, n, intra, inter, element_size)
    if backend == "gloo" and algorithm == "ring":
        return gloo_ring_allreduce(nodes, per_node, n, intra, inter)
    if nodes <= 1:
        return allreduce(backend, per_node, n, intra, algorithm)
    if per_node <= 1:
        return allreduce(backend, nodes, n, inter, algorithm)
    share = n / per_node
    shared = Link(inter.alpha, inter.beta * per_node, inter.gamma)
    across, name = allreduce(backend, nodes, share, shared, algorithm)
    within = ring_reduce_scatter(per_node, n, intra) + allgather(per_node, share, intra)
    return within + across, f"{name} across nodes (within a node: reduce-scatter + allgather)"


def allgather(p: int, m: float, link: Link) -> float:
    """Every rank ends with every rank's ``m`` bytes: ring allgather, (p-1) steps of m bytes."""
    if p <= 1:
        return 0.0
    return (p - 1) * (link.alpha + m * link.beta)


def adasum_exchange(p: int, n: float, link: Link) -> float:
    """hpctrain's Adasum: for a power-of-two rank count, log2(p) pairwise exchanges of the whole vector, each
    followed by the Adasum combination (three passes: two dot products and the weighted sum); otherwise an
    allgather of every rank's vector and the same tree of combinations locally."""
    if p <= 1:
        return 0.0
    if p & (p - 1) == 0:
        return math.log2(p) * (link.alpha + n * link.beta + 3 * n * link.gamma)
    return allgather(p, n, link) + (p - 1) * 3 * n * link.gamma
