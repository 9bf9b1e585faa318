"""One Communicator interface over MPI (mpi4py) and torch.distributed (gloo on CPU; nccl on NVIDIA and, as RCCL,
AMD GPUs; xccl on Intel GPUs, see runtime/devices.py).

Every collective is numbered and watched: if it does not complete within ``timeout_s`` the job aborts with
a message naming the rank(s) that never arrived. The ranks are asked only after the timeout, over a side
channel their watchdog (or liveness listener) threads answer, so the fast path carries no per-collective
bookkeeping message and no per-tick request (runtime/liveness.py).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import zlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from hpctrain.errors import ConfigError, HpctrainError, RuntimeFailure
from hpctrain.exit_codes import EXIT_ERROR
from hpctrain.launch_env import LaunchEnv, detect_launch_env, scheduler_job_id, scheduler_nodes
from hpctrain.runtime import net_interface, store_counts
from hpctrain.runtime.devices import DEVICE_TYPE, make_current, on_device, pick_device, require_device_backend
from hpctrain.runtime.exchange_store import ExchangeStore, mpi_exchange, store_exchange
from hpctrain.runtime.gloo_allreduce import GlooAllreduce, Job
from hpctrain.runtime.liveness import MPIQueries, StoreQueries, grace_s
from hpctrain.runtime.mpi_env import import_mpi
from hpctrain.runtime.watchdog import Pending, Watchdog

BACKENDS = ("mpi", "gloo", "nccl", "xccl", "none")
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


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ConfigError(f"unknown reduction op {op!r}", key="op", hint=f"use one of {', '.join(OPS)}")


def _log(msg: str) -> None:
    print(f"hpctrain: {msg}", file=sys.stderr, flush=True)


def _missing_message(missing: list[int], pending: Pending, timeout_s: float) -> str:
    if not missing:
        return f"every rank arrived at {pending.describe()} but it did not complete within {timeout_s:g} s"
    who = ", ".join(f"rank {r}" for r in missing)
    return f"{who} did not arrive at {pending.describe()} within {timeout_s:g} s"


class SingleProcessCommunicator(Communicator):
    """size 1: every collective is the identity. For laptop runs and unit tests of the trainer."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.rank, self.size, self.local_rank, self.backend, self.timeout_s = 0, 1, 0, "none", timeout_s

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        _check_op(op)
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


# ----------------------------------------------------------------------------------------------- MPI

def _late_message(behind: list[int], silent: list[int], pending: Pending, timeout_s: float) -> str:
    msg = _missing_message(behind, pending, timeout_s)
    if silent:
        msg += "; " + ", ".join(f"rank {r}" for r in silent) + " did not answer (frozen or dead)"
    return msg


class _WatchedCommunicator(Communicator):
    """Every collective of a multi-rank communicator is numbered and armed on the watchdog.

    Subclasses set ``_closed``, ``_index`` and ``_watchdog`` in their constructor.
    """

    _closed: bool
    _index: int
    _watchdog: Any

    def _begin(self, kind: str, label: str, is_done: Callable[[], bool] | None = None) -> Pending:
        if self._closed:
            raise RuntimeFailure(f"rank {self.rank}: {kind} on a closed communicator")
        self._index += 1
        return self._watchdog.arm(self._index, kind, label, is_done)

    def _run(self, kind: str, label: str, fn: Callable[[], Any]) -> Any:
        pending = self._begin(kind, label)
        try:
            return fn()
        finally:
            self._watchdog.disarm(pending)


class _MPIRequest:
    """One ``Iallreduce`` in flight. ``lock`` serialises Test/Wait between the caller and the watchdog."""

    __slots__ = ("req", "pending", "done", "lock")

    def __init__(self, req: Any, pending: Pending) -> None:
        self.req, self.pending, self.done = req, pending, False
        self.lock = threading.Lock()

    def test(self) -> bool:
        """Non-blocking; drives MPICH's progress engine. Safe from any thread."""
        if self.done:
            return True
        if not self.lock.acquire(blocking=False):
            return False  # the caller is in wait(): not done yet as far as anyone knows
        try:
            if not self.done and self.req.Test():
                self.done = True
        finally:
            self.lock.release()
        return self.done

    def wait(self) -> None:
        with self.lock:
            if not self.done:
                self.req.Wait()
                self.done = True


