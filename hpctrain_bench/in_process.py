"""K ranks in one process: a communicator per rank whose collectives meet the others' in memory.

``run_ranks(K, fn)`` runs ``fn(rank, comm)`` for every rank on its own thread, one thread at a time (``Crew``),
with ``comm`` an ``InProcessComm``: rank k of K (``InProcessGroup.run`` runs more rounds on the same ranks). A
collective parks its rank until every rank has made the same call, then the last to arrive computes it (sums
taken in rank order) and every rank goes on with the result. A combiner's ordinary per-rank path (``launch``,
``after_step``, ...) thus runs unchanged on K simulated ranks: nothing in a combiner is written twice. A
``sendrecv`` meets its peer's alone (the n-th exchange between two ranks meets the n-th), so ranks that take no
part in an exchange go on to their next call, as over a real network.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hpctrain.errors import RuntimeFailure
from hpctrain.runtime.comm.base import Communicator, Handle, check_op


class CalledOff(Exception):
    """Another worker failed while this one waited for it."""


class Crew:
    """One thread per worker, run one at a time as coroutines: ``run(fn)`` calls ``fn(k)`` for every worker k.

    A worker that must wait for the others (a meeting, an average in flight) calls ``park(k, until)``: control
    goes back to the crew, which resumes the next worker; a parked worker is resumed once ``until()`` holds.
    Only one thread runs at a time, in rank order, so the simulation is deterministic and needs no locks, and
    a thousand workers do not fight over the interpreter lock.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._wake = [threading.Semaphore(0) for _ in range(size)]
        self._back = threading.Semaphore(0)
        self._fn: Callable[[int], None] | None = None
        self._until: list[Callable[[], bool] | None] = [None] * size
        self._errors: list[BaseException | None] = [None] * size
        self._called_off = False
        self._threads = [threading.Thread(target=self._serve, args=(k,), name=f"simulated-worker-{k}", daemon=True)
                         for k in range(size)]
        for t in self._threads:
            t.start()

    def _serve(self, k: int) -> None:
        while True:
            self._wake[k].acquire()
            fn = self._fn
            if fn is None:
                return
            try:
                fn(k)
            except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it in the main thread
                self._errors[k] = exc
            self._until[k] = None
            self._back.release()

    def park(self, k: int, until: Callable[[], bool]) -> None:
        """Called on worker k's thread: wait until ``until()`` holds (the crew runs the others meanwhile)."""
        self._until[k] = until
        self._back.release()
        self._wake[k].acquire()
        if self._called_off:
            raise CalledOff("another simulated worker failed")

    def _resume(self, k: int) -> None:
        self._wake[k].release()
        self._back.acquire()

    def run(self, fn: Callable[[int], None]) -> None:
        self._fn, self._called_off = fn, False
        self._errors = [None] * self.size
        started = [False] * self.size
        finished = [False] * self.size
        while not all(finished):
            progressed = False
            for k in range(self.size):
                if finished[k]:
                    continue
                if not started[k]:
                    if self._called_off:
                        finished[k] = True
                        continue
                    started[k] = True
                else:
                    until = self._until[k]
                    if until is None or not (self._called_off or until()):
                        continue
                self._resume(k)
                progressed = True
                if self._until[k] is None:  # it returned (or raised) rather than parked
                    finished[k] = True
                    if self._errors[k] is not None:
                        self._called_off = True
            if not progressed:  # every unfinished worker waits for something no one will do
                self._called_off = True
                self._errors.append(RuntimeFailure(
                    "simulated workers wait for each other forever",
                    hint="a combiner must make the same collective calls, in the same order, on every rank"))
        errors = [e for e in self._errors if e is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, CalledOff)), errors[0])

    def close(self) -> None:
        self._fn = None
        for wake in self._wake:
            wake.release()
        for t in self._threads:
            t.join()


@dataclass
class _Round:
    """One collective: what each rank brought, and once all K have, what each gets back."""

    kind: str
    brought: dict[int, Any] = field(default_factory=dict)
    results: list[Any] | None = None
    collected: int = 0


