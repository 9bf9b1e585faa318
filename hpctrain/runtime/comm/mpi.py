"""The MPI back-end (mpi4py): blocking collectives on the calling thread, non-blocking all-reduces the caller
progresses, a side communicator that is asked who is behind only after a timeout.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch

from hpctrain.runtime.comm.base import Handle, check_op, log_line
from hpctrain.runtime.comm.liveness import MPIQueries, grace_s
from hpctrain.runtime.comm.mpi_env import import_mpi
from hpctrain.runtime.comm.timeouts import Timeouts
from hpctrain.runtime.comm.watchdog import Pending, Watchdog
from hpctrain.runtime.comm.watched import WatchedCommunicator, late_message


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


class MPICommunicator(WatchedCommunicator):
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

    # -- timeouts: who is behind is asked only once something is late (runtime/comm/liveness.py)
    def _on_timeout(self, pending: Pending) -> None:
        behind, silent = self._queries.ask(pending, grace_s(self.timeout_s, self._watchdog.tick_s))
        log_line(f"rank {self.rank}: {late_message(behind, silent, pending, self.timeout_s)}; aborting the job "
             "(MPI_Abort)")
        self._comm.Abort(1)

    def progress(self) -> None:
        """Let MPICH advance the in-flight ``Iallreduce``s (cheap; a no-op when none is in flight)."""
        inflight = self._inflight
        while inflight and inflight[0].test():
            self._watchdog.disarm(inflight.popleft().pending)

    # -- collectives
    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        check_op(op)
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
        check_op(op)
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