class MPICommunicator(_WatchedCommunicator):
    """mpi4py. Blocking collectives run on the calling thread; ``allreduce_async_`` is an ``Iallreduce``
    that the caller progresses with ``progress()`` (the reducer calls it from every backward hook) and
    completes in ``Handle.wait()``. No helper thread sits in MPI, so nothing busy-polls a core while
    backward computes (MPICH_ASYNC_PROGRESS stays off). CPU contiguous tensors are reduced zero-copy.

    The fast path sends nothing extra: when a collective times out, the watchdog asks every other rank over
    a side communicator which collective it has reached (their watchdog threads answer even while the main
    thread is stuck), names the ranks behind, and calls ``MPI_Abort``.
    """

    def __init__(self, timeout_s: float = 300.0, comm: Any = None, local_rank: int | None = None) -> None:
        MPI = import_mpi(timeout_s=Timeouts.from_setting(timeout_s).rendezvous_s)
        self._MPI = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self._comm = base.Dup()
        self._side = base.Dup()  # after a timeout only: "which collective have you reached?"
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        if local_rank is None:
            local = self._comm.Split_type(MPI.COMM_TYPE_SHARED)
            local_rank = local.Get_rank()
            local.Free()
        self.local_rank = local_rank
        self.backend, self.timeout_s = "mpi", float(timeout_s)
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        self._index = 0
        self._inflight: deque[_MPIRequest] = deque()
        self._queries = MPIQueries(MPI, self._side, lambda: self._index)
        self._watchdog = Watchdog(self.timeout_s, self._on_timeout, poll=self._queries.answer)
        self._closed = False

    # -- timeouts: who is behind is asked only once something is late (runtime/liveness.py)
    def _on_timeout(self, pending: Pending) -> None:
        behind, silent = self._queries.ask(pending, grace_s(self.timeout_s, self._watchdog.tick_s))
        _log(f"rank {self.rank}: {_late_message(behind, silent, pending, self.timeout_s)}; aborting the job "
             "(MPI_Abort)")
        self._comm.Abort(1)

    def progress(self) -> None:
        """Let MPICH advance the in-flight ``Iallreduce``s (cheap; a no-op when none is in flight)."""
        inflight = self._inflight
        while inflight and inflight[0].test():
            self._watchdog.disarm(inflight.popleft().pending)

    # -- collectives
    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        _check_op(op)
        direct = tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.dtype != torch.bfloat16
        work = tensor if direct else tensor.detach().to("cpu", torch.float32 if tensor.dtype ==
                                                         torch.bfloat16 else tensor.dtype).contiguous()
        holder: list[_MPIRequest] = []
        pending = self._begin("allreduce", label, lambda: bool(holder) and holder[0].test())
        req = _MPIRequest(self._comm.Iallreduce(self._MPI.IN_PLACE, work.detach().numpy(),
                                                op=self._ops[op]), pending)
        holder.append(req)
        self._inflight.append(req)

        def wait() -> None:
            req.wait()
            self._watchdog.disarm(pending)
            while self._inflight and self._inflight[0].done:
                self._inflight.popleft()
            if op == "mean":
                work.div_(self.size)
            if not direct:
                tensor.copy_(work)

        return Handle(wait)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> torch.Tensor:
        _check_op(op)
        if not (tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.dtype != torch.bfloat16):
            return super().allreduce_(tensor, op, label)
        self._run("allreduce", label, lambda: self._comm.Allreduce(
            self._MPI.IN_PLACE, tensor.detach().numpy(), op=self._ops[op]))
        if op == "mean":
            tensor.div_(self.size)
        return tensor

    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        work = _cpu_contiguous(tensor)
        self._run("broadcast", label, lambda: self._comm.Bcast(work.numpy(), root=root))
        if work is not tensor:
            tensor.copy_(_restore(work, tensor))
        return tensor

    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        work = _cpu_contiguous(tensor)
        out = torch.empty((self.size, *work.shape), dtype=work.dtype)
        self._run("allgather", label, lambda: self._comm.Allgather(work.numpy(), out.numpy()))
        return [_restore(out[i], tensor).to(tensor.device) for i in range(self.size)]

    def gather(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> list[torch.Tensor] | None:
        work = _cpu_contiguous(tensor)
        out = torch.empty((self.size, *work.shape), dtype=work.dtype) if self.rank == root else None
        self._run("gather", label, lambda: self._comm.Gather(work.numpy(), None if out is None else out.numpy(),
                                                             root=root))
        return None if out is None else [_restore(out[i], tensor).to(tensor.device) for i in range(self.size)]

    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        work = _cpu_contiguous(tensor)
        out = torch.empty_like(work)
        self._run("sendrecv", label or f"peer {peer}",
                  lambda: self._comm.Sendrecv(work.numpy(), dest=peer, recvbuf=out.numpy(), source=peer))
        return _restore(out, tensor).to(tensor.device)

    def barrier(self, label: str = "") -> None:
        self._run("barrier", label, self._comm.Barrier)

    def abandon(self) -> None:
        """Stop the watchdog; nothing collective (``MPI_Abort``, which ``hpctrain run`` calls next, ends the job)."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.close()

    def close(self) -> None:
        if self._closed:
            return
        for req in list(self._inflight):  # never waited: complete them before the communicator goes
            req.wait()
        self._inflight.clear()
        self._closed = True
        self._watchdog.close()  # its thread may call MPI: stop it before freeing anything
        self._queries.close()
        self._comm.Barrier()
        self._side.Free()
        self._comm.Free()


def _cpu_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.dtype != torch.bfloat16:
        return tensor
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: ship its bits as int16
        return tensor.detach().cpu().contiguous().view(torch.int16)
    return tensor.detach().cpu().contiguous()


def _restore(work: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return work.view(torch.bfloat16) if like.dtype == torch.bfloat16 and work.dtype == torch.int16 else work


# ---------------------------------------------------------------------------------- torch.distributed

SIDE_STORE_TIMEOUT_S = 10.0  # a late rank's store calls end within this; Watchdog.close waits longer
STORE_CLOSE_WAIT_S = 60.0  # at close, how long the store's host waits for every rank to be done with it
# Start-up skew between ranks (imports from a shared file system, MPI_Init) is not a collective's lateness: a
# loaded node or a cold file-system cache makes one rank minutes late (torchrun waits 600 s for its rendezvous).
RENDEZVOUS_MIN_S = 300.0
# "gloo": gloo's own ring all-reduce instead of hpctrain's point-to-point one (a benchmark's baseline).
GLOO_ALLREDUCE_ENV = "HPCTRAIN_GLOO_ALLREDUCE"
GLOO_ALLGATHER_ENV = "HPCTRAIN_GLOO_ALLGATHER"
GLOO_LAZY_ENV = "TORCH_GLOO_LAZY_INIT"  # torch's switch, read when the group's device is made
# On abandon, how long the p2p all-reduce's helper may take to leave gloo (a receive from a departed peer fails at
# once) before the group is destroyed under it.
P2P_ABANDON_WAIT_S = 5.0
PROCESS_GROUP_MARGIN_S = 60.0  # past the watchdog's deadline: its tick + grace (<= 11 s) + the abort itself


@dataclass(frozen=True)
class Timeouts:
    """Every timeout of a communicator, all from the one setting ``train.collective_timeout_s`` (docs/runtime.md).

    ``collective_s``: hpctrain's watchdog, which names the ranks behind and aborts. ``rendezvous_s``: start-up,
    the MPI broadcast of rank 0's address and the TCPStore's connect and wait (every rank must have joined).
    ``store_s``: the TCPStore's operations, never shorter than a collective. ``process_group_s``: the back-end's
    own collective timeout, later than the watchdog by its tick and grace, so the message that names a rank
    is always the one the job ends with.
    """

    collective_s: float
    rendezvous_s: float
    store_s: float
    process_group_s: float

    @classmethod
    def from_setting(cls, collective_timeout_s: float) -> Timeouts:
        t = float(collective_timeout_s)
        rendezvous = max(t, RENDEZVOUS_MIN_S)
        return cls(collective_s=t, rendezvous_s=rendezvous, store_s=rendezvous,
                   process_group_s=t + PROCESS_GROUP_MARGIN_S)


class TorchDistCommunicator(_WatchedCommunicator):
    """torch.distributed with gloo (CPU), nccl or xccl (GPU); asynchronous all-reduces are the back-end's own work
    handles.

    Rendezvous (docs/scaling.md, "torch.distributed at scale"): ranks an MPI launcher started bootstrap over MPI:
    gloo's address exchange is one MPI allgather (runtime/exchange_store.py) and no TCPStore exists; nccl and xccl
    still find rank 0's TCPStore through an MPI broadcast of its address. Without MPI (torchrun, the local
    launcher, a scheduler's node list) the ranks meet at the TCPStore, and gloo's exchange costs each rank a fixed
    handful of requests to it. Liveness (runtime/liveness.py): who is behind is asked only after a timeout, over
    MPI where the ranks have it, else over the store, whose listeners cost nothing per tick.
    """

    def __init__(
        self,
        backend: str = "gloo",
        timeout_s: float = 300.0,
        env: LaunchEnv | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        import torch.distributed as dist

        environ = os.environ if environ is None else environ
        allreduce = environ.get(GLOO_ALLREDUCE_ENV, "p2p")
        if allreduce not in ("p2p", "gloo"):
            raise ConfigError(f"{GLOO_ALLREDUCE_ENV}={allreduce!r} is not p2p or gloo", key=GLOO_ALLREDUCE_ENV,
                              hint="unset it (hpctrain's point-to-point all-reduce) or set gloo (gloo's ring)")
        allgather = environ.get(GLOO_ALLGATHER_ENV, "p2p")
        if allgather not in ("p2p", "gloo"):
            raise ConfigError(f"{GLOO_ALLGATHER_ENV}={allgather!r} is not p2p or gloo", key=GLOO_ALLGATHER_ENV,
                              hint="unset it (hpctrain's point-to-point all-gather) or set gloo (torch's ring)")
        env = env or detect_launch_env(environ)
        self._dist = dist
        self.rank, self.size, self.local_rank = env.rank, env.size, env.local_rank
        self.backend, self.timeout_s = backend, float(timeout_s)
        self.timeouts = Timeouts.from_setting(timeout_s)
        self._index = 0
        counts = store_counts.active()
        MPI = _mpi_bootstrap(env, self.timeouts.rendezvous_s)
        self._side: Any = MPI.COMM_WORLD.Dup() if MPI is not None else None
        # Under torchrun the agent already serves a store at MASTER_ADDR:MASTER_PORT: join it as a client.
        agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        self._serving = False
        self._store: Any = None
        self._host: str | None = None
        self._port: int | None = None
        if MPI is None or backend != "gloo":
            self._host, self._port = rendezvous_address(env, environ, self.timeouts.rendezvous_s)
            self._serving = self.rank == 0 and not agent_store
            self._store = store_counts.counted_client(dist.TCPStore(
                self._host, self._port, self.size, self._serving,
                timedelta(seconds=self.timeouts.store_s), wait_for_workers=False,
            ))
        pg_store: Any = self._store
        self._exchange_store: ExchangeStore | None = None
        if backend == "gloo":
            exchange = (mpi_exchange(self._side, self.rank) if MPI is not None else
                        store_exchange(self._store, self.rank, self.size, timedelta(seconds=self.timeouts.store_s)))
            self._exchange_store = pg_store = ExchangeStore(self.rank, exchange, fallback=self._store)
        if counts is not None:
            counts.server = "none" if self._store is None else "launcher agent" if agent_store else "rank 0"
            counts.rendezvous = "" if self._exchange_store is None else "mpi" if MPI is not None else "store"
        # Device back-ends reduce tensors where they live: the rank's own GPU is made current first.
        self.device_type = DEVICE_TYPE.get(backend, "cpu")
        rank_device = pick_device(1, backend, env.local_rank) if self.device_type != "cpu" else None
        if rank_device is not None:
            make_current(rank_device)
        # A module that reads the default group when it is imported keeps that group for ever:
        # torch.distributed.nn.functional puts `group.WORLD` into its functions' default arguments, and
        # torch._dynamo imports it, which the first torch.optim optimizer does (lazily: after this group exists).
        # The group then outlived destroy_process_group() in close(), its native threads ran on into interpreter
        # shutdown and a rank could die in std::terminate (exit 134) after its last checkpoint. Imported now,
        # while no group exists, those defaults are None (docs/runtime.md, "Closing").
        import torch.distributed.nn.functional  # noqa: F401

        if backend == "gloo":
            choice = net_interface.set_gloo_interface(os.environ, socket.gethostname(), scheduler_nodes(environ))
            if choice is not None and env.local_rank == 0:
                _log(net_interface.describe(choice))
        # Our watchdog must fire before the back-end's own timeout so the message names the missing rank.
        with _gloo_lazy_pairs(backend):
            dist.init_process_group(
                backend, store=dist.PrefixStore("pg/", pg_store), rank=self.rank, world_size=self.size,
                timeout=timedelta(seconds=self.timeouts.process_group_s),
                # NCCL told its rank's GPU binds the communicator to it (barrier() need not guess)
                **({"device_id": rank_device} if rank_device is not None and rank_device.type == "cuda" else {}),
            )
        if counts is not None and self._exchange_store is not None:
            counts.local_calls = self._exchange_store.local_calls
        # gloo's own all-reduce and torch's all-gather over gloo are rings over a full mesh (O(N) messages per
        # rank): CPU tensors are all-reduced and all-gathered by point-to-point messages instead, O(log N) of them
        # (runtime/gloo_allreduce.py).
        self.p2p: GlooAllreduce | None = None
        self.p2p_gather: GlooAllreduce | None = None
        if backend == "gloo" and self.size > 1 and "p2p" in (allreduce, allgather):
            messages = GlooAllreduce(dist, self.rank, self.size)
            self.p2p = messages if allreduce == "p2p" else None
            self.p2p_gather = messages if allgather == "p2p" else None
        self._ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                     "min": dist.ReduceOp.MIN}
        self._queries: MPIQueries | StoreQueries
        if MPI is not None:
            self._queries = MPIQueries(MPI, self._side, lambda: self._index)
            self._watchdog = Watchdog(self.timeout_s, self._on_timeout, poll=self._queries.answer)
        else:
            self._queries = StoreQueries(self._connect, self.rank, self.size, lambda: self._index)
            self._watchdog = Watchdog(self.timeout_s, self._on_timeout)
        self._closed = False

    def _connect(self) -> Any:
        """A client connection of its own to the store (the liveness listener's, a late rank's question)."""
        return store_counts.counted_client(self._dist.TCPStore(
            self._host, self._port, self.size, False, timedelta(seconds=SIDE_STORE_TIMEOUT_S),
            wait_for_workers=False,
        ))

    def _on_timeout(self, pending: Pending) -> None:
        grace = grace_s(self.timeout_s, self._watchdog.tick_s)
        if isinstance(self._queries, MPIQueries):
            behind, silent = self._queries.ask(pending, grace)
            _log(f"rank {self.rank}: {_late_message(behind, silent, pending, self.timeout_s)}; aborting the job "
                 "(MPI_Abort)")
            self._side.Abort(1)
            return
        try:
            behind, silent, store = self._queries.ask(pending, grace)
            msg = _late_message(behind, silent, pending, self.timeout_s)
            self._queries.abort(store, msg)
        except Exception as exc:
            msg = (f"{pending.describe()} did not complete within {self.timeout_s:g} s and the rendezvous "
                   f"store ({self._host}:{self._port}) is unreachable ({exc}): its host (rank 0) died")
        _log(f"rank {self.rank}: {msg}; aborting the job")
        os._exit(1)

    def _dev(self, tensor: torch.Tensor) -> torch.Tensor:
        return on_device(tensor, self.device_type)

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        _check_op(op)
        work = self._dev(tensor)
        if self.p2p is not None:
            return self._p2p_async(work, tensor, op, label)
        holder: list[Any] = []
        pending = self._begin("allreduce", label, lambda: bool(holder) and holder[0].is_completed())
        holder.append(self._dist.all_reduce(work, op=self._ops[op], async_op=True))

        def wait() -> None:
            try:
                holder[0].wait()
            finally:
                self._watchdog.disarm(pending)
                holder.clear()  # a kept gloo work object would keep the gloo context and its threads alive
            if op == "mean":
                work.div_(self.size)
            if work is not tensor:
                tensor.copy_(work)

        return Handle(wait)

    def _p2p_async(self, work: torch.Tensor, tensor: torch.Tensor, op: str, label: str) -> Handle:
        assert self.p2p is not None
        holder: list[Job] = []
        pending = self._begin("allreduce", label, lambda: bool(holder) and holder[0].done)
        holder.append(self.p2p.start(work, "sum" if op == "mean" else op))

        def wait() -> None:
            try:
                holder[0].wait()
            finally:
                self._watchdog.disarm(pending)
            if op == "mean":
                work.div_(self.size)
            if work is not tensor:
                tensor.copy_(work)

        return Handle(wait)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> torch.Tensor:
        _check_op(op)
        work = self._dev(tensor)
        if self.p2p is not None:
            p2p = self.p2p
            self._run("allreduce", label, lambda: p2p.allreduce_(work, "sum" if op == "mean" else op))
        else:
            self._run("allreduce", label,
                      lambda: self._dist.all_reduce(work, op=self._ops[op], async_op=False))
        if op == "mean":
            work.div_(self.size)
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        work = self._dev(tensor)
        self._run("broadcast", label, lambda: self._dist.broadcast(work, src=root))
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        work = self._dev(tensor)
        if self.p2p_gather is not None:
            messages = self.p2p_gather
            got: list[list[torch.Tensor]] = []
            self._run("allgather", label, lambda: got.append(messages.allgather(work)))
            return [t.to(tensor.device) for t in got[0]]
        out = [torch.empty_like(work) for _ in range(self.size)]
        self._run("allgather", label, lambda: self._dist.all_gather(out, work))
        return [t.to(tensor.device) for t in out]

    def allgather_varlen(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        if self.p2p_gather is None:
            return super().allgather_varlen(tensor, label)
        # the lengths first (one int64 per rank), then the blocks as they are: nothing padded to the longest
        n = torch.tensor([tensor.numel()], dtype=torch.int64)
        lengths = [int(t) for t in self.allgather(n, label=f"{label} lengths".strip())]
        work = self._dev(tensor).reshape(-1)
        messages = self.p2p_gather
        got: list[list[torch.Tensor]] = []
        self._run("allgather", label, lambda: got.append(messages.allgather_varlen(work, lengths)))
        return [t.to(tensor.device) for t in got[0]]

    def gather(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> list[torch.Tensor] | None:
        work = self._dev(tensor)
        out = [torch.empty_like(work) for _ in range(self.size)] if self.rank == root else None
        self._run("gather", label, lambda: self._dist.gather(work, out, dst=root))
        return None if out is None else [t.to(tensor.device) for t in out]

    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        work = self._dev(tensor)
        out = torch.empty_like(work)

        def fn() -> None:
            d = self._dist
            reqs = d.batch_isend_irecv([d.P2POp(d.isend, work, peer), d.P2POp(d.irecv, out, peer)])
            for r in reqs:
                r.wait()

        self._run("sendrecv", label or f"peer {peer}", fn)
        return out.to(tensor.device)

    def barrier(self, label: str = "") -> None:
        self._run("barrier", label, self._dist.barrier)

    def abandon(self) -> None:
        """Leave the group without its closing barrier: stop the watchdog and the group's native threads (see
        ``close``) so the rank exits with its own status; the other ranks' collectives fail or time out."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.close()
        if self.p2p is not None:  # its helper may wait on a departed peer: not for long
            self.p2p.close(timeout_s=P2P_ABANDON_WAIT_S)
        try:
            self._dist.destroy_process_group()
        except Exception as exc:  # already broken by a departed peer: nothing more to let go
            _log(f"rank {self.rank}: leaving the process group: {exc}")
        if isinstance(self._queries, StoreQueries):  # nothing collective: only this rank's listener stops
            self._queries.close(self._store, serving=False, timeout_s=SIDE_STORE_TIMEOUT_S)
        self._store = self._exchange_store = None

    def close(self) -> None:
        """Leave the group and stop its native threads now, on this thread; collective."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.close()
        if self.p2p is not None:
            self.p2p.close()
        self._dist.barrier()
        # The process group owns native threads (gloo's work loops and its transport loop) and, through its
        # store, rank 0's TCPStore server thread. They stop only when the last reference to the group goes.
        # This communicator keeps none (collectives name the default group, finished works are dropped), so
        # they stop here, while the interpreter is whole: left to interpreter shutdown they could still be
        # running when it tears the process down, and the rank then died in std::terminate (SIGABRT) after
        # its final checkpoint instead of exiting with its status.
        self._dist.destroy_process_group()
        counts = store_counts.active()
        if counts is not None:
            counts.begin_close()
        # Rank 0 may host the TCPStore server: it releases it last, once every rank is done with it.
        if isinstance(self._queries, MPIQueries):
            self._queries.close()
            self._side.Barrier()
            self._side.Free()
        else:
            self._queries.close(self._store, serving=self._serving, timeout_s=STORE_CLOSE_WAIT_S)
        self._store = self._exchange_store = None  # the last references: rank 0's server thread stops here


@contextmanager
def _gloo_lazy_pairs(backend: str) -> Iterator[None]:
    """gloo connects a pair of ranks when it first carries a message, not all N - 1 pairs at start-up: with the
    point-to-point all-reduce a rank then holds O(log N) connections. A ``TORCH_GLOO_LAZY_INIT`` the user set
    is kept (0: the full mesh)."""
    if backend != "gloo" or GLOO_LAZY_ENV in os.environ:
        yield
        return
    os.environ[GLOO_LAZY_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(GLOO_LAZY_ENV, None)


def _mpi_bootstrap(env: LaunchEnv, timeout_s: float) -> Any:
    """The MPI module when the ranks can bootstrap over MPI (an MPI launcher started all of them and no
    MASTER_ADDR/MASTER_PORT names a store to meet at), else None."""
    if env.size < 2 or (env.master_addr and env.master_port):
        return None
    return import_mpi(timeout_s=timeout_s) if _mpi_world_size_if_launched(env, timeout_s) == env.size else None


# ------------------------------------------------------------------------------------------ rendezvous


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_from_job_id(job_id: str) -> int:
    """A port in [20000, 60000) every rank derives alike from the scheduler's job id (no typed address)."""
    return 20000 + zlib.crc32(job_id.encode()) % 40000


