"""Learning-rate schedule: scaling over the world size, warm-up (linear, LEGW) and decay.

Pure Python floats, no torch: ``LRSchedule.lr_at(step)`` is a function of the step alone, so a resumed
run gets the same LR without replaying anything. Formulas and references: docs/combiners.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from hpctrain.config.schedule_rules import SCALINGS, check_parameters, schedule_parameters
from hpctrain.errors import ConfigError


def scaled_lr(base_lr: float, world_size: int, rule: str) -> float:
    """The peak LR for ``world_size`` ranks: none → base, linear → base·n, sqrt → base·√n."""
    if world_size < 1:
        raise ValueError(f"scaled_lr: world_size must be >= 1, got {world_size}")
    if rule == "none":
        return float(base_lr)
    if rule == "linear":
        return float(base_lr) * world_size
    if rule == "sqrt":
        return float(base_lr) * math.sqrt(world_size)
    raise ConfigError(
        f"unknown LR scaling {rule!r}", key="train.lr_scaling", hint=f"use one of {list(SCALINGS)}"
    )


@dataclass
class LRSchedule:
    """LR at each step: linear warm-up to the scaled peak, then decay measured from the warm-up's end.

    warm-up (step s < W):  start + (peak − start)·(s + 1)/W, start = 0 ("zero") or base_lr ("base")
    decay (d = s − W ≥ 0): cosine     min + (peak − min)·½(1 + cos(π·min(d, T)/T))
                           step       peak·gamma^⌊d/every⌋
                           exponential peak·gamma^d
                           polynomial min + (peak − min)·(1 − min(d, T)/T)^power
    ``legw`` warm-up is the linear ramp; its length and the sqrt peak are set by :meth:`from_spec`.
    """

    base_lr: float
    world_size: int = 1
    scaling: str = "none"
    warmup_kind: str = "none"
    warmup_steps: int = 0
    warmup_start: str = "zero"
    decay_kind: str = "none"
    decay_steps: int | None = None  # T for cosine / polynomial
    gamma: float = 0.1
    every: int | None = None
    power: float = 1.0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        check_parameters(asdict(self))  # the rules live in config/, where the laptop checks them too

    @property
    def peak_lr(self) -> float:
        return scaled_lr(self.base_lr, self.world_size, self.scaling)

    def lr_at(self, step: int) -> float:
        """The LR for 0-based optimizer step ``step``."""
        if step < 0:
            raise ValueError(f"lr_at: step must be >= 0, got {step}")
        peak = self.peak_lr
        w = self.warmup_steps if self.warmup_kind != "none" else 0
        if step < w:
            start = 0.0 if self.warmup_start == "zero" else float(self.base_lr)
            return start + (peak - start) * (step + 1) / w
        d = step - w
        kind = self.decay_kind
        if kind == "none":
            return peak
        if kind == "step":
            assert self.every is not None
            return peak * self.gamma ** (d // self.every)
        if kind == "exponential":
            return peak * self.gamma**d
        assert self.decay_steps is not None
        frac = min(d, self.decay_steps) / self.decay_steps
        if kind == "cosine":
            return self.min_lr + (peak - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * frac))
        return self.min_lr + (peak - self.min_lr) * (1.0 - frac) ** self.power

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        names = {f.name for f in fields(self)}
        unknown = set(state) - names
        if unknown:
            raise ValueError(f"LRSchedule.load_state_dict: unknown keys {sorted(unknown)}")
        for key, value in state.items():
            setattr(self, key, value)
        self._validate()

    @classmethod
    def from_spec(
        cls, train_cfg: Mapping[str, Any], world_size: int, steps_per_epoch: int | None = None
    ) -> LRSchedule:
        """Build from the job spec's ``train`` mapping (lr, lr_scaling, warmup, decay, steps)."""
        return cls(**schedule_parameters(train_cfg, world_size, steps_per_epoch))
