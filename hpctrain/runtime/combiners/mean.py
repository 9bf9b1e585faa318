"""The mean of the ranks' gradients, one all-reduce per bucket, on a full- or half-precision wire.

Each rank puts its share of the mean on the wire (its gradient / ranks), so the wire's sum is the mean and
nothing divides afterwards. ``prescaled`` (what the trainer uses) moves that division into the loss: the
caller scales the loss by ``loss_scale`` = 1/ranks before backward and the bucket is sent as it is
(bit-identical for power-of-two rank counts, float-rounding close otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hpctrain.errors import ConfigError
from hpctrain.runtime import combine
from hpctrain.runtime.combiners.base import Combiner, GradBucket
from hpctrain.runtime.comm.base import Communicator, Handle

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig


class MeanCombiner(Combiner):
    name = "mean"
    wires = tuple(combine.WIRES)

    def __init__(self, comm: Communicator, params: Sequence[torch.Tensor] = (), *, compression: str = "none",
                 prescaled: bool = False) -> None:
        super().__init__(comm, params)
        if compression not in combine.WIRES:
            raise ConfigError(f"unknown compression {compression!r}", key="train.combiner.compression",
                              hint=f"use one of {', '.join(combine.WIRES)}")
        self.compression, self.prescaled = compression, prescaled

    @classmethod
    def from_config(cls, config: CombinerConfig, comm: Communicator,
                    params: Sequence[torch.Tensor]) -> MeanCombiner:
        return cls(comm, params, compression=config.compression, prescaled=True)

    @property
    def loss_scale(self) -> float:
        return 1.0 / self.comm.size if self.prescaled else 1.0

    def encode(self, bucket: GradBucket) -> torch.Tensor:
        """What this rank sends: its share of the mean, in the wire dtype (the flat buffer itself when it can)."""
        if self.compression == "none":
            if not self.prescaled:
                bucket.flat.div_(self.comm.size)
            return bucket.flat
        # divided before compressing, so the half-precision sum cannot overflow where the mean would not
        share = bucket.flat if self.prescaled else bucket.flat / self.comm.size
        return combine.compress(share, self.compression)

    @staticmethod
    def decode(total: torch.Tensor, bucket: GradBucket) -> None:
        """The summed wire (the mean) into the bucket."""
        if total is not bucket.flat:
            bucket.flat.copy_(combine.decompress(total, bucket.flat.dtype))

    def launch(self, bucket: GradBucket, blocking: bool) -> Handle | None:
        if self.comm.size == 1 and self.compression == "none":
            return None  # the mean of one rank's gradient is that gradient
        wire = self.encode(bucket)
        label = f"bucket {bucket.index}"
        if blocking:
            self.comm.allreduce_(wire, "sum", label)
            self.decode(wire, bucket)
            return None
        sent = self.comm.allreduce_async_(wire, "sum", label)

        def wait() -> None:
            sent.wait()
            self.decode(wire, bucket)

        return Handle(wait)
