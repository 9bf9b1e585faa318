"""Gradient combiners as strategies (base.py holds the contract), registered by the name a job spec uses.

Adding a combiner: one module with a ``Combiner`` subclass, its name in ``COMBINERS`` below, and the same
name in ``CombinerConfig.name`` (config/job.py) so that job specs may ask for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hpctrain.errors import ConfigError
from hpctrain.runtime.combiners.adacomp import AdaCompCombiner
from hpctrain.runtime.combiners.adasum import AdasumCombiner
from hpctrain.runtime.combiners.base import Combiner, GradBucket, Peerless
from hpctrain.runtime.combiners.dasgd import DaSGDCombiner
from hpctrain.runtime.combiners.mean import MeanCombiner
from hpctrain.runtime.comm import Communicator

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig

COMBINERS: dict[str, type[Combiner]] = {
    c.name: c for c in (MeanCombiner, AdasumCombiner, AdaCompCombiner, DaSGDCombiner)
}

__all__ = ["COMBINERS", "AdaCompCombiner", "AdasumCombiner", "Combiner", "DaSGDCombiner", "GradBucket",
           "MeanCombiner", "Peerless", "build_combiner"]


def build_combiner(config: CombinerConfig, comm: Communicator, params: Sequence[torch.Tensor]) -> Combiner:
    """The combiner ``train.combiner`` names, for this rank's ``params`` (model order)."""
    cls = COMBINERS.get(config.name)
    if cls is None:
        raise ConfigError(f"unknown combiner {config.name!r}", key="train.combiner.name",
                          hint=f"use one of {', '.join(COMBINERS)}")
    if config.compression not in cls.wires:
        raise ConfigError(f"compression {config.compression!r} does not apply to the {config.name} combiner",
                          key="train.combiner.compression",
                          hint=f"use {' or '.join(cls.wires)} with {config.name}")
    return cls.from_config(config, comm, params)
