"""A small residual CNN on scikit-learn's bundled 8x8 digits images (no download).

``model_args`` and ``data`` are read through their schema (hpctrain/config/plugins/digits.py). The images are
standardised with the training images' mean and deviation; docs/convergence.md shows why the head keeps the
strokes' positions and why the convolutions start from He initialisation.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import nn

from hpctrain.config.plugins.digits import SCHEMA
from hpctrain.models.task import ShardedIndexStream, TaskContext, TrainingTask

EDGE = 8  # the digits are 8 x 8 pixels
POOL = 2  # the head sees a (EDGE / POOL)^2 grid of every feature map


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(torch.relu(x))))


class SmallResNet(nn.Module):
    """conv 3x3 → ``blocks`` residual blocks → 2x2 average pool → linear from the 4x4 grid to 10 classes.

    A global average pool before the head (the usual ResNet ending) loses where on the 8 x 8 image the strokes
    are, which is most of what tells these digits apart: with it, and torch's default initialisation that
    shrinks the signal layer by layer, every image gave nearly the same logits at the start and SGD spent
    hundreds of steps near chance before it learnt anything.
    """

    def __init__(self, channels: int = 16, blocks: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, channels, 3, padding=1)
        self.blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels * (EDGE // POOL) ** 2, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # He et al.: keeps the activations' scale through the ReLUs
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.blocks(self.stem(x)))
        return self.head(nn.functional.avg_pool2d(h, POOL).flatten(1))


@cache
def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 images (N, 1, 8, 8) scaled to [0, 1] and their labels; loaded once per process (do not modify)."""
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
        train = images[holdout:]
        images = (images - train.mean()) / train.std()  # the training images' statistics, for both splits
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
