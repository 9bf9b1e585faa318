"""The Communicator contract every back-end fills in, the single-process one, and how a failure on one rank
reaches the others (``agree``) with its exit code.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.exit_codes import EXIT_ERROR

OPS = ("sum", "max", "min", "mean")


class Handle:
    """An in-flight collective; ``wait()`` blocks until it is done (and re-raises its error, if any)."""

    def __init__(self, wait: Callable[[], None]) -> None:
        self._wait = wait
        self._done = False

    def wait(self) -> None:
        if not self._done:
            self._wait()
            self._done = True


class Communicator(ABC):
    """What the reducer and trainer need from a back-end. Tensors are reduced in place."""

    rank: int
    size: int
    local_rank: int
    backend: str
    timeout_s: float

    @abstractmethod
    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        """Start an in-place all-reduce of ``tensor``; the result is valid after ``handle.wait()``."""

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> torch.Tensor:
        self.allreduce_async_(tensor, op, label).wait()
        return tensor

    def progress(self) -> None:
        """Give in-flight asynchronous collectives a chance to advance (back-ends that need a poke)."""
        return None

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        """Overwrite ``tensor`` on every rank with root's."""

    @abstractmethod
    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype everywhere), indexed by rank."""

    @abstractmethod
    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        """Send ``tensor`` to ``peer`` and return the same-shaped tensor ``peer`` sent back."""

    @abstractmethod
    def barrier(self, label: str = "") -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def abandon(self) -> None:
        """Leave after an error on this rank, instead of ``close``: no collective (the other ranks may be anywhere,
        or gone), only this rank's own threads and resources are let go."""
        return None

    def agree(self, error: BaseException | None, label: str = "") -> None:
        """Collective: every rank says whether its step (``error``: None when it went well) failed. When one did,
        every rank raises: the lowest failing rank its own exception, the others ``RankFailure`` with its line
        and exit code, so the job ends with that rank's error on every rank, the group intact, instead of the
        others waiting in a collective the failed rank never joins."""
        _agree(self, error, label)

    def allgather_varlen(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        """All-gather of 1-D tensors whose lengths differ per rank (sparse AdaComp messages), on their device."""
        n = torch.tensor([tensor.numel()], dtype=torch.int64, device=tensor.device)
        lengths = [int(t) for t in self.allgather(n, label=f"{label} lengths".strip())]
        padded = torch.zeros(max(lengths), dtype=tensor.dtype, device=tensor.device)
        padded[: tensor.numel()] = tensor.reshape(-1)
        return [t[:k] for t, k in zip(self.allgather(padded, label=label), lengths, strict=True)]

    def gather(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape and dtype) on ``root``, indexed by rank; None on the others.

        This default all-gathers (every rank receives everything); MPI and torch.distributed send to the root only.
        """
        got = self.allgather(tensor, label)
        return got if self.rank == root else None

    def gather_varlen(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> list[torch.Tensor] | None:
        """``gather`` of 1-D tensors whose lengths differ per rank: the longest length is agreed by an
        all-reduce, then one fixed-size gather carries each rank's length (8 bytes) and its padded bytes."""
        data = tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8)
        longest = torch.tensor([data.numel()], dtype=torch.int64)
        self.allreduce_(longest, "max", f"{label} length".strip())
        padded = torch.zeros(8 + int(longest[0]), dtype=torch.uint8)
        padded[:8] = torch.tensor([data.numel()], dtype=torch.int64).view(torch.uint8)
        padded[8:8 + data.numel()] = data
        got = self.gather(padded, root, label)
        if got is None:
            return None
        sizes = [int(g[:8].clone().view(torch.int64)[0]) for g in got]
        return [g[8:8 + k].clone().view(tensor.dtype).to(tensor.device) for g, k in zip(got, sizes, strict=True)]

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_op(op: str) -> None:
    if op not in OPS:
        raise ConfigError(f"unknown reduction op {op!r}", key="op", hint=f"use one of {', '.join(OPS)}")


