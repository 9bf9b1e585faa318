"""Counting every collective and point-to-point call of a Communicator, with the messages its algorithm sends.

``counted(comm)`` wraps a communicator when counting is on (runtime/counting/work_counts.py) and returns it unchanged
when off, so an uncounted run executes no counting code at all. Calls and payload bytes are measured; the messages and
bytes each call sends and receives on this rank are those of the algorithm the back-end documents for that size
(``traffic``): MPI cannot report them, and counts that follow the algorithm are what the scaling table checks.
"""

from __future__ import annotations

from typing import Any

import torch

from hpctrain.runtime.comm import p2p_allgather, p2p_allreduce
from hpctrain.runtime.comm.base import Communicator, Handle
from hpctrain.runtime.counting.work_counts import Traffic, WorkCounts, active

# MPICH's default switch points (MPIR_CVAR_*; Thakur, Rabenseifner & Gropp 2005, and MPICH's coll/ sources).
ALLREDUCE_SHORT = 2048          # recursive doubling up to here, then reduce-scatter + allgather (Rabenseifner)
BCAST_SHORT, BCAST_MIN_PROCS = 12288, 8  # binomial tree below either, else scatter + ring allgather
ALLGATHER_LONG = 524288         # total bytes: recursive doubling (power of two) or Bruck below, ring above


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length()


def _binomial(rank: int, size: int, root: int) -> tuple[bool, int]:
    """(has a parent, number of children) of ``rank`` in MPICH's binomial tree rooted at ``root``."""
    rel = (rank - root) % size
    mask = 1
    while mask < size and not rel & mask:
        mask <<= 1
    children = 0
    mask >>= 1
    while mask > 0:
        if rel + mask < size:
            children += 1
        mask >>= 1
    return rel != 0, children


def _subtree(rank: int, size: int, root: int) -> int:
    """Ranks in ``rank``'s binomial subtree (itself included)."""
    rel = (rank - root) % size
    low = rel & -rel if rel else 1 << _log2_ceil(size)
    return min(low, size - rel)


def _mpich_allreduce(n: int, rank: int, size: int) -> tuple[Traffic, str]:
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    t = Traffic()
    if rank < 2 * rem:  # MPICH folds the ranks beyond a power of two into their neighbours first
        t.sent_messages = t.received_messages = 1
        t.sent_bytes = t.received_bytes = n
        if rank % 2 == 0:
            return t, "folded into a power of two"
    rounds = pof2.bit_length() - 1
    if n <= ALLREDUCE_SHORT:
        moved, messages, name = rounds * n, rounds, "recursive doubling"
    else:
        moved, messages, name = 2 * n * (pof2 - 1) // pof2, 2 * rounds, "reduce-scatter + allgather"
    t.sent_messages += messages
    t.received_messages += messages
    t.sent_bytes += moved
    t.received_bytes += moved
    return t, name