def _mpi_world_size_if_launched(env: LaunchEnv, timeout_s: float) -> int:
    if env.launcher not in ("hydra", "openmpi", "pals", "alps", "slurm"):
        return 0
    try:
        MPI = import_mpi(timeout_s=timeout_s)
    except ImportError:
        return 0
    return MPI.COMM_WORLD.Get_size()


def rendezvous_address(env: LaunchEnv, environ: Mapping[str, str],
                       timeout_s: float = RENDEZVOUS_MIN_S) -> tuple[str, int]:
    """Where rank 0's TCPStore listens, found without a hand-typed address.

    Order: MASTER_ADDR/MASTER_PORT (torchrun); rank 0's hostname and a free port broadcast over MPI when
    the job was started by an MPI launcher (within ``timeout_s``); the first node of the scheduler's node list
    with a port derived from the job id; localhost for a single process.
    """
    if env.master_addr and env.master_port:
        return env.master_addr, env.master_port
    if env.size > 1 and _mpi_world_size_if_launched(env, timeout_s) == env.size:
        return _address_over_mpi(import_mpi(), timeout_s)
    nodes = scheduler_nodes(environ)
    job_id = scheduler_job_id(environ)
    if env.size > 1 and nodes and job_id:
        return env.master_addr or nodes[0], env.master_port or port_from_job_id(job_id)
    if env.size == 1:
        return "127.0.0.1", env.master_port or _free_port()
    raise RuntimeFailure(
        f"rank {env.rank}: cannot find the rendezvous address for {env.size} ranks "
        f"(launcher {env.launcher}: no MASTER_ADDR/MASTER_PORT, no MPI, no scheduler node list)",
        hint="launch with srun/mpiexec inside a job, or with torchrun, or set MASTER_ADDR and MASTER_PORT",
    )


