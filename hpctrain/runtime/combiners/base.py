"""The contract of a gradient combiner: a strategy the reducer calls once per bucket, as DDP calls a comm hook.

A combiner owns all that differs between mean, Adasum, AdaComp and DaSGD: how one bucket is combined across
ranks, what the optimizer step and the steps around it become, its state and checkpoint state, its flush at
the end of training, whether ranks stay identical, the loss scale, and its metrics. The reducer and the
training loop call it and never ask which combiner it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from hpctrain.errors import RuntimeFailure
from hpctrain.runtime.comm.base import Communicator, Handle

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig


@dataclass
class GradBucket:
    """One flat buffer and the parameters whose gradients are views into it (DDP's ``GradBucket``).

    ``params`` give each gradient's shape and memory layout; a combiner never reads their values. Another
    rank's bucket is ``bucket.with_flat(its_gradients)``: the same layout over another buffer.
    """

    index: int
    names: list[str]
    params: list[torch.Tensor]
    offsets: list[int]
    flat: torch.Tensor
    views: list[torch.Tensor] = field(default_factory=list, repr=False)  # view(i) for every i, made once

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

    def with_flat(self, flat: torch.Tensor) -> GradBucket:
        """The same layout over ``flat`` (another rank's or a simulated worker's gradients)."""
        return GradBucket(self.index, self.names, self.params, self.offsets, flat)


class BucketOwner(Protocol):
    """What a combiner uses of the reducer that owns its buckets (``runtime/reducer.py``'s ``Reducer`` is one)."""

    buckets: Sequence[GradBucket]

    def finish(self) -> None:
        """Complete every bucket of this step: each ``p.grad`` then holds the combined gradient."""


class Combiner(ABC):
    """One rank's side of a combiner. Built by ``build_combiner``; the ``Reducer`` attaches itself.

    Per step the training loop calls: ``loss_scale`` (before backward), ``after_backward``, ``optimizer_step``,
    ``after_step``; at the last step ``finish_training``; after the loop ``flush``. The reducer calls
    ``launch`` for every bucket, in bucket order, on every rank.
    """

    name: ClassVar[str]
    wires: ClassVar[tuple[str, ...]] = ("none",)  # train.combiner.compression values this combiner takes

    def __init__(self, comm: Communicator, params: Sequence[torch.Tensor]) -> None:
        self.comm = comm
        self.params = list(params)  # in model order; what an optimizer step updates
        self._reducer: BucketOwner | None = None

    @classmethod
    @abstractmethod
    def from_config(cls, config: CombinerConfig, comm: Communicator, params: Sequence[torch.Tensor]) -> Combiner:
        """This combiner as ``train.combiner`` describes it."""

    # -------------------------------------------------------------------------------- per bucket (the hook)

    @abstractmethod
    def launch(self, bucket: GradBucket, blocking: bool) -> Handle | None:
        """Start combining ``bucket.flat`` across the ranks, in place.

        Returns a handle whose ``wait()`` completes it, or None when it is complete already. ``blocking`` asks
        for completion before returning (the reducer's last bucket: nothing is left to overlap it with).
        """

    @property
    def combines_in_backward(self) -> bool:
        """Whether the reducer launches buckets from backward hooks (False: the combiner launches them)."""
        return True

    # ------------------------------------------------------------------------------- around the optimizer

    @property
    def loss_scale(self) -> float:
        """What the loss is multiplied by before ``backward()``."""
        return 1.0

    @property
    def ranks_in_sync(self) -> bool:
        """Whether every rank holds the same parameters and optimizer state after a step."""
        return True

    def attach(self, reducer: BucketOwner) -> None:
        """Called by the reducer built for this combiner, once its buckets exist."""
        self._reducer = reducer

    @property
    def reducer(self) -> BucketOwner:
        if self._reducer is None:
            raise RuntimeFailure(f"combiner {self.name!r} is used before a Reducer was built for it",
                                 hint="build Reducer(model, comm, combiner) first (report this as a bug)")
        return self._reducer

    def after_backward(self) -> None:
        """Backward is over: complete the buckets, so every ``p.grad`` holds the combined gradient."""
        self.reducer.finish()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def after_step(self) -> None:
        """After each optimizer step (periodic model averaging goes here)."""
        return None

    def finish_training(self) -> None:
        """At the last step, before the final checkpoint: make every rank hold the final model."""
        return None

    def flush(self) -> None:
        """Merge into the parameters whatever is still in flight (the run ends or is saved for the last time)."""
        return None

    # ------------------------------------------------------------------------------------ state, metrics

    def state_dict(self) -> dict[str, Any]:
        """This rank's combiner state for an exact resume (saved in the rank's checkpoint file)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (same world size)."""
        return None

    def elastic_restart(self, step: int) -> None:
        """Resuming ``step`` on another world size: the per-rank state starts afresh, aligned to ``step``."""
        return None

    def interval_metrics(self) -> dict[str, float]:
        """Values for this logging interval's metrics record (averaged over ranks by the caller)."""
        return {}
