"""The gloo (CPU) path's all-reduce and all-gather: runtime/comm/p2p_allreduce.py and runtime/comm/p2p_allgather.py over
torch.distributed's isend/irecv, so each rank sends O(log N) messages to O(log N) peers per call instead of gloo's
rings (2 (N-1) and N - 1 messages to its two neighbours) over a full mesh.

Blocking all-reduces run on the caller's thread. Asynchronous ones run in order on one helper thread: gloo's
point-to-point works report completion only through ``wait()``, so nothing else could advance them while backward
runs. Every all-reduce and all-gather gets the next number of a sequence every rank counts alike; its messages carry
it as their tag, so collectives in flight at once (a blocking one beside the helper's) never take each other's
messages. Each thread keeps its own receive buffer for the reducing rounds (``p2p_allreduce.Scratch``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from hpctrain.runtime.comm import p2p_allgather
from hpctrain.runtime.comm import p2p_allreduce as p2p

TAG_SPACE = 1 << 30  # gloo tags are C ints; the sequence wraps long after any all-reduce in flight has ended


class _DistTransport:
    """The default group's own send and recv: ``dist.isend``'s checks and dispatch cost more than the call itself
    for a small message, and the rounds only pass contiguous real tensors of this group. The group is looked up
    per call, never kept, so ``destroy_process_group`` still lets its threads go."""

    def __init__(self, dist: Any) -> None:
        self._dist = dist

    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Any:
        return self._dist.group.WORLD.send([tensor], peer, tag)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Any:
        return self._dist.group.WORLD.recv([tensor], peer, tag)


class Job:
    """One asynchronous all-reduce on the helper thread."""

    __slots__ = ("run", "done", "error", "event")

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run
        self.done = False
        self.error: BaseException | None = None
        self.event = threading.Event()

    def wait(self) -> None:
        self.event.wait()
        if self.error is not None:
            raise self.error


class GlooAllreduce:
    """All-reduces and all-gathers of CPU tensors of one torch.distributed group (the default one) by point-to-point
    messages."""

    def __init__(self, dist: Any, rank: int, size: int, transport: p2p.Transport | None = None) -> None:
        self.rank, self.size = rank, size
        self._transport = transport or _DistTransport(dist)
        self._sequence = 0
        self.tally = p2p.Tally()
        self.allgather_tally = p2p.Tally()
        self._scratch = threading.local()
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the tally, updated from both threads

    def _next_tag(self) -> int:
        self._sequence += 1
        return self._sequence % TAG_SPACE

    def _scratch_here(self) -> p2p.Scratch:
        scratch = getattr(self._scratch, "buffer", None)
        if scratch is None:
            scratch = self._scratch.buffer = p2p.Scratch()
        return scratch

    def _reduce(self, flat: torch.Tensor, op: str, tag: int) -> None:
        tally = p2p.Tally()
        p2p.run(flat, op, self.rank, self.size, self._transport, tag, tally, scratch=self._scratch_here())
        self._add(self.tally, tally)

    def _add(self, t: p2p.Tally, tally: p2p.Tally) -> None:
        with self._lock:
            t.calls += tally.calls
            t.sent_messages += tally.sent_messages
            t.received_messages += tally.received_messages
            t.sent_bytes += tally.sent_bytes
            t.received_bytes += tally.received_bytes
            t.peers |= tally.peers

    def allreduce_(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """``tensor`` (CPU, any shape) reduced in place with ``op`` (sum, max, min) on this thread."""
        flat, finish = _flat(tensor)
        self._reduce(flat, op, self._next_tag())
        finish()
        return tensor

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (CPU, the same shape and dtype on every rank), in rank order, on this thread."""
        got = self.allgather_varlen(tensor.reshape(-1), [tensor.numel()] * self.size)
        return [g.view(tensor.shape) for g in got]

    def allgather_varlen(self, flat: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
        """Every rank's 1-D ``flat`` (``counts[r]`` elements on rank r, one dtype), in rank order, on this
        thread."""
        tally = p2p.Tally()
        got = p2p_allgather.allgather(flat, counts, self.rank, self._transport, self._next_tag(), tally)
        self._add(self.allgather_tally, tally)
        return got

    def start(self, tensor: torch.Tensor, op: str) -> Job:
        """Queue ``tensor``'s all-reduce on the helper thread; the returned job's ``wait()`` ends it."""
        flat, finish = _flat(tensor)
        tag = self._next_tag()

        def run() -> None:
            self._reduce(flat, op, tag)
            finish()

        job = Job(run)
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="hpctrain-p2p-allreduce", daemon=True)
            self._thread.start()
        self._jobs.put(job)
        return job

    def _serve(self) -> None:
        failed: BaseException | None = None
        while (job := self._jobs.get()) is not None:
            if failed is not None:  # the group is broken (a peer gone): the jobs queued after it are not started
                job.error = failed
            else:
                try:
                    job.run()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's wait()
                    job.error = failed = exc
            job.done = True
            job.event.set()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the helper thread after the jobs queued before this call (it holds no reference to the group
        afterwards)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout_s)


def _flat(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """A contiguous 1-D view of ``tensor``, or a copy and what writes it back."""
    if tensor.is_contiguous():
        return tensor.view(-1), lambda: None
    work = tensor.contiguous().view(-1)
    return work, lambda: tensor.copy_(work.view(tensor.shape))
