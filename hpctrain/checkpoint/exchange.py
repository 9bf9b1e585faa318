"""How the checkpoint store's ranks agree: the ``Exchange`` collectives on small JSON-able objects, over one
all-gather callable (tests, one rank) or over an hpctrain ``Communicator`` (O(log N) messages a rank).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import torch

Gather = Callable[[Any], list[Any]]


class Exchange(Protocol):
    """The collectives a multi-rank store needs, on small JSON-able objects; every rank calls them in order."""

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any."""

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (indexed by rank), None on the others."""

    def bcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""

    def sum(self, values: list[int]) -> list[int]:
        """The element-wise sum of every rank's ``values`` (non-negative, same length) on every rank."""


class AllgatherExchange:
    """An Exchange from one all-gather callable (mpi4py's ``comm.allgather``, or one rank alone): every rank
    receives everything, which is fine for tests and small jobs; ``comm_exchange`` sends to rank 0 only."""

    def __init__(self, gather: Gather, rank: int) -> None:
        self._gather, self._rank = gather, rank

    def any(self, flag: bool) -> bool:
        return any(self._gather(bool(flag)))

    def gather(self, obj: Any) -> list[Any] | None:
        got = self._gather(obj)
        return got if self._rank == 0 else None

    def bcast(self, obj: Any) -> Any:
        return self._gather(obj)[0]

    def sum(self, values: list[int]) -> list[int]:
        return [sum(column) for column in zip(*self._gather(list(values)), strict=True)]


def single_gather(obj: Any) -> list[Any]:
    """The all-gather of a run of one rank."""
    return [obj]


def received_bytes(exchange: Exchange) -> int:
    """What ``exchange`` has delivered to this rank so far (0 for an exchange that does not count)."""
    return int(getattr(exchange, "received_bytes", 0))


class CommExchange:
    """The store's Exchange over an hpctrain ``Communicator``: all-reduces, a gather to rank 0 and a broadcast,
    each O(log N) messages for a rank (MPI); rank 0 alone receives the records (JSON bytes).
    ``received_bytes``: what the gathers and sums delivered to this rank, padding included."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.received_bytes = 0

    def sum(self, values: list[int]) -> list[int]:
        total = torch.tensor(values, dtype=torch.int64)
        self.comm.allreduce_(total, "sum", "checkpoint node files")
        self.received_bytes += total.numel() * total.element_size()
        return [int(v) for v in total]

    def any(self, flag: bool) -> bool:
        vote = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
        self.comm.allreduce_(vote, "max", "checkpoint agree")
        return bool(vote[0] > 0)

    def gather(self, obj: Any) -> list[Any] | None:
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        longest = torch.tensor([data.numel()], dtype=torch.int64)
        self.comm.allreduce_(longest, "max", "checkpoint records length")
        padded = torch.zeros(8 + int(longest[0]), dtype=torch.uint8)
        padded[:8] = torch.tensor([data.numel()], dtype=torch.int64).view(torch.uint8)
        padded[8:8 + data.numel()] = data
        got = self.comm.gather(padded, 0, "checkpoint records")
        if got is None:
            return None
        self.received_bytes += sum(g.numel() for g in got)
        sizes = [int(g[:8].clone().view(torch.int64)[0]) for g in got]
        return [json.loads(g[8:8 + k].numpy().tobytes()) for g, k in zip(got, sizes, strict=True)]

    def bcast(self, obj: Any) -> Any:
        text = json.dumps(obj).encode() if self.comm.rank == 0 else b""
        size = torch.tensor([len(text)], dtype=torch.int64)
        self.comm.broadcast_(size, 0, "checkpoint outcome length")
        data = torch.zeros(int(size[0]), dtype=torch.uint8)
        if self.comm.rank == 0:
            data[:] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.comm.broadcast_(data, 0, "checkpoint outcome")
        return json.loads(data.numpy().tobytes())
