"""A small residual CNN on scikit-learn's bundled 8x8 digits images (no download).

``model_args`` and ``data`` are read through their schema (hpctrain/config/plugins/digits.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpctrain.config.plugins.digits import SCHEMA
from hpctrain.models.task import ShardedIndexStream, TaskContext, TrainingTask


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(torch.relu(x))))


class SmallResNet(nn.Module):
    """conv 3x3 → ``blocks`` residual blocks → global average pool → linear to 10 classes."""

    def __init__(self, channels: int = 16, blocks: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, channels, 3, padding=1)
        self.blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.blocks(self.stem(x)))
        return self.head(h.mean(dim=(2, 3)))


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(digits.target, dtype=torch.long)


class DigitsTask(TrainingTask):
    def __init__(self, ctx: TaskContext) -> None:
        args, data = SCHEMA.parse(ctx.model_args, ctx.data)
        torch.manual_seed(ctx.seed)
        self.model = SmallResNet(channels=args.channels, blocks=args.blocks)
        images, labels = load_digits_tensors()
        holdout = data.holdout
        self.train_x, self.train_y = images[holdout:], labels[holdout:]
        self.test_x, self.test_y = images[:holdout], labels[:holdout]
        self.batch = ctx.batch_per_rank
        self.stream = ShardedIndexStream(len(self.train_x), ctx.batch_per_rank, ctx.rank, ctx.world_size, ctx.seed)

    @property
    def samples_per_step(self) -> int:
        return self.batch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.stream.next()
        return self.train_x[idx], self.train_y[idx]

    def forward_loss(self, batch: Any) -> tuple[torch.Tensor, Any]:
        x, y = batch
        logits = self.model(x)
        return nn.functional.cross_entropy(logits, y), logits.detach()

    def observe(self, batch: Any, aux: Any) -> dict[str, float]:
        return {"accuracy": float((aux.argmax(1) == batch[1]).float().mean())}

    def evaluate(self) -> dict[str, float]:
        with torch.no_grad():
            accuracy = (self.model(self.test_x).argmax(1) == self.test_y).float().mean()
        return {"test_accuracy": float(accuracy)}

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
