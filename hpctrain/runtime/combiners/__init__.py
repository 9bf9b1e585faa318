"""Gradient combiners as strategies (base.py holds the contract), registered by the name a job spec uses.

Adding a combiner: one module with a ``Combiner`` subclass, registered by name in the combiner registry
(``COMBINERS``, config/backends.py: a built-in's import path there, or an installed package's entry point in the
group ``hpctrain.combiners``); job specs may then ask for it, and ``hpctrain plan`` refuses it until
planning/model.py has a cost model for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hpctrain.config.backends import COMBINERS
from hpctrain.errors import ConfigError
from hpctrain.runtime.combiners.adacomp import AdaCompCombiner
from hpctrain.runtime.combiners.adasum import AdasumCombiner
from hpctrain.runtime.combiners.base import Combiner, GradBucket
from hpctrain.runtime.combiners.dasgd import DaSGDCombiner
from hpctrain.runtime.combiners.mean import MeanCombiner
from hpctrain.runtime.comm.base import Communicator

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig

__all__ = ["COMBINERS", "AdaCompCombiner", "AdasumCombiner", "Combiner", "DaSGDCombiner", "GradBucket",
           "MeanCombiner", "build_combiner"]


def build_combiner(config: CombinerConfig, comm: Communicator, params: Sequence[torch.Tensor]) -> Combiner:
    """The combiner ``train.combiner`` names, for this rank's ``params`` (model order)."""
    if config.name not in COMBINERS:
        raise ConfigError(f"unknown combiner {config.name!r}", key="train.combiner.name",
                          hint=f"use one of {', '.join(COMBINERS)}")
    cls: type[Combiner] = COMBINERS.load(config.name)
    if config.compression not in cls.wires:
        raise ConfigError(f"compression {config.compression!r} does not apply to the {config.name} combiner",
                          key="train.combiner.compression",
                          hint=f"use {' or '.join(cls.wires)} with {config.name}")
    return cls.from_config(config, comm, params)