def log_line(msg: str) -> None:
    print(f"hpctrain: {msg}", file=sys.stderr, flush=True)


class SingleProcessCommunicator(Communicator):
    """size 1: every collective is the identity. For laptop runs and unit tests of the trainer."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.rank, self.size, self.local_rank, self.backend, self.timeout_s = 0, 1, 0, "none", timeout_s

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        check_op(op)
        return Handle(lambda: None)

    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        return tensor

    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        return [tensor.clone()]

    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        return tensor.clone()

    def barrier(self, label: str = "") -> None:
        return None

    def close(self) -> None:
        return None


# ------------------------------------------------------------------------------------ failures on a rank

AGREE_MAX_BYTES = 4096  # of a failed rank's line sent to the others (the failure note keeps 400 characters)


class RankFailure(HpctrainError):
    """Another rank's error, received through ``Communicator.agree``: this rank stops with the same line.

    ``line`` is that rank's failure line as ``failure_text`` writes it ("rank 0: ..."); the exit code is that
    rank's own, so every rank of the job exits the same way.
    """

    def __init__(self, origin: int, line: str, exit_code: int) -> None:
        self.origin, self.line = origin, line
        super().__init__(line)
        self.exit_code = exit_code


def failure_text(rank: int | str, exc: BaseException) -> str:
    """The line that names a failed rank and its error: what the rank prints and what the failure note holds."""
    if isinstance(exc, RankFailure):
        return exc.line
    if isinstance(exc, HpctrainError):
        return f"rank {rank}: {exc}"
    return f"rank {rank} failed: {type(exc).__name__}: {exc}"


def failure_exit_code(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, HpctrainError) else EXIT_ERROR


# What torch.distributed's back-ends (gloo's TCP transport, the TCPStore) raise on a rank whose peer went away.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "failed to recv, got 0 bytes", "Socket Timeout", "Timed out waiting", "ECONNRESET", "EPIPE",
              "gloo/transport")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a consequence of another rank's failure (a collective broken by a dead or departed peer,
    an MPI error) rather than this rank's own: such an error is the run's reason only when nothing better is
    known (submission/failure.py, ``PEER``)."""
    if isinstance(exc, HpctrainError):
        return False
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(exc, mpi.Exception):
        return True
    dist = sys.modules.get("torch.distributed")
    network = tuple(getattr(dist, n) for n in ("DistNetworkError", "DistStoreError") if hasattr(dist, n))
    if network and isinstance(exc, network):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, OSError)) and any(p in text for p in _PEER_GONE)


def _agree(comm: Communicator, error: BaseException | None, label: str) -> None:
    if comm.size == 1:
        if error is not None:
            raise error
        return
    line = b"" if error is None else failure_text(comm.rank, error).encode()[:AGREE_MAX_BYTES]
    code = 0 if error is None else failure_exit_code(error)
    # One all-reduce finds the lowest failing rank (O(log N) messages; every rank picks the same one); only when
    # one failed does it broadcast its line's length, exit code and text.
    lowest = torch.tensor([comm.rank if error is not None else comm.size], dtype=torch.int64)
    comm.allreduce_(lowest, "min", f"{label} outcome".strip())
    origin = int(lowest[0])
    if origin == comm.size:
        return
    meta = torch.tensor([len(line), code], dtype=torch.int64)
    comm.broadcast_(meta, origin, f"{label} outcome".strip())
    length = int(meta[0])
    text = torch.zeros(max(1, length), dtype=torch.uint8)
    if comm.rank == origin:
        text[:length] = torch.frombuffer(bytearray(line), dtype=torch.uint8)
    comm.broadcast_(text, origin, f"{label} error".strip())
    if comm.rank == origin:
        assert error is not None
        raise error
    received = bytes(text[:length].tolist()).decode("utf-8", "replace")
    raise RankFailure(origin, received, int(meta[1])) from error
