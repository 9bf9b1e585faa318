"""Fused gradient buckets reduced during backward, with a selectable combiner (mean, adasum, adacomp, none).

Parameters are grouped in reverse registration order (roughly the order backward produces their grads) into
flat buckets of ``bucket_mb``; each ``.grad`` is a view into its bucket, so a ready bucket is reduced in place
without a copy. Buckets launch strictly in index order so every rank issues the same collective sequence.
For ``mean`` a bucket is divided by the rank count as it launches (like DDP's hook), so the wire carries
the mean and ``finish()`` has no pass over the result. The last bucket is reduced in ``finish()`` with a
blocking collective: backward is over and nothing is left to overlap it with; earlier buckets that
``finish()`` launches stay non-blocking so that several can be in flight at once (gloo runs them on
parallel threads: blocking them one after another cost a third of the 16 MB bandwidth).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from hpctrain.errors import ConfigError
from hpctrain.runtime import combine
from hpctrain.runtime.comm import Communicator, Handle

COMBINERS = ("mean", "adasum", "adacomp", "none")


@dataclass
class Bucket:
    """One flat buffer and the parameters whose gradients live in it."""

    index: int
    names: list[str]
    params: list[torch.nn.Parameter]
    offsets: list[int]
    flat: torch.Tensor
    ready: int = 0
    launched: bool = False
    handle: Handle | None = None
    wire: torch.Tensor | None = None
    residues: list[torch.Tensor] = field(default_factory=list)
    views: list[torch.Tensor] = field(default_factory=list)  # view(i) for every i, made once
    sent: list[tuple[int, int]] = field(default_factory=list)  # AdaComp: (elements, bytes each) per param
    grads_elsewhere: bool = False  # a hook saw a p.grad that is not its view this step

    @property
    def in_place(self) -> bool:
        """Every parameter's hook ran this step and found autograd's result in its view already."""
        return self.ready == len(self.params) and not self.grads_elsewhere

    def __post_init__(self) -> None:
        self.views = [self.view(i) for i in range(len(self.params))]

    def view(self, i: int) -> torch.Tensor:
        """Parameter i's gradient inside the flat buffer, in the parameter's own memory layout.

        A channels-last weight gets a channels-last gradient view (autograd's layout contract), so
        accumulation writes into the bucket without a copy.
        """
        p = self.params[i]
        chunk = self.flat[self.offsets[i] : self.offsets[i] + p.numel()]
        if p.is_contiguous():
            return chunk.view_as(p)
        return chunk.as_strided(p.shape, p.stride())


class Reducer:
    """Start with ``Reducer(model, comm, combiner=...)``; call ``finish()`` after ``loss.backward()``.

    After ``finish()`` every ``p.grad`` holds the combined gradient. Use ``zero_grad()`` (or
    ``optimizer.zero_grad(set_to_none=False)``) to keep the gradient views; ``set_to_none`` works too but
    costs one copy per parameter per step.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        comm: Communicator,
        combiner: str = "mean",
        compression: str = "none",
        bucket_mb: float = 4.0,
        adacomp_bin_len: int | None = None,
        prescaled: bool = False,
    ) -> None:
        if combiner not in COMBINERS:
            raise ConfigError(f"unknown combiner {combiner!r}", key="train.combiner.name",
                              hint=f"use one of {', '.join(COMBINERS)}")
        if compression not in combine.WIRES:
            raise ConfigError(f"unknown compression {compression!r}", key="train.combiner.compression",
                              hint=f"use one of {', '.join(combine.WIRES)}")
        if compression != "none" and combiner != "mean":
            raise ConfigError(
                f"compression {compression!r} applies to the mean combiner only, not {combiner!r}",
                key="train.combiner.compression", hint="set compression: none",
            )
        if bucket_mb <= 0:
            raise ConfigError(f"bucket_mb must be > 0, got {bucket_mb}", key="train.combiner.bucket_mb")
        self.comm, self.combiner, self.compression = comm, combiner, compression
        # prescaled (mean only): the caller scales the loss by ``loss_scale`` = 1/size before backward, so each
        # rank's gradient arrives as its share of the mean and the wire sum is the mean: no divide pass over
        # the buckets (bit-identical for power-of-two sizes, float-rounding close otherwise).
        self.prescaled = bool(prescaled) and combiner == "mean"
        self.adacomp_bin_len = adacomp_bin_len
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
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
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
            if combiner == "adacomp":
                b.residues = [torch.zeros_like(p) for p in b.params]
        self._next = 0
        # Set to a list to record (event, bucket, perf_counter()) for "launch", "wait" and "done".
        self.timeline: list[tuple[str, int, float]] | None = None

    @property
    def loss_scale(self) -> float:
        """What the caller multiplies the loss by before ``backward()``: ``1/size`` when prescaled, else 1."""
        return 1.0 / self.comm.size if self.prescaled else 1.0

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
        """Start reducing bucket ``b``; ``blocking`` reduces it before returning (no handle to wait on)."""
        self._gather_into_flat(b)
        b.launched = True
        if self.timeline is not None:
            self.timeline.append(("launch", b.index, time.perf_counter()))
        label = f"bucket {b.index}"
        if self.combiner == "mean":
            if self.comm.size == 1 and self.compression == "none":
                return  # the mean of one rank's gradient is that gradient
            if self.compression == "none":
                if not self.prescaled:
                    b.flat.div_(self.comm.size)  # the summed wire then carries the mean
                wire = b.flat
            else:  # pre-divide so the half-precision sum cannot overflow where the mean would not
                share = b.flat if self.prescaled else b.flat / self.comm.size
                wire = b.wire = combine.compress(share, self.compression)
            if blocking:
                self.comm.allreduce_(wire, "sum", label)
                if b.wire is not None:
                    b.flat.copy_(combine.decompress(b.wire, b.flat.dtype))
                    b.wire = None
            else:
                b.handle = self.comm.allreduce_async_(wire, "sum", label)
        elif self.combiner == "adasum":
            self._adasum(b, label)
        elif self.combiner == "adacomp":
            self._adacomp(b, label)

    # -- combiners that need more than one collective
    def _adasum(self, b: Bucket, label: str) -> None:
        n, r = self.comm.size, self.comm.rank
        if n == 1:
            return
        if n & (n - 1) == 0:  # recursive doubling: the same pairing tree as combine.adasum_reduce
            d = 1
            while d < n:
                peer = r ^ d
                other = self.comm.sendrecv(b.flat, peer, f"{label} adasum level {d}")
                for i in range(len(b.params)):
                    mine = b.view(i)
                    theirs = other[b.offsets[i] : b.offsets[i] + mine.numel()].view_as(mine)
                    lo, hi = (mine, theirs) if r < peer else (theirs, mine)
                    mine.copy_(combine.adasum(lo, hi))
                d *= 2
        else:  # other counts: gather every rank's bucket, then the same fold-then-tree as adasum_reduce
            gathered = self.comm.allgather(b.flat, f"{label} adasum gather")
            for i, p in enumerate(b.params):
                s = slice(b.offsets[i], b.offsets[i] + p.numel())
                b.view(i).copy_(combine.adasum_reduce([g[s].view_as(p) for g in gathered]))

    def _adacomp(self, b: Bucket, label: str) -> None:
        """Encode every layer, exchange one packed message per rank, decode and average.

        The wire format (see ``pack_adacomp``) carries each selected element as one signed integer
        ``±(position + 1)`` in the bucket, int32 while the bucket has fewer than 2^31 elements, so an element
        costs 4 bytes instead of an int64 index plus an int8 sign; the layers' scales ride in front.
        """
        n = self.comm.size
        messages = []
        for i, p in enumerate(b.params):
            bin_len = self.adacomp_bin_len or combine.default_bin_len(b.names[i], p.dim())
            msg, b.residues[i] = combine.adacomp_encode(b.residues[i], b.view(i).clone(), bin_len)
            messages.append(msg)
        packed = pack_adacomp(messages, b.offsets, b.flat.numel())
        b.sent = [(m.count, packed.element_size()) for m in messages]
        decoded: list[torch.Tensor] = []
        gathered = self.comm.allgather_varlen(packed, f"{label} adacomp") if n > 1 else [packed]
        for other in gathered:
            dense = torch.zeros_like(b.flat)
            for pos, value in unpack_adacomp(other, len(b.params), b.offsets, [p.numel() for p in b.params]):
                dense[pos] = value.to(dense.dtype)
            decoded.append(dense)
        b.flat.copy_(combine.mean(decoded))

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
                if b.wire is not None:
                    b.flat.copy_(combine.decompress(b.wire, b.flat.dtype))
            # Every p.grad is its bucket view again: _launch (via _gather_into_flat) made sure of it.
            b.ready, b.launched, b.handle, b.wire, b.grads_elsewhere = 0, False, None, None, False
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


