"""Learning-rate schedule: scaling over the world size, warm-up (linear, LEGW) and decay.

Pure Python floats, no torch: ``LRSchedule.lr_at(step)`` is a function of the step alone, so a resumed
run gets the same LR without replaying anything. Formulas and references: docs/combiners.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from hpctrain.errors import ConfigError

SCALINGS = ("none", "linear", "sqrt")
WARMUPS = ("none", "linear", "legw")
WARMUP_STARTS = ("zero", "base")
DECAYS = ("none", "cosine", "step", "exponential", "polynomial")

_DECAY_KEYS = {
    "none": set(),
    "cosine": {"steps", "min_lr"},
    "step": {"gamma", "every", "every_epochs"},
    "exponential": {"gamma"},
    "polynomial": {"steps", "min_lr", "power"},
}


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


def warmup_steps_legw(base_warmup_epochs: float, k: float, steps_per_epoch: int) -> int:
    """LEGW warm-up length in steps: the base warm-up epochs times k, at the scaled batch's steps/epoch.

    ``steps_per_epoch`` is counted at the k-times larger batch, so the result in *steps* equals the base
    run's warm-up in its own steps; in epochs (and samples) it is k times longer.
    """
    if k <= 0 or base_warmup_epochs < 0 or steps_per_epoch < 1:
        raise ValueError(
            f"warmup_steps_legw: need epochs >= 0, k > 0, steps_per_epoch >= 1 "
            f"(got {base_warmup_epochs}, {k}, {steps_per_epoch})"
        )
    return int(round(base_warmup_epochs * k * steps_per_epoch))


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
        def bad(key: str, msg: str, hint: str | None = None) -> ConfigError:
            return ConfigError(msg, key=f"train.{key}", hint=hint)

        if not (self.base_lr > 0 and math.isfinite(self.base_lr)):
            raise bad("lr", f"must be a positive number, got {self.base_lr}")
        if self.world_size < 1:
            raise ValueError(f"LRSchedule: world_size must be >= 1, got {self.world_size}")
        if self.scaling not in SCALINGS:
            raise bad("lr_scaling", f"unknown LR scaling {self.scaling!r}", f"use one of {list(SCALINGS)}")
        if self.warmup_kind not in WARMUPS:
            raise bad("warmup.kind", f"unknown warm-up {self.warmup_kind!r}", f"use one of {list(WARMUPS)}")
        if self.warmup_start not in WARMUP_STARTS:
            raise bad(
                "warmup.start", f"unknown start {self.warmup_start!r}", f"use one of {list(WARMUP_STARTS)}"
            )
        if self.warmup_steps < 0:
            raise bad("warmup.steps", f"must be >= 0, got {self.warmup_steps}")
        if self.decay_kind not in DECAYS:
            raise bad("decay.kind", f"unknown decay {self.decay_kind!r}", f"use one of {list(DECAYS)}")
        if self.decay_kind in ("cosine", "polynomial") and (self.decay_steps is None or self.decay_steps < 1):
            raise bad(
                "decay.steps",
                f"{self.decay_kind} decay needs a length >= 1, got {self.decay_steps}",
                "set train.decay.steps or train.steps",
            )
        if self.decay_kind == "step" and (self.every is None or self.every < 1):
            raise bad("decay.every", f"step decay needs every >= 1, got {self.every}")
        if self.decay_kind in ("step", "exponential") and not 0 < self.gamma <= 1:
            raise bad("decay.gamma", f"must be in (0, 1], got {self.gamma}")
        if self.min_lr < 0:
            raise bad("decay.min_lr", f"must be >= 0, got {self.min_lr}")

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
        if "lr" not in train_cfg:
            raise ConfigError("missing", key="train.lr", hint="give the base LR for one rank, e.g. lr: 0.001")
        base_lr = float(train_cfg["lr"])
        scaling = str(train_cfg.get("lr_scaling", "none"))
        warm = _mapping(train_cfg.get("warmup") or {"kind": "none"}, "train.warmup")
        decay = _mapping(train_cfg.get("decay") or {"kind": "none"}, "train.decay")
        total = train_cfg.get("steps")

        _check_keys(warm, {"kind", "steps", "epochs", "start"}, "train.warmup")
        wkind = str(warm.get("kind", "none"))
        wsteps = _warmup_length(warm, wkind, world_size, steps_per_epoch)
        if wkind == "legw" and scaling != "sqrt":
            raise ConfigError(
                f"LEGW warm-up pairs with sqrt LR scaling, not {scaling!r}",
                key="train.lr_scaling",
                hint="set train.lr_scaling: sqrt (or use warmup kind: linear)",
            )

        dkind = str(decay.get("kind", "none"))
        if dkind not in _DECAY_KEYS:
            raise ConfigError(
                f"unknown decay {dkind!r}", key="train.decay.kind", hint=f"use one of {list(DECAYS)}"
            )
        _check_keys(decay, {"kind"} | _DECAY_KEYS[dkind], "train.decay")
        decay_steps = decay.get("steps")
        if decay_steps is None and dkind in ("cosine", "polynomial") and total is not None:
            decay_steps = int(total) - wsteps
        every = decay.get("every")
        if "every_epochs" in decay:
            if not steps_per_epoch:
                raise ConfigError(
                    "every_epochs needs the data's steps per epoch",
                    key="train.decay.every_epochs",
                    hint="give train.decay.every in steps instead",
                )
            every = int(round(float(decay["every_epochs"]) * steps_per_epoch))
        return cls(
            base_lr=base_lr,
            world_size=world_size,
            scaling=scaling,
            warmup_kind=wkind,
            warmup_steps=wsteps,
            warmup_start=str(warm.get("start", "zero")),
            decay_kind=dkind,
            decay_steps=None if decay_steps is None else int(decay_steps),
            gamma=float(decay.get("gamma", 0.1)),
            every=None if every is None else int(every),
            power=float(decay.get("power", 1.0)),
            min_lr=float(decay.get("min_lr", 0.0)),
        )


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a mapping, got {value!r}", key=key, hint="e.g. {kind: linear, steps: 50}")
    return value


def _check_keys(cfg: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r}", key=f"{where}.{unknown[0]}", hint=f"valid keys: {sorted(allowed)}"
        )


def _warmup_length(warm: Mapping[str, Any], kind: str, world_size: int, steps_per_epoch: int | None) -> int:
    if kind not in WARMUPS:
        raise ConfigError(
            f"unknown warm-up {kind!r}", key="train.warmup.kind", hint=f"use one of {list(WARMUPS)}"
        )
    if kind == "none":
        return 0
    if ("steps" in warm) == ("epochs" in warm):
        raise ConfigError(
            "give exactly one of steps or epochs",
            key="train.warmup",
            hint="e.g. warmup: {kind: linear, steps: 50}",
        )
    if kind == "legw":
        if "epochs" not in warm or not steps_per_epoch:
            raise ConfigError(
                "LEGW is defined in epochs: needs warmup.epochs and a dataset with a known epoch length",
                key="train.warmup.epochs",
                hint="give warmup: {kind: legw, epochs: E}, or use kind: linear with steps",
            )
        return warmup_steps_legw(float(warm["epochs"]), world_size, steps_per_epoch)
    if "steps" in warm:
        return int(warm["steps"])
    if not steps_per_epoch:
        raise ConfigError(
            "warm-up in epochs needs the data's steps per epoch",
            key="train.warmup.epochs",
            hint="give warmup.steps instead",
        )
    return int(round(float(warm["epochs"]) * steps_per_epoch))
