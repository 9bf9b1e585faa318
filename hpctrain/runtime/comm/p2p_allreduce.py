"""An all-reduce made of point-to-point messages, O(log N) of them per rank: recursive doubling for small buffers,
Rabenseifner's reduce-scatter (recursive halving) + all-gather (recursive doubling) for large ones, and the standard
fold where N is not a power of two (Thakur, Rabenseifner & Gropp 2005; MPICH's ``MPIR_Allreduce_intra_*``).

``schedule`` is pure: the rounds one rank takes part in, each with its one peer, the element range it sends and the
one it receives. ``run`` carries a schedule out over a ``Transport`` (torch.distributed's isend/irecv in the
runtime). Every element is combined as ``op(lower half's value, upper half's value)`` on both sides of a pair, and
the all-gather copies, so every rank ends with the same bits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

OPS = ("sum", "max", "min")
# Below this many bytes (or fewer elements than ranks) recursive doubling sends the whole buffer log2 N times;
# above it the halving and doubling send about 2 (N-1)/N of it. MPICH's default switch point.
RABENSEIFNER_MIN_BYTES = 2048


@dataclass(frozen=True)
class Round:
    """One exchange with ``peer``: send elements ``send`` and receive elements ``recv`` (half-open ranges; empty
    ranges are not sent). ``reduce``: combine what arrives into ``recv``'s range (else copy it there);
    ``mine_first``: this rank's value is the left operand (it holds the lower half of the pair)."""

    peer: int
    send: tuple[int, int]
    recv: tuple[int, int]
    reduce: bool
    mine_first: bool

    @property
    def sends(self) -> bool:
        return self.send[1] > self.send[0]

    @property
    def receives(self) -> bool:
        return self.recv[1] > self.recv[0]


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def algorithm(count: int, element_size: int, size: int) -> str:
    """``recursive doubling`` or ``rabenseifner`` for ``count`` elements of ``element_size`` bytes on ``size``
    ranks (every rank decides alike from the same shape)."""
    p2 = _pow2_floor(size)
    if count * element_size < RABENSEIFNER_MIN_BYTES or count < p2:
        return "recursive doubling"
    return "rabenseifner"


def schedule(rank: int, size: int, count: int, kind: str) -> list[Round]:
    """The rounds ``rank`` of ``size`` takes, in order, to all-reduce ``count`` elements with ``kind``
    (``recursive doubling`` or ``rabenseifner``)."""
    return list(planned(rank, size, count, kind))


@functools.lru_cache(maxsize=1024)
def planned(rank: int, size: int, count: int, kind: str) -> tuple[Round, ...]:
    """``schedule``, made once per shape: a training step all-reduces the same few bucket sizes every time."""
    return tuple(_schedule(rank, size, count, kind))


def _schedule(rank: int, size: int, count: int, kind: str) -> list[Round]:
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside 0..{size - 1}")
    if size == 1 or count == 0:
        return []
    whole = (0, count)
    p2 = _pow2_floor(size)
    rem = size - p2
    # The fold: of the first 2 rem ranks each even one hands its buffer to the odd one above it and waits for
    # the result; the others take virtual ranks 0 .. p2 - 1.
    if rank < 2 * rem and rank % 2 == 0:
        return [Round(rank + 1, whole, (0, 0), True, True), Round(rank + 1, (0, 0), whole, False, False)]
    rounds: list[Round] = []
    if rank < 2 * rem:
        rounds.append(Round(rank - 1, (0, 0), whole, True, False))
        v = rank // 2
    else:
        v = rank - rem

    def real(w: int) -> int:
        return 2 * w + 1 if w < rem else w + rem

    if kind == "recursive doubling":
        mask = 1
        while mask < p2:
            w = v ^ mask
            rounds.append(Round(real(w), whole, whole, True, v < w))
            mask <<= 1
    elif kind == "rabenseifner":
        bounds = [b * count // p2 for b in range(p2 + 1)]
        lo, hi = 0, p2  # the blocks this rank still reduces
        mask = p2 >> 1
        while mask:
            w = v ^ mask
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if v < w else ((mid, hi), (lo, mid))
            rounds.append(Round(real(w), (bounds[give[0]], bounds[give[1]]), (bounds[keep[0]], bounds[keep[1]]),
                                True, v < w))
            lo, hi = keep
            mask >>= 1
        mask = 1
        while mask < p2:
            w = v ^ mask
            mine, theirs = v & ~(mask - 1), w & ~(mask - 1)
            rounds.append(Round(real(w), (bounds[mine], bounds[mine + mask]),
                                (bounds[theirs], bounds[theirs + mask]), False, v < w))
            mask <<= 1
    else:
        raise ValueError(f"unknown all-reduce algorithm {kind!r}")
    if rank < 2 * rem:
        rounds.append(Round(rank - 1, whole, (0, 0), False, False))
    return rounds


class Work(Protocol):
    def wait(self) -> object: ...


class Transport(Protocol):
    """Point-to-point sends and receives of contiguous 1-D tensors, matched by peer and tag."""

    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Work: ...

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Work: ...


@dataclass
class Tally:
    """What the all-reduces of one rank sent and received, counted as they are posted."""

    calls: int = 0
    sent_messages: int = 0
    received_messages: int = 0
    sent_bytes: int = 0
    received_bytes: int = 0
    peers: set[int] = field(default_factory=set)


_COMBINE: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}