def pack_adacomp(messages: list[combine.AdaCompMessage], offsets: list[int], bucket_numel: int) -> torch.Tensor:
    """One rank's AdaComp messages for a bucket as one integer tensor: the float64 scales (as pairs of int32,
    or int64 each), then ``sign * (offset + index + 1)`` for every selected element, layer after layer."""
    dtype = torch.int32 if bucket_numel < 2**31 - 1 else torch.int64
    scales = torch.tensor([m.scale for m in messages], dtype=torch.float64).view(dtype)
    parts = [scales]
    for m, off in zip(messages, offsets, strict=True):
        parts.append((m.indices.to(dtype) + (off + 1)) * m.signs.to(dtype))
    return torch.cat(parts)


def unpack_adacomp(packed: torch.Tensor, layers: int, offsets: list[int],
                   sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of ``pack_adacomp``: per layer, (bucket positions int64, values ±scale float64)."""
    per_scale = 8 // packed.element_size()
    scales = packed[: layers * per_scale].clone().view(torch.float64)  # gathered slices may sit unaligned
    body = packed[layers * per_scale :].to(torch.int64)
    pos = body.abs() - 1
    out = []
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
        sel = (pos >= off) & (pos < off + size)
        out.append((pos[sel], body[sel].sign().to(torch.float64) * scales[i]))
    return out


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
        w = torch.arange(1, x.numel() + 1, dtype=torch.float64)  # position-weighted: catches permutations
        rows.append(torch.stack([x.sum(), (x * w).sum()]))
    return torch.stack(rows) if rows else torch.zeros((0, 2), dtype=torch.float64)


def check_sync(model: torch.nn.Module, comm: Communicator) -> list[str]:
    """Names of parameters/buffers whose float64 checksums differ between ranks (empty when in sync)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    sums = comm.allgather(_checksums(t for _, t in named), label="check_sync")
    bad = torch.zeros(len(named), dtype=torch.bool)
    for s in sums[1:]:
        bad |= ~((s == sums[0]) | (s.isnan() & sums[0].isnan())).all(dim=1)
    return [name for (name, _), b in zip(named, bad.tolist(), strict=True) if b]
