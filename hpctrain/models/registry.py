"""Model plug-ins by name: ``ffn``, ``resnet``, ``lstm``, or a user's ``package.module:factory``.

A user's factory receives the job spec's ``model_args`` as keyword arguments and returns either a
``TrainingTask`` (full control of data) or a plain ``nn.Module`` trained on synthetic regression data
described by ``data.synthetic`` ({input_shape, outputs, samples}). The names and the schemas of the
built-ins are in config/catalog.py, where the laptop reads them without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hpctrain.config.catalog import MODELS, unknown_model
from hpctrain.errors import ConfigError
from hpctrain.models.task import ShardedIndexStream, TaskContext, TrainingTask


def _import(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import model module {module_name!r}: {exc}", key="model",
                          hint="check the name and that the package is installed on the compute nodes") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r}", key="model") from None


def build_task(model: str, ctx: TaskContext) -> TrainingTask:
    """The training task for a spec's ``model`` value."""
    if model in MODELS:
        return _import(MODELS.load(model).task)(ctx)
    if ":" not in model:
        raise unknown_model(model)
    factory = _import(model)
    try:
        made = factory(**ctx.model_args)
    except TypeError as exc:
        raise ConfigError(f"{model} does not accept model_args {sorted(ctx.model_args)}: {exc}",
                          key="model_args") from None
    if isinstance(made, TrainingTask):
        return made
    if isinstance(made, nn.Module):
        return SyntheticRegressionTask(made, ctx)
    raise ConfigError(f"{model} returned {type(made).__name__}; expected an nn.Module or a TrainingTask",
                      key="model")


class SyntheticRegressionTask(TrainingTask):
    """A user's nn.Module fitted to a fixed random linear teacher (MSE): enough to exercise the runtime."""

    def __init__(self, model: nn.Module, ctx: TaskContext) -> None:
        spec = dict(ctx.data.get("synthetic", {}))
        shape = tuple(spec.get("input_shape", [16]))
        outputs = int(spec.get("outputs", 1))
        samples = int(spec.get("samples", 4096))
        generator = torch.Generator().manual_seed(ctx.seed)
        self.inputs = torch.randn((samples, *shape), generator=generator)
        teacher = torch.randn(int(torch.tensor(shape).prod()), outputs, generator=generator)
        self.targets = self.inputs.flatten(1) @ teacher
        self.model = model
        self.batch = ctx.batch_per_rank
        self.stream = ShardedIndexStream(samples, ctx.batch_per_rank, ctx.rank, ctx.world_size, ctx.seed)

    @property
    def samples_per_step(self) -> int:
        return self.batch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.stream.next()
        return self.inputs[idx], self.targets[idx]

    def forward_loss(self, batch: Any) -> tuple[torch.Tensor, Any]:
        x, y = batch
        return nn.functional.mse_loss(self.model(x).reshape(y.shape), y), None

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
