"""DaSGD (Zhou et al. 2020): local SGD whose periodic model average stays in flight for ``delay`` steps.

Gradients are not combined: each rank steps on its own, and every ``period`` steps ``combine.DelayedAverager``
starts a non-blocking average of the parameters and merges it ``delay`` steps later. An average in flight
is part of the checkpoint (waited for, not merged early), so a resumed run takes the same trajectory. At the
end the ranks average once more so that all hold the same final model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from hpctrain.runtime.combine import AverageHandle, DelayedAverager
from hpctrain.runtime.combiners.base import Combiner, GradBucket
from hpctrain.runtime.comm.base import Communicator, Handle

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig

class DaSGDCombiner(Combiner):
    """Each rank steps on its own gradient; every ``period`` steps an all-reduce over ``comm`` starts the average
    of the parameters, merged ``delay`` steps later (``combine.DelayedAverager``)."""

    name = "dasgd"

    def __init__(self, comm: Communicator, params: Sequence[torch.Tensor] = (), *, period: int = 1,
                 delay: int = 1) -> None:
        super().__init__(comm, params)
        self.averager = DelayedAverager(self._all_reduce_average, period, delay)

    @classmethod
    def from_config(cls, config: CombinerConfig, comm: Communicator,
                    params: Sequence[torch.Tensor]) -> DaSGDCombiner:
        return cls(comm, params, period=config.period, delay=config.delay)

    @property
    def ranks_in_sync(self) -> bool:
        return False

    def launch(self, bucket: GradBucket, blocking: bool) -> Handle | None:
        return None  # each rank steps on its own gradient


    def after_step(self) -> None:
        self.averager.after_step(self.params)
        if self.averager.in_flight:
            self.comm.progress()  # MPI advances a non-blocking average only when MPI is called

    def finish_training(self) -> None:
        """Merge what is in flight, then average the models once more so every rank ends identical."""
        self.averager.flush(self.params)
        averaged = self.averager.start_average([p.detach().clone() for p in self.params]).wait()
        with torch.no_grad():
            for p, avg in zip(self.params, averaged, strict=True):
                p.copy_(avg)

    def flush(self) -> None:
        self.averager.flush(self.params)

    def state_dict(self) -> dict[str, Any]:
        # An average in flight is waited for but not merged early: saving must not change the trajectory.
        return {"dasgd": self.averager.state_dict(include_in_flight=True)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "dasgd" in state:
            self.averager.load_state_dict(state["dasgd"])

    def elastic_restart(self, step: int) -> None:
        self.averager.steps = step  # keep the averaging period aligned with the step count

    def _all_reduce_average(self, tensors: list[torch.Tensor]) -> AverageHandle:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        sent = self.comm.allreduce_async_(flat, "sum", "dasgd average")
        return _Average(sent, flat, tensors, self.comm.size)


class _Average:
    """An all-reduce of the concatenated tensors in flight; ``wait()`` gives them back averaged, in order."""

    def __init__(self, sent: Handle, flat: torch.Tensor, like: list[torch.Tensor], ranks: int) -> None:
        self.sent, self.flat, self.like, self.ranks = sent, flat, like, ranks

    def wait(self) -> list[torch.Tensor]:
        self.sent.wait()
        self.flat.div_(self.ranks)
        out, offset = [], 0
        for t in self.like:
            out.append(self.flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        return out