_ADDRESS_BYTES = 264  # a host name (at most 255 bytes), its length and the port


def _address_over_mpi(MPI: Any, timeout_s: float) -> tuple[str, int]:
    """Rank 0's host name and a free port, broadcast to every rank; a rank still waiting after ``timeout_s``
    fails with a message instead of waiting for ever (a broadcast has no timeout of its own)."""
    import time

    import numpy as np

    world = MPI.COMM_WORLD
    buf = np.zeros(_ADDRESS_BYTES, dtype=np.uint8)
    if world.Get_rank() == 0:
        host = socket.gethostname().encode()[:255]
        buf[0] = len(host)
        buf[1:1 + len(host)] = np.frombuffer(host, dtype=np.uint8)
        buf[256:264] = np.frombuffer(np.array([_free_port()], dtype="<i8").tobytes(), dtype=np.uint8)
    request = world.Ibcast(buf, root=0)
    deadline, pause = time.monotonic() + timeout_s, 0.001
    while not request.Test():  # ranks wait here while rank 0 starts: back off so they do not take its cores
        if time.monotonic() > deadline:
            raise RuntimeFailure(
                f"rank {world.Get_rank()}: rank 0's rendezvous address did not arrive over MPI within "
                f"{timeout_s:g} s (a rank upstream of this one, or rank 0, has not started)",
                hint="raise train.collective_timeout_s if start-up is this slow (or stage the environment to "
                     "node-local storage, docs/scaling.md)")
        time.sleep(pause)
        pause = min(0.05, 2 * pause)
    host = bytes(buf[1:1 + int(buf[0])]).decode()
    return host, int(np.frombuffer(buf[256:264].tobytes(), dtype="<i8")[0])


