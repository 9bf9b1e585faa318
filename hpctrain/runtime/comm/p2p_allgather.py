"""An all-gather made of point-to-point messages, O(log N) of them per rank: recursive doubling over the ranks'
blocks laid out in rank order, and the all-reduce's fold where N is not a power of two (runtime/comm/p2p_allreduce.py),
so the two collectives use the same pairs of ranks and a lazily connected group opens no others.

Blocks may differ in length. ``schedule`` is pure: the rounds of runtime/comm/p2p_allreduce.py (none reduces), element
ranges of the output buffer that holds every rank's block in rank order. Each rank receives exactly the N - 1
blocks it does not hold, once, straight into their place, so every rank ends with the same bits.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from hpctrain.runtime.comm.p2p_allreduce import Round, Tally, Transport, execute


def offsets(counts: Sequence[int]) -> list[int]:
    """Where each rank's block starts in the output, and (last) the output's length."""
    out = [0]
    for c in counts:
        if c < 0:
            raise ValueError(f"negative block length {c}")
        out.append(out[-1] + c)
    return out


def schedule(rank: int, counts: Sequence[int]) -> list[Round]:
    """The rounds ``rank`` takes to all-gather blocks of ``counts[r]`` elements (one per rank) into a buffer in
    rank order. With ``p`` the largest power of two <= N and ``rem = N - p``: each even rank below ``2 rem`` hands
    its block to the odd rank above it and later receives everything else from it; the other ``p`` ranks run
    recursive doubling, virtual rank ``w`` holding the blocks of ranks ``2w, 2w + 1`` (w < rem) or ``w + rem``."""
    size = len(counts)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside 0..{size - 1}")
    off = offsets(counts)
    if size == 1:
        return []
    total = off[-1]
    p2 = 1 << (size.bit_length() - 1)
    rem = size - p2
    empty = (0, 0)
    if rank < 2 * rem and rank % 2 == 0:
        peer = rank + 1
        return [Round(peer, (off[rank], off[rank + 1]), empty, False, True),
                Round(peer, empty, (0, off[rank]), False, True),
                Round(peer, empty, (off[rank + 1], total), False, True)]

    def first(w: int) -> int:  # the lowest real rank whose block virtual rank w holds
        return 2 * w if w < rem else w + rem

    def span(w: int, mask: int) -> tuple[int, int]:
        """The elements of the blocks of virtual ranks w .. w + mask - 1 (w a multiple of mask)."""
        return off[first(w)], off[first(w + mask)] if w + mask < p2 else total

    def real(w: int) -> int:
        return 2 * w + 1 if w < rem else w + rem

    rounds: list[Round] = []
    if rank < 2 * rem:
        rounds.append(Round(rank - 1, empty, (off[rank - 1], off[rank]), False, False))
        v = rank // 2
    else:
        v = rank - rem
    mask = 1
    while mask < p2:
        w = v ^ mask
        rounds.append(Round(real(w), span(v & ~(mask - 1), mask), span(w & ~(mask - 1), mask), False, v < w))
        mask <<= 1
    if rank < 2 * rem:
        e = rank - 1
        rounds.append(Round(e, (0, off[e]), empty, False, False))
        rounds.append(Round(e, (off[e + 1], total), empty, False, False))
    return rounds


def run(blocks_out: torch.Tensor, counts: Sequence[int], rank: int, transport: Transport, tag: int,
        tally: Tally | None = None) -> torch.Tensor:
    """All-gather into the contiguous 1-D ``blocks_out`` (``sum(counts)`` elements, this rank's own block already
    in its place) over ``transport``; ``tag`` as for the all-reduce (every rank passes the same)."""
    if blocks_out.dim() != 1 or not blocks_out.is_contiguous():
        raise ValueError("the p2p all-gather fills a contiguous 1-D tensor")
    if blocks_out.numel() != sum(counts):
        raise ValueError(f"the output holds {blocks_out.numel()} elements, the blocks {sum(counts)}")
    return execute(blocks_out, _planned(rank, tuple(counts)), transport, tag, tally, None)


@functools.lru_cache(maxsize=256)
def _planned(rank: int, counts: tuple[int, ...]) -> tuple[Round, ...]:
    return tuple(schedule(rank, counts))


def allgather(mine: torch.Tensor, counts: Sequence[int], rank: int, transport: Transport, tag: int,
              tally: Tally | None = None) -> list[torch.Tensor]:
    """Every rank's 1-D block (``counts[r]`` elements of ``mine``'s dtype, ``mine`` this rank's), in rank order:
    views of one buffer, moved as bytes (any dtype)."""
    if mine.numel() != counts[rank]:
        raise ValueError(f"rank {rank}'s block has {mine.numel()} elements, counts say {counts[rank]}")
    item = mine.element_size()
    off = offsets(counts)
    out = torch.empty(off[-1] * item, dtype=torch.uint8)
    out[off[rank] * item:off[rank + 1] * item] = mine.detach().reshape(-1).contiguous().view(torch.uint8)
    run(out, [c * item for c in counts], rank, transport, tag, tally)
    typed = out.view(mine.dtype) if item > 0 else out
    return [typed[off[r]:off[r + 1]] for r in range(len(counts))]
