"""The torch.distributed back-end: gloo on CPU; nccl on NVIDIA and, as RCCL, AMD GPUs; xccl on Intel GPUs
(runtime/devices.py). CPU tensors are all-reduced and all-gathered by hpctrain's point-to-point messages.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

from hpctrain.errors import ConfigError
from hpctrain.launch_env import LaunchEnv, detect_launch_env, scheduler_nodes
from hpctrain.runtime.comm import net_interface
from hpctrain.runtime.comm.base import Handle, check_op, log_line
from hpctrain.runtime.comm.exchange_store import ExchangeStore, mpi_exchange, store_exchange
from hpctrain.runtime.comm.gloo_allreduce import GlooAllreduce, Job
from hpctrain.runtime.comm.liveness import MPIQueries, StoreQueries, grace_s
from hpctrain.runtime.comm.rendezvous import mpi_bootstrap, rendezvous_address
from hpctrain.runtime.comm.timeouts import Timeouts
from hpctrain.runtime.comm.watchdog import Pending, Watchdog
from hpctrain.runtime.comm.watched import WatchedCommunicator, late_message
from hpctrain.runtime.counting import store_counts
from hpctrain.runtime.devices import DEVICE_TYPE, make_current, on_device, pick_device

SIDE_STORE_TIMEOUT_S = 10.0  # a late rank's store calls end within this; Watchdog.close waits longer
STORE_CLOSE_WAIT_S = 60.0  # at close, how long the store's host waits for every rank to be done with it
# "gloo": gloo's own ring all-reduce instead of hpctrain's point-to-point one (a benchmark's baseline).
GLOO_ALLREDUCE_ENV = "HPCTRAIN_GLOO_ALLREDUCE"
GLOO_ALLGATHER_ENV = "HPCTRAIN_GLOO_ALLGATHER"
GLOO_LAZY_ENV = "TORCH_GLOO_LAZY_INIT"  # torch's switch, read when the group's device is made
# On abandon, how long the p2p all-reduce's helper may take to leave gloo (a receive from a departed peer fails at
# once) before the group is destroyed under it.
P2P_ABANDON_WAIT_S = 5.0


class TorchDistCommunicator(WatchedCommunicator):
    """torch.distributed with gloo (CPU), nccl or xccl (GPU); asynchronous all-reduces are the back-end's own work
    handles.

    Rendezvous (docs/scaling.md, "torch.distributed at scale"): ranks an MPI launcher started bootstrap over MPI:
    gloo's address exchange is one MPI allgather (runtime/comm/exchange_store.py) and no TCPStore exists; nccl and xccl
    still find rank 0's TCPStore through an MPI broadcast of its address. Without MPI (torchrun, the local
    launcher, a scheduler's node list) the ranks meet at the TCPStore, and gloo's exchange costs each rank a fixed
    handful of requests to it. Liveness (runtime/comm/liveness.py): who is behind is asked only after a timeout, over
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
        allreduce = _p2p_or_gloo(environ, GLOO_ALLREDUCE_ENV, "all-reduce", "gloo's ring")
        allgather = _p2p_or_gloo(environ, GLOO_ALLGATHER_ENV, "all-gather", "torch's ring")
        env = env or detect_launch_env(environ)
        self._dist = dist
        self.rank, self.size, self.local_rank = env.rank, env.size, env.local_rank
        self.backend, self.timeout_s = backend, float(timeout_s)
        self.timeouts = Timeouts.from_setting(timeout_s)
        self._index = 0
        MPI = mpi_bootstrap(env, self.timeouts.rendezvous_s)
        self._side: Any = MPI.COMM_WORLD.Dup() if MPI is not None else None
        counts = store_counts.active()
        pg_store = self._meet(env, environ, MPI, counts)
        self._start_group(env, environ, pg_store)
        if counts is not None and self._exchange_store is not None:
            counts.local_calls = self._exchange_store.local_calls
        # gloo's own all-reduce and torch's all-gather over gloo are rings over a full mesh (O(N) messages per
        # rank): CPU tensors are all-reduced and all-gathered by point-to-point messages instead, O(log N) of them
        # (runtime/comm/gloo_allreduce.py).
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

    def _meet(self, env: LaunchEnv, environ: Mapping[str, str], MPI: Any,
              counts: store_counts.StoreCounts | None) -> Any:
        """Rank 0's TCPStore (joined, or served by rank 0) unless gloo bootstraps over MPI, and gloo's address
        exchange; returns the store the process group is built on."""
        # Under torchrun the agent already serves a store at MASTER_ADDR:MASTER_PORT: join it as a client.
        agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        self._serving = False
        self._store: Any = None
        self._host: str | None = None
        self._port: int | None = None
        if MPI is None or self.backend != "gloo":
            self._host, self._port = rendezvous_address(env, environ, self.timeouts.rendezvous_s)
            self._serving = self.rank == 0 and not agent_store
            self._store = store_counts.counted_client(self._dist.TCPStore(
                self._host, self._port, self.size, self._serving,
                timedelta(seconds=self.timeouts.store_s), wait_for_workers=False,
            ))
        pg_store: Any = self._store
        self._exchange_store: ExchangeStore | None = None
        if self.backend == "gloo":
            exchange = (mpi_exchange(self._side, self.rank) if MPI is not None else
                        store_exchange(self._store, self.rank, self.size, timedelta(seconds=self.timeouts.store_s)))
            self._exchange_store = pg_store = ExchangeStore(self.rank, exchange, fallback=self._store)
        if counts is not None:
            counts.server = "none" if self._store is None else "launcher agent" if agent_store else "rank 0"
            counts.rendezvous = "" if self._exchange_store is None else "mpi" if MPI is not None else "store"
        return pg_store

    def _start_group(self, env: LaunchEnv, environ: Mapping[str, str], pg_store: Any) -> None:
        """The rank's device made current, then the default process group over ``pg_store``."""
        dist, backend = self._dist, self.backend
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
                log_line(net_interface.describe(choice))
        # Our watchdog must fire before the back-end's own timeout so the message names the missing rank.
        with _gloo_lazy_pairs(backend):
            dist.init_process_group(
                backend, store=dist.PrefixStore("pg/", pg_store), rank=self.rank, world_size=self.size,
                timeout=timedelta(seconds=self.timeouts.process_group_s),
                # NCCL told its rank's GPU binds the communicator to it (barrier() need not guess)
                **({"device_id": rank_device} if rank_device is not None and rank_device.type == "cuda" else {}),
            )

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
            log_line(f"rank {self.rank}: {late_message(behind, silent, pending, self.timeout_s)}; aborting the job "
                 "(MPI_Abort)")
            self._side.Abort(1)
            return
        try:
            behind, silent, store = self._queries.ask(pending, grace)
            msg = late_message(behind, silent, pending, self.timeout_s)
            self._queries.abort(store, msg)
        except Exception as exc:
            msg = (f"{pending.describe()} did not complete within {self.timeout_s:g} s and the rendezvous "
                   f"store ({self._host}:{self._port}) is unreachable ({exc}): its host (rank 0) died")
        log_line(f"rank {self.rank}: {msg}; aborting the job")
        os._exit(1)

    def _dev(self, tensor: torch.Tensor) -> torch.Tensor:
        return on_device(tensor, self.device_type)

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        check_op(op)
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
        check_op(op)
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
            log_line(f"rank {self.rank}: leaving the process group: {exc}")
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


def _p2p_or_gloo(environ: Mapping[str, str], variable: str, what: str, ring: str) -> str:
    """What ``variable`` chooses for CPU tensors: ``p2p`` (hpctrain's point-to-point messages, the default) or
    ``gloo``."""
    chosen = environ.get(variable, "p2p")
    if chosen not in ("p2p", "gloo"):
        raise ConfigError(f"{variable}={chosen!r} is not p2p or gloo", key=variable,
                          hint=f"unset it (hpctrain's point-to-point {what}) or set gloo ({ring})")
    return chosen


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