def make_communicator(
    backend: str, timeout_s: float, environ: Mapping[str, str] | None = None
) -> Communicator:
    """``backend``: mpi | gloo | nccl | xccl | none (single process). ``timeout_s`` bounds every collective.

    With counting on (runtime/work_counts.py) every call is counted on its way (runtime/comm_counts.py).
    """
    from hpctrain.runtime.comm_counts import counted

    return counted(_make_communicator(backend, timeout_s, environ))


def _make_communicator(backend: str, timeout_s: float, environ: Mapping[str, str] | None) -> Communicator:
    environ = os.environ if environ is None else environ
    if backend == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise ConfigError(
                "backend 'mpi' needs mpi4py", key="backend",
                hint="pip install mpi4py mpich (or build mpi4py against the site MPI, see docs/runtime.md)",
            ) from None
        env = detect_launch_env(environ)
        return MPICommunicator(timeout_s, local_rank=env.local_rank if env.launcher != "none" else None)
    if backend in ("gloo", "nccl", "xccl"):
        if backend in DEVICE_TYPE:  # this torch has the backend and the rank sees a device, or one line says why
            require_device_backend(backend, environ)
        return TorchDistCommunicator(backend, timeout_s, environ=environ)
    if backend == "none":
        env = detect_launch_env(environ)
        if env.size != 1:
            raise ConfigError(f"backend 'none' is single-process but the launcher started {env.size} ranks",
                              key="backend", hint="use mpi or gloo")
        return SingleProcessCommunicator(timeout_s)
    raise ConfigError(f"unknown communication backend {backend!r}", key="backend",
                      hint=f"use one of {', '.join(BACKENDS)}")
