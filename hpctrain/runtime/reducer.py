"""Fused gradient buckets reduced during backward; a combiner strategy (runtime/combiners/) reduces each one.

Parameters are grouped in reverse registration order (roughly the order backward produces their grads) into
flat buckets of ``bucket_mb``; each ``.grad`` is a view into its bucket, so a ready bucket is handed to the
combiner's ``launch`` in place, without a copy, as DDP hands a bucket to its comm hook. Buckets launch
strictly in index order so every rank issues the same collective sequence. The last bucket is launched in
``finish()`` as blocking: backward is over and nothing is left to overlap it with; earlier buckets that
``finish()`` launches stay non-blocking so that several can be in flight at once (gloo runs them on
parallel threads: blocking them one after another cost a third of the 16 MB bandwidth).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from hpctrain.errors import ConfigError
from hpctrain.runtime.combiners.base import Combiner, GradBucket
from hpctrain.runtime.combiners.mean import MeanCombiner
from hpctrain.runtime.comm.base import Communicator, Handle


@dataclass
class Bucket(GradBucket):
    """A ``GradBucket`` and what the reducer tracks of it during one step."""

    ready: int = 0
    launched: bool = False
    handle: Handle | None = None
    grads_elsewhere: bool = False  # a hook saw a p.grad that is not its view this step

    @property
    def in_place(self) -> bool:
        """Every parameter's hook ran this step and found autograd's result in its view already."""
        return self.ready == len(self.params) and not self.grads_elsewhere


class Reducer:
    """Start with ``Reducer(model, comm, combiner)``; call ``finish()`` after ``loss.backward()``.

    After ``finish()`` every ``p.grad`` holds the combined gradient. Use ``zero_grad()`` (or
    ``optimizer.zero_grad(set_to_none=False)``) to keep the gradient views; ``set_to_none`` works too but
    costs one copy per parameter per step. Without a combiner the bucket is averaged (``MeanCombiner``).
    """

    def __init__(self, model: torch.nn.Module, comm: Communicator, combiner: Combiner | None = None,
                 bucket_mb: float = 4.0) -> None:
        if bucket_mb <= 0:
            raise ConfigError(f"bucket_mb must be > 0, got {bucket_mb}", key="train.combiner.bucket_mb")
        self.comm = comm
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]  # model order, as optimizers and combiners see them
        self.combiner = combiner if combiner is not None else MeanCombiner(comm, self.params)
        self.buckets = _make_buckets(list(reversed(named)), int(bucket_mb * 2**20))
        self._where: dict[int, tuple[Bucket, int]] = {}
        self._hooks = []
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self._where[id(p)] = (b, i)
                with torch.no_grad():
                    if p.grad is not None:
                        b.view(i).copy_(p.grad)
                p.grad = b.views[i]
                if self.combiner.combines_in_backward:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        self._next = 0
        # Set to a list to record (event, bucket, perf_counter()) for "launch", "wait" and "done".
        self.timeline: list[tuple[str, int, float]] | None = None
        self.combiner.attach(self)

    @property
    def loss_scale(self) -> float:
        """What the caller multiplies the loss by before ``backward()`` (the combiner's)."""
        return self.combiner.loss_scale

    # -- backward hooks
    def _on_grad_ready(self, p: torch.Tensor) -> None:
        b, i = self._where[id(p)]
        b.ready += 1
        if p.grad is not b.views[i]:  # set_to_none, or a user's own .grad: _launch must gather this bucket
            b.grads_elsewhere = True
        if self._next:  # something is in flight: let back-ends that need a poke (MPI) advance it
            self.comm.progress()
        # The last bucket is left to finish(): nothing remains to overlap it with, and there it is reduced
        # with a blocking collective, which is faster than a non-blocking one (MPICH runs Iallreduce as a
        # generic schedule; Allreduce has tuned shared-memory paths).
        while self._next < len(self.buckets) - 1:
            nxt = self.buckets[self._next]
            if nxt.ready < len(nxt.params):
                break
            self._launch(nxt)
            self._next += 1

    def _gather_into_flat(self, b: Bucket) -> None:
        if b.in_place:  # every hook of this step saw autograd accumulate into our view: nothing to gather
            return
        for p, view in zip(b.params, b.views, strict=True):
            g = p.grad
            if g is view:  # the common case: autograd accumulated into our view in place
                continue
            with torch.no_grad():
                if g is None:  # unused in this forward: contributes zeros, like DDP
                    view.zero_()
                elif g.data_ptr() != view.data_ptr():
                    view.copy_(g)
            p.grad = view

    def _launch(self, b: Bucket, blocking: bool = False) -> None:
        """Hand bucket ``b`` to the combiner; ``blocking`` asks for it reduced before returning."""
        self._gather_into_flat(b)
        b.launched = True
        if self.timeline is not None:
            self.timeline.append(("launch", b.index, time.perf_counter()))
        b.handle = self.combiner.launch(b, blocking)

    # -- end of step
    def finish(self) -> None:
        """Launch what backward did not (unused parameters), wait for every bucket, write ``p.grad``."""
        last = len(self.buckets) - 1
        while self._next <= last:  # unused parameters' buckets, and the last one (only it blocks)
            self._launch(self.buckets[self._next], blocking=self._next == last)
            self._next += 1
        tl = self.timeline
        for b in self.buckets:
            if b.handle is not None:
                if tl is not None:
                    tl.append(("wait", b.index, time.perf_counter()))
                b.handle.wait()
                if tl is not None:
                    tl.append(("done", b.index, time.perf_counter()))
            # Every p.grad is its bucket view again: _launch (via _gather_into_flat) made sure of it.
            b.ready, b.launched, b.handle, b.grads_elsewhere = 0, False, None, False
        self._next = 0

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.flat.zero_()
            for p, view in zip(b.params, b.views, strict=True):
                if p.grad is not view:
                    p.grad = view

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def _make_buckets(named: list[tuple[str, torch.nn.Parameter]], cap_bytes: int) -> list[Bucket]:
    buckets: list[Bucket] = []
    cur: list[tuple[str, torch.nn.Parameter]] = []
    size = 0

    def close() -> None:
        if cur:
            offsets, total = [], 0
            for _, p in cur:
                offsets.append(total)
                total += p.numel()
            p0 = cur[0][1]
            flat = torch.zeros(total, dtype=p0.dtype, device=p0.device)
            buckets.append(Bucket(len(buckets), [n for n, _ in cur], [p for _, p in cur], offsets, flat))

    for name, p in named:
        nbytes = p.numel() * p.element_size()
        if cur and (size + nbytes > cap_bytes or p.dtype != cur[0][1].dtype or p.device != cur[0][1].device):
            close()
            cur, size = [], 0
        cur.append((name, p))
        size += nbytes
    close()
    return buckets


def broadcast_model(model: torch.nn.Module, comm: Communicator, root: int = 0) -> None:
    """Make every rank start from root's parameters and buffers (BatchNorm statistics included)."""
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            comm.broadcast_(t.data, root, label=f"broadcast {name}")


def _checksums(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    rows = []
    for t in tensors:
        x = t.detach().reshape(-1).to(torch.float64)
        w = torch.arange(1, x.numel() + 1, dtype=torch.float64, device=x.device)  # position-weighted: permutations
        rows.append(torch.stack([x.sum(), (x * w).sum()]).cpu())  # a few numbers: compared on the host
    return torch.stack(rows) if rows else torch.zeros((0, 2), dtype=torch.float64)


def check_sync(model: torch.nn.Module, comm: Communicator) -> list[str]:
    """Names of parameters/buffers whose float64 checksums differ between ranks (empty when in sync)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    sums = comm.allgather(_checksums(t for _, t in named), label="check_sync")
    bad = torch.zeros(len(named), dtype=torch.bool)
    for s in sums[1:]:
        bad |= ~((s == sums[0]) | (s.isnan() & sums[0].isnan())).all(dim=1)
    return [name for (name, _), b in zip(named, bad.tolist(), strict=True) if b]
