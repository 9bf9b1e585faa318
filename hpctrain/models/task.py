"""The contract between a model plug-in and the training runtime.

A ``TrainingTask`` owns a model and its rank's share of the data. The runtime calls ``next_batch``,
``forward_loss`` (then runs backward and reduces gradients itself), and ``observe`` after the optimizer
step; it never needs to know which model it trains.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.models.shuffle import epoch_permutation


def _raise_or_wait(barrier: Callable[[], None], error: BaseException | None) -> None:
    """``TaskContext.agree`` where no collective was given: this rank's own error, else the context's barrier (so
    the ranks that did not take the step still wait for the one that did)."""
    if error is not None:
        raise error
    barrier()


@dataclass(frozen=True)
class TaskContext:
    """What a plug-in needs to build its task: the spec's model/data sections and where it runs."""

    model_args: dict[str, Any]
    data: dict[str, Any]
    batch_per_rank: int
    seed: int
    rank: int
    world_size: int
    run_dir: Path
    device: torch.device
    barrier: Callable[[], None] = field(default=lambda: None)
    local_rank: int = 0  # the rank on its node: 0 reads what one process per node reads (ffn/training/node_volume.py)
    # The forward's arithmetic (train.precision, resolved for this device: runtime/precision.py). The runtime runs
    # forward_loss under bfloat16 autocast when it is "bfloat16"; a task only keeps its model autocast-able.
    precision: str = "float32"
    # Collective: every rank passes its error (None when its step went well); when any rank failed, every rank
    # raises that rank's error (runtime/comm/base.py, Communicator.agree). A step only some ranks take (rank 0
    # prepares the data) ends in it instead of a barrier, so a failure there reaches every rank as itself.
    agree: Callable[[BaseException | None], None] | None = None

    def __post_init__(self) -> None:
        if self.agree is None:
            object.__setattr__(self, "agree", partial(_raise_or_wait, self.barrier))


class TrainingTask(ABC):
    """One rank's model and data stream. Subclasses must be deterministic given seed, rank and position."""

    model: torch.nn.Module
    sample_unit: str = "samples"

    @property
    @abstractmethod
    def samples_per_step(self) -> int:
        """Samples (FOVs for the FFN) this rank processes per step."""

    @abstractmethod
    def next_batch(self) -> Any:
        """The next local batch (advances the data position)."""

    @abstractmethod
    def forward_loss(self, batch: Any) -> tuple[torch.Tensor, Any]:
        """Forward pass: the scalar loss (mean over the local batch) and anything ``observe`` needs."""

    def observe(self, batch: Any, aux: Any) -> dict[str, float]:
        """Called after the optimizer step with the forward's output; returns metrics to log."""
        return {}

    def interval_metrics(self) -> dict[str, float]:
        """Metrics accumulated since the last logging interval (called at each log step, then reset)."""
        return {}

    def evaluate(self) -> dict[str, float]:
        """Optional held-out evaluation at the end of training (rank 0)."""
        return {}

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Data position and any RNG of the data pipeline, for exact resume."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class ShardedIndexStream:
    """Index batches for one rank: each epoch a global permutation, dealt round-robin so ranks never overlap.

    The permutation (models/shuffle.py) is evaluated only at this rank's positions ``skip + rank + k * world``:
    per epoch a rank computes and holds ``count / world`` indices, never all ``count`` of them.
    The position is global: ``skip`` samples of the epoch's permutation were taken before this stream's
    sharding began (non-zero only after an elastic restart), then every rank took ``offset`` more. A state
    saved by another world size is re-sharded on load: the new ranks deal the rest of that epoch's
    permutation (cut to whole steps) among themselves, so no sample of the epoch is seen twice.
    """

    def __init__(self, count: int, batch: int, rank: int, world_size: int, seed: int) -> None:
        if count < batch * world_size:
            raise ValueError(f"{count} samples cannot fill one step of {world_size} ranks x {batch}")
        self.count, self.batch, self.rank, self.world, self.seed = count, batch, rank, world_size, seed
        self.epoch, self.offset, self.skip = 0, 0, 0
        self._open_epoch()

    def _open_epoch(self) -> None:
        step = self.batch * self.world
        usable = (self.count // step) * step
        rest = max(0, (usable - self.skip) // step) * step  # whole steps left in this epoch after ``skip``
        self._length = rest // self.world  # this rank's samples in what is left of the epoch
        self._permutation = epoch_permutation(self.count, self.seed, self.epoch)

    def next(self) -> torch.Tensor:
        if self.offset + self.batch > self._length:
            self.epoch, self.offset, self.skip = self.epoch + 1, 0, 0
            self._open_epoch()
        positions = self.skip + self.rank + self.world * np.arange(self.offset, self.offset + self.batch)
        self.offset += self.batch
        return torch.from_numpy(self._permutation[positions])

    @property
    def position(self) -> int:
        """Samples of the current epoch's permutation taken by all ranks together."""
        return self.skip + self.offset * self.world

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "skip": self.skip, "world": self.world}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position; one saved by a different world size continues from its global position."""
        world = int(state.get("world", self.world))
        self.epoch = int(state["epoch"])
        if world == self.world:
            self.offset, self.skip = int(state["offset"]), int(state.get("skip", 0))
        else:
            self.offset, self.skip = 0, int(state.get("skip", 0)) + int(state["offset"]) * world
        self._open_epoch()