def _mpich_bcast(n: int, rank: int, size: int, root: int) -> tuple[Traffic, str]:
    has_parent, children = _binomial(rank, size, root)
    if n < BCAST_SHORT or size < BCAST_MIN_PROCS:
        return Traffic(sent_messages=children, sent_bytes=children * n, received_messages=int(has_parent),
                       received_bytes=n if has_parent else 0), "binomial tree"
    piece = -(-n // size)  # scatter down the tree, then a ring allgather of the pieces
    below = _subtree(rank, size, root)
    return Traffic(sent_messages=children + size - 1, sent_bytes=(below - 1) * piece + (size - 1) * piece,
                   received_messages=int(has_parent) + size - 1,
                   received_bytes=(below * piece if has_parent else 0) + (size - 1) * piece), "scatter + ring allgather"


def _mpich_allgather(m: int, size: int) -> tuple[Traffic, str]:
    moved = m * (size - 1)
    if m * size < ALLGATHER_LONG:
        name = "recursive doubling" if size & (size - 1) == 0 else "Bruck"
        messages = _log2_ceil(size)
    else:
        name, messages = "ring", size - 1
    return Traffic(sent_messages=messages, sent_bytes=moved, received_messages=messages, received_bytes=moved), name


def _gather_binomial(m: int, rank: int, size: int, root: int) -> tuple[Traffic, str]:
    has_parent, children = _binomial(rank, size, root)
    below = _subtree(rank, size, root)
    return Traffic(sent_messages=int(has_parent), sent_bytes=below * m if has_parent else 0,
                   received_messages=children, received_bytes=(below - 1) * m), "binomial tree"


def _p2p_allreduce(nbytes: int, element_size: int, rank: int, size: int) -> tuple[Traffic, str]:
    count = nbytes // element_size
    name = p2p_allreduce.algorithm(count, element_size, size)
    rounds = p2p_allreduce.schedule(rank, size, count, name)
    return Traffic(sent_messages=sum(r.sends for r in rounds),
                   sent_bytes=element_size * sum(r.send[1] - r.send[0] for r in rounds),
                   received_messages=sum(r.receives for r in rounds),
                   received_bytes=element_size * sum(r.recv[1] - r.recv[0] for r in rounds)), f"p2p {name}"


def _p2p_allgather(nbytes: int, rank: int, size: int) -> tuple[Traffic, str]:
    rounds = p2p_allgather.schedule(rank, [nbytes] * size)
    return Traffic(sent_messages=sum(r.sends for r in rounds), sent_bytes=sum(r.send[1] - r.send[0] for r in rounds),
                   received_messages=sum(r.receives for r in rounds),
                   received_bytes=sum(r.recv[1] - r.recv[0] for r in rounds)), "p2p recursive doubling"


def traffic(backend: str, kind: str, nbytes: int, rank: int, size: int, root: int = 0,
            element_size: int = 1) -> tuple[Traffic, str]:
    """What one call costs ``rank`` of ``size``: messages and bytes sent and received, and the algorithm assumed.

    ``nbytes``: the payload this rank passes (for allgather and gather, one rank's contribution). MPI: MPICH's
    defaults by size. ``p2p``: gloo's all-reduce and all-gather as hpctrain makes them (the schedules of
    runtime/comm/p2p_allreduce.py, for elements of ``element_size`` bytes, and runtime/comm/p2p_allgather.py). gloo: the
    ring torch asks gloo for (all-reduce, allgather), a binomial broadcast, a linear gather (every rank sends to
    the root). nccl and xccl are counted as rings.
    """
    t = Traffic(calls=1, payload_bytes=nbytes)
    if size <= 1:
        return t, "none"
    if kind == "sendrecv":
        t.add(Traffic(sent_messages=1, sent_bytes=nbytes, received_messages=1, received_bytes=nbytes))
        return t, "pairwise"
    if kind == "barrier":
        k = _log2_ceil(size)
        t.add(Traffic(sent_messages=k, received_messages=k))
        return t, "dissemination"
    if backend == "p2p" and kind == "allreduce":
        more, name = _p2p_allreduce(nbytes, element_size, rank, size)
    elif backend == "p2p" and kind == "allgather":
        more, name = _p2p_allgather(nbytes, rank, size)
    elif backend == "mpi":
        if kind == "allreduce":
            more, name = _mpich_allreduce(nbytes, rank, size)
        elif kind == "broadcast":
            more, name = _mpich_bcast(nbytes, rank, size, root)
        elif kind == "allgather":
            more, name = _mpich_allgather(nbytes, size)
        elif kind == "gather":
            more, name = _gather_binomial(nbytes, rank, size, root)
        else:
            raise ValueError(f"unknown collective {kind!r}")
    else:
        ring = size - 1
        if kind == "allreduce":
            moved = 2 * nbytes * ring // size
            more, name = Traffic(sent_messages=2 * ring, sent_bytes=moved, received_messages=2 * ring,
                                 received_bytes=moved), "ring"
        elif kind == "allgather":
            more, name = Traffic(sent_messages=ring, sent_bytes=ring * nbytes, received_messages=ring,
                                 received_bytes=ring * nbytes), "ring"
        elif kind == "broadcast":
            has_parent, children = _binomial(rank, size, root)
            more, name = Traffic(sent_messages=children, sent_bytes=children * nbytes,
                                 received_messages=int(has_parent), received_bytes=nbytes if has_parent else 0), \
                "binomial tree"
        elif kind == "gather":
            is_root = rank == root
            more, name = Traffic(sent_messages=0 if is_root else 1, sent_bytes=0 if is_root else nbytes,
                                 received_messages=ring if is_root else 0,
                                 received_bytes=ring * nbytes if is_root else 0), "linear"
        else:
            raise ValueError(f"unknown collective {kind!r}")
    t.add(more)
    return t, name


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class CountingCommunicator(Communicator):
    """A communicator that counts each call into ``counts`` and then makes it on ``inner``.

    Composite calls of the base class (``allgather_varlen``, ``gather_varlen``) are not forwarded whole: they run
    here, so each collective they are made of is counted as what it is.
    """

    def __init__(self, inner: Communicator, counts: WorkCounts) -> None:
        self._inner, self._counts = inner, counts
        self.rank, self.size, self.local_rank = inner.rank, inner.size, inner.local_rank
        self.backend, self.timeout_s = inner.backend, inner.timeout_s

    def __getattr__(self, name: str) -> Any:  # anything else a back-end offers (device_type, ...)
        return getattr(self._inner, name)

    def _count(self, kind: str, label: str, nbytes: int, root: int = 0, element_size: int = 1) -> None:
        backend = self.backend
        if kind == "allreduce" and getattr(self._inner, "p2p", None) is not None:
            backend = "p2p"
        if kind == "allgather" and getattr(self._inner, "p2p_gather", None) is not None:
            backend = "p2p"
        t, algorithm = traffic(backend, kind, nbytes, self.rank, self.size, root, element_size)
        self._counts.add_traffic(label, t, algorithm, kind)

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        self._count("allreduce", label, _nbytes(tensor), element_size=tensor.element_size())
        return self._inner.allreduce_async_(tensor, op, label)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> torch.Tensor:
        self._count("allreduce", label, _nbytes(tensor), element_size=tensor.element_size())
        return self._inner.allreduce_(tensor, op, label)

    def progress(self) -> None:
        self._inner.progress()

    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        self._count("broadcast", label, _nbytes(tensor), root)
        return self._inner.broadcast_(tensor, root, label)

    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        self._count("allgather", label, _nbytes(tensor))
        return self._inner.allgather(tensor, label)

    def gather(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> list[torch.Tensor] | None:
        self._count("gather", label, _nbytes(tensor), root)
        return self._inner.gather(tensor, root, label)

    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        self._count("sendrecv", label, _nbytes(tensor))
        return self._inner.sendrecv(tensor, peer, label)

    def barrier(self, label: str = "") -> None:
        self._count("barrier", label, 0)
        self._inner.barrier(label)

    def close(self) -> None:
        self._inner.close()

    def abandon(self) -> None:
        self._inner.abandon()


def counted(comm: Communicator) -> Communicator:
    """``comm`` wrapped in a CountingCommunicator when counting is on, else ``comm`` itself."""
    counts = active()
    return CountingCommunicator(comm, counts) if counts is not None else comm
