"""Tiny user factories for tests/test_trainer.py, named in specs as ``tests.mp_helpers.trainer_models:NAME``.

``logged`` returns a TrainingTask (the registry's synthetic regression on a user module) that appends, after
every optimizer step, a SHA-256 of this rank's parameters to ``LOG_DIR/rank-N.jsonl``: an independent record
of whether the ranks hold identical parameters, step by step, beside the trainer's own ``--check-sync``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.launch_env import detect_launch_env
from hpctrain.models.registry import SyntheticRegressionTask
from hpctrain.models.task import TaskContext


def tiny(hidden: int = 8, inputs: int = 6, outputs: int = 2, seed: int = 0) -> nn.Module:
    """A two-layer MLP whose initial weights depend only on ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


def tiny_conv(channels: int = 4, seed: int = 0) -> nn.Module:
    """A conv layer and a linear head, so AdaComp sees both layer kinds (input 1x8x8, 2 outputs)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.Tanh(), nn.Flatten(),
                         nn.Linear(channels * 64, 2))


def parameters_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


class LoggedTask(SyntheticRegressionTask):
    """Synthetic regression that logs a digest of the parameters after each step, per rank."""

    def __init__(self, model: nn.Module, ctx: TaskContext, log_dir: Path) -> None:
        super().__init__(model, ctx)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"rank-{ctx.rank}.jsonl"
        self.steps = 0

    def observe(self, batch: Any, aux: Any) -> dict[str, float]:
        self.steps += 1
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self.steps, "pid": os.getpid(),
                                "digest": parameters_digest(self.model)}) + "\n")
        return {}


def logged(log_dir: str, conv: bool = False, samples: int = 512, batch_per_rank: int = 4, seed: int = 0,
           hidden: int = 8) -> LoggedTask:
    """``tiny`` (or ``tiny_conv`` with ``conv: true``) trained on synthetic data, logging parameter digests.

    A factory sees only model_args, so the rank comes from the launcher's environment and the batch and
    seed are repeated in model_args (tests keep them equal to train.batch_per_rank and train.seed).
    """
    env = detect_launch_env(os.environ)
    model = tiny_conv(seed=seed) if conv else tiny(hidden=hidden, seed=seed)
    shape = [1, 8, 8] if conv else [6]
    ctx = TaskContext(model_args={}, data={"synthetic": {"input_shape": shape, "outputs": 2, "samples": samples}},
                      batch_per_rank=batch_per_rank, seed=seed, rank=env.rank, world_size=env.size,
                      run_dir=Path(log_dir), device=torch.device("cpu"))
    return LoggedTask(model, ctx, Path(log_dir))