def _reduce(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    total = tensors[0].clone()
    for t in tensors[1:]:  # in rank order
        if op in ("sum", "mean"):
            total.add_(t)
        elif op == "max":
            torch.maximum(total, t, out=total)
        else:
            torch.minimum(total, t, out=total)
    return total.div_(len(tensors)) if op == "mean" else total


class InProcessGroup:
    """The meeting place of K in-process ranks: the i-th collective of every rank meets in round i."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.crew: Crew | None = None  # the threads the ranks run on, while they run
        self._calls = [0] * self.size
        self._rounds: dict[int, _Round] = {}
        self._exchanges: dict[tuple[int, int], int] = {}  # (rank, peer) -> exchanges rank began with peer
        self._pairs: dict[tuple[int, int, int], dict[int, torch.Tensor]] = {}

    def arrive(self, rank: int, kind: str, brought: Any,
               compute: Callable[[list[Any]], list[Any]]) -> Callable[[], Any]:
        """Rank ``rank`` brings ``brought`` to its next collective; returns the wait for its share of
        ``compute(everything brought, in rank order)``, run once when the last rank arrives."""
        index = self._calls[rank]
        self._calls[rank] += 1
        rnd = self._rounds.setdefault(index, _Round(kind))
        if rnd.kind != kind:
            raise RuntimeFailure(f"simulated rank {rank} called {kind} where another called {rnd.kind}",
                                 hint="a combiner must make the same collective calls, in the same order, on "
                                      "every rank")
        rnd.brought[rank] = brought
        if len(rnd.brought) == self.size:
            rnd.results = compute([rnd.brought[k] for k in range(self.size)])

        def wait() -> Any:
            if rnd.results is None:
                if self.crew is None:
                    raise RuntimeFailure("simulated ranks communicate only while they run (run_ranks)")
                self.crew.park(rank, lambda: rnd.results is not None)
            assert rnd.results is not None
            rnd.collected += 1
            if rnd.collected == self.size:
                del self._rounds[index]
            return rnd.results[rank]

        return wait

    def exchange(self, rank: int, peer: int, tensor: torch.Tensor) -> torch.Tensor:
        """Rank ``rank``'s side of its next exchange with ``peer``: what ``peer`` brought to the same exchange."""
        if peer == rank:
            return tensor.clone()
        count = self._exchanges.get((rank, peer), 0)
        self._exchanges[(rank, peer)] = count + 1
        key = (min(rank, peer), max(rank, peer), count)
        brought = self._pairs.setdefault(key, {})
        brought[rank] = tensor.clone()
        if peer not in brought:
            if self.crew is None:
                raise RuntimeFailure("simulated ranks communicate only while they run (run_ranks)")
            self.crew.park(rank, lambda: peer in brought)
        got = brought.pop(peer)
        if not brought:  # both sides took theirs
            del self._pairs[key]
        return got

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(rank)`` on every rank, each on its own thread, one at a time; what each returned, by rank."""
        results: list[Any] = [None] * self.size

        def one(rank: int) -> None:
            results[rank] = fn(rank)

        crew = self.crew = Crew(self.size)
        try:
            crew.run(one)
        finally:
            crew.close()
            self.crew = None
        return results


class InProcessComm(Communicator):
    """Rank ``rank`` of an ``InProcessGroup``: every collective of the Communicator contract, in memory."""

    def __init__(self, group: InProcessGroup, rank: int) -> None:
        self.group, self.rank, self.size, self.local_rank = group, rank, group.size, rank
        self.backend, self.timeout_s = "none", 0.0

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        check_op(op)

        def compute(tensors: list[torch.Tensor]) -> list[None]:
            total = _reduce(tensors, op)
            for t in tensors:
                t.copy_(total)
            return [None] * len(tensors)

        return Handle(self.group.arrive(self.rank, "allreduce", tensor, compute))

    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        def compute(tensors: list[torch.Tensor]) -> list[None]:
            for t in tensors:
                if t is not tensors[root]:
                    t.copy_(tensors[root])
            return [None] * len(tensors)

        self.group.arrive(self.rank, "broadcast", tensor, compute)()
        return tensor

    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        def compute(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
            gathered = [t.clone() for t in tensors]
            return [[g.clone() for g in gathered] for _ in tensors]

        return self.group.arrive(self.rank, "allgather", tensor, compute)()

    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        return self.group.exchange(self.rank, peer, tensor)

    def barrier(self, label: str = "") -> None:
        self.group.arrive(self.rank, "barrier", None, lambda brought: [None] * len(brought))()

    def close(self) -> None:
        return None


def run_ranks(size: int, fn: Callable[[int, InProcessComm], Any]) -> list[Any]:
    """``fn(rank, comm)`` on every rank of a fresh in-process group of ``size``; what each returned, by rank."""
    group = InProcessGroup(size)
    return group.run(lambda rank: fn(rank, InProcessComm(group, rank)))