def run(flat: torch.Tensor, op: str, rank: int, size: int, transport: Transport, tag: int,
        tally: Tally | None = None, rounds: Sequence[Round] | None = None,
        scratch: Scratch | None = None) -> torch.Tensor:
    """All-reduce the contiguous 1-D ``flat`` in place with ``op`` over ``transport``; ``tag`` tells this
    all-reduce's messages from any other in flight between the same ranks (every rank passes the same).
    ``scratch``: where reduced rounds receive (kept between calls by the caller, so a large buffer's pages are not
    allocated and faulted in again on every call)."""
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}: use one of {', '.join(OPS)}")
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError("the p2p all-reduce takes a contiguous 1-D tensor")
    if rounds is None:
        rounds = planned(rank, size, flat.numel(), algorithm(flat.numel(), flat.element_size(), size))
    return execute(flat, rounds, transport, tag, tally, _COMBINE[op], scratch)


class Scratch:
    """A receive buffer reused across calls by one thread: grown to the largest round it has served."""

    def __init__(self) -> None:
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def take(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = count * torch.empty(0, dtype=dtype).element_size()
        if self._buffer.numel() < nbytes:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self._buffer[:nbytes].view(dtype)


def execute(flat: torch.Tensor, rounds: Sequence[Round], transport: Transport, tag: int, tally: Tally | None,
            combine: Callable[..., torch.Tensor] | None, scratch: Scratch | None = None) -> torch.Tensor:
    """Carry ``rounds`` out on ``flat``: a round that copies receives straight into its range of ``flat`` (a
    round never sends from the range it receives into); one that reduces receives beside it and combines."""
    item = flat.element_size()
    if tally is not None:
        tally.calls += 1
    for r in rounds:
        works = []
        got = None
        if r.receives:
            n = r.recv[1] - r.recv[0]
            if r.reduce:
                got = scratch.take(n, flat.dtype) if scratch is not None else torch.empty(n, dtype=flat.dtype)
                works.append(transport.irecv(got, r.peer, tag))
            else:
                works.append(transport.irecv(flat[r.recv[0]:r.recv[1]], r.peer, tag))
        if r.sends:
            works.append(transport.isend(flat[r.send[0]:r.send[1]], r.peer, tag))
        for w in works:
            w.wait()
        if tally is not None:
            tally.peers.add(r.peer)
            tally.sent_messages += r.sends
            tally.received_messages += r.receives
            tally.sent_bytes += (r.send[1] - r.send[0]) * item
            tally.received_bytes += (r.recv[1] - r.recv[0]) * item
        if got is None:
            continue
        if combine is None:
            raise ValueError("a round that reduces needs an op")
        mine = flat[r.recv[0]:r.recv[1]]
        if r.mine_first:
            combine(mine, got, out=mine)
        else:
            combine(got, mine, out=mine)
    return flat
