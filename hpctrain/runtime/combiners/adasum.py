"""Adasum (Maleki et al.; Horovod's pairwise rule per layer), over the gradients or over the optimizer's update.

Power-of-two rank counts combine by recursive doubling: at distance d = 1, 2, 4, ... each rank swaps its bucket
with rank ^ d and both apply ``combine.adasum`` layer by layer, lower rank first: the pairing tree of
``combine.adasum_reduce``. Other counts gather every rank's bucket and run ``adasum_reduce`` itself. On
``delta``, as Horovod recommends, each rank takes its local optimizer step and the updates are combined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hpctrain.runtime import combine
from hpctrain.runtime.combiners.base import Combiner, GradBucket
from hpctrain.runtime.comm.base import Communicator, Handle
from hpctrain.runtime.optim import apply_deltas, delta_step

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig

MODES = ("gradient", "delta")


class AdasumCombiner(Combiner):
    name = "adasum"

    def __init__(self, comm: Communicator, params: Sequence[torch.Tensor] = (), *, on: str = "gradient") -> None:
        super().__init__(comm, params)
        if on not in MODES:
            raise ValueError(f"AdasumCombiner: on must be one of {MODES}, not {on!r}")
        self.on = on

    @classmethod
    def from_config(cls, config: CombinerConfig, comm: Communicator,
                    params: Sequence[torch.Tensor]) -> AdasumCombiner:
        return cls(comm, params, on=config.adasum_on)

    @property
    def combines_in_backward(self) -> bool:
        return self.on == "gradient"

    @property
    def ranks_in_sync(self) -> bool:
        return self.on == "gradient"  # on deltas each rank's optimizer state advances on its own gradients

    def launch(self, bucket: GradBucket, blocking: bool) -> Handle | None:
        n, r = self.comm.size, self.comm.rank
        if n == 1:
            return None
        label = f"bucket {bucket.index}"
        if n & (n - 1) == 0:
            d = 1
            while d < n:
                peer = r ^ d
                theirs = bucket.with_flat(self.comm.sendrecv(bucket.flat, peer, f"{label} adasum level {d}"))
                for mine, other in zip(bucket.views, theirs.views, strict=True):
                    lo, hi = (mine, other) if r < peer else (other, mine)
                    mine.copy_(combine.adasum(lo, hi))
                d *= 2
        else:
            gathered = [bucket.with_flat(g) for g in self.comm.allgather(bucket.flat, f"{label} adasum gather")]
            _reduce_into(gathered, [bucket])
        return None


    def after_backward(self) -> None:
        if self.on == "gradient":
            self.reducer.finish()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.on == "gradient":
            optimizer.step()
            return
        deltas = delta_step(optimizer, self.params)
        with torch.no_grad():
            for p, d in zip(self.params, deltas, strict=True):
                p.grad.copy_(d)  # into the bucket views
        self.reducer.finish()  # every bucket: Adasum over the updates, not the gradients
        apply_deltas(self.params, [p.grad for p in self.params])


def _reduce_into(inputs: list[GradBucket], outputs: Sequence[GradBucket]) -> None:
    """Layer by layer, ``adasum_reduce`` over the inputs in rank order, written into every output bucket."""
    for i in range(len(inputs[0].params)):
        combined = combine.adasum_reduce([b.views[i] for b in inputs])
        for out in outputs:
            out.views[i].copy_(combined)
