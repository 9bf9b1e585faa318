"""Alpha-beta-gamma costs of the collectives a gradient reduction uses, and the algorithm each backend picks.

A message of n bytes between two ranks costs alpha + n*beta; reducing n bytes locally costs n*gamma. The
formulas are the textbook ones (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"); the choice by size follows each library: MPICH takes recursive doubling
up to MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 bytes) and reduce-scatter + allgather (Rabenseifner) above;
torch's gloo backend always asks gloo for its ring; NCCL predicts ring and tree times and takes the faster
(oneCCL, torch's xccl on Intel GPUs, is modelled the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MPICH_SHORT_MSG_BYTES = 2048


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


def allreduce(backend: str, p: int, n: float, link: Link) -> tuple[float, str]:
    """(seconds, algorithm) of an all-reduce of ``n`` bytes over ``p`` ranks as ``backend`` runs it."""
    if p <= 1:
        return 0.0, "none"
    if backend == "mpi":
        if n <= MPICH_SHORT_MSG_BYTES:
            return recursive_doubling_allreduce(p, n, link), "recursive doubling"
        return rabenseifner_allreduce(p, n, link), "reduce-scatter + allgather"
    if backend == "gloo":
        return ring_allreduce(p, n, link), "ring"
    if backend in ("nccl", "xccl"):  # oneCCL (torch's xccl) also picks its algorithm by predicted cost
        ring, tree = ring_allreduce(p, n, link), tree_allreduce(p, n, link)
        return (tree, "tree") if tree < ring else (ring, "ring")
    raise ValueError(f"unknown backend {backend!r}")


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
