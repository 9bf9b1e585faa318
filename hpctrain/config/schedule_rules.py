"""The learning-rate schedule's rules: which settings are valid, and how long warm-up and decay last.

Pure Python, no torch. ``runtime/schedule.LRSchedule`` is built from ``schedule_parameters`` on the ranks; the
laptop's preflight calls the same function, so a schedule that would fail at start fails before submission
with the same message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hpctrain.errors import ConfigError

SCALINGS = ("none", "linear", "sqrt")
WARMUPS = ("none", "linear", "legw")
WARMUP_STARTS = ("zero", "base")
DECAYS = ("none", "cosine", "step", "exponential", "polynomial")

DECAY_KEYS = {
    "none": set(),
    "cosine": {"steps", "min_lr"},
    "step": {"gamma", "every", "every_epochs"},
    "exponential": {"gamma"},
    "polynomial": {"steps", "min_lr", "power"},
}


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


def check_parameters(p: Mapping[str, Any]) -> None:
    """Raise a ConfigError naming the ``train.*`` key of the first invalid LRSchedule field in ``p``."""

    def bad(key: str, msg: str, hint: str | None = None) -> ConfigError:
        return ConfigError(msg, key=f"train.{key}", hint=hint)

    if not (p["base_lr"] > 0 and math.isfinite(p["base_lr"])):
        raise bad("lr", f"must be a positive number, got {p['base_lr']}")
    if p["world_size"] < 1:
        raise ValueError(f"LRSchedule: world_size must be >= 1, got {p['world_size']}")
    if p["scaling"] not in SCALINGS:
        raise bad("lr_scaling", f"unknown LR scaling {p['scaling']!r}", f"use one of {list(SCALINGS)}")
    if p["warmup_kind"] not in WARMUPS:
        raise bad("warmup.kind", f"unknown warm-up {p['warmup_kind']!r}", f"use one of {list(WARMUPS)}")
    if p["warmup_start"] not in WARMUP_STARTS:
        raise bad("warmup.start", f"unknown start {p['warmup_start']!r}", f"use one of {list(WARMUP_STARTS)}")
    if p["warmup_steps"] < 0:
        raise bad("warmup.steps", f"must be >= 0, got {p['warmup_steps']}")
    kind = p["decay_kind"]
    if kind not in DECAYS:
        raise bad("decay.kind", f"unknown decay {kind!r}", f"use one of {list(DECAYS)}")
    if kind in ("cosine", "polynomial") and (p["decay_steps"] is None or p["decay_steps"] < 1):
        raise bad("decay.steps", f"{kind} decay needs a length >= 1, got {p['decay_steps']}",
                  "set train.decay.steps or train.steps")
    if kind == "step" and (p["every"] is None or p["every"] < 1):
        raise bad("decay.every", f"step decay needs every >= 1, got {p['every']}")
    if kind in ("step", "exponential") and not 0 < p["gamma"] <= 1:
        raise bad("decay.gamma", f"must be in (0, 1], got {p['gamma']}")
    if p["min_lr"] < 0:
        raise bad("decay.min_lr", f"must be >= 0, got {p['min_lr']}")


def schedule_parameters(
    train_cfg: Mapping[str, Any], world_size: int, steps_per_epoch: int | None = None
) -> dict[str, Any]:
    """LRSchedule's fields from the job spec's ``train`` mapping (lr, lr_scaling, warmup, decay, steps), checked."""
    if "lr" not in train_cfg:
        raise ConfigError("missing", key="train.lr", hint="give the base LR for one rank, e.g. lr: 0.001")
    scaling = str(train_cfg.get("lr_scaling", "none"))
    warm = _mapping(train_cfg.get("warmup") or {"kind": "none"}, "train.warmup")
    decay = _mapping(train_cfg.get("decay") or {"kind": "none"}, "train.decay")
    total = train_cfg.get("steps")

    _check_keys(warm, {"kind", "steps", "epochs", "start"}, "train.warmup")
    wkind = str(warm.get("kind", "none"))
    wsteps = _warmup_length(warm, wkind, world_size, steps_per_epoch)
    if wkind == "legw" and scaling != "sqrt":
        raise ConfigError(f"LEGW warm-up pairs with sqrt LR scaling, not {scaling!r}", key="train.lr_scaling",
                          hint="set train.lr_scaling: sqrt (or use warmup kind: linear)")

    dkind = str(decay.get("kind", "none"))
    if dkind not in DECAY_KEYS:
        raise ConfigError(f"unknown decay {dkind!r}", key="train.decay.kind", hint=f"use one of {list(DECAYS)}")
    _check_keys(decay, {"kind"} | DECAY_KEYS[dkind], "train.decay")
    decay_steps = decay.get("steps")
    if decay_steps is None and dkind in ("cosine", "polynomial") and total is not None:
        decay_steps = int(total) - wsteps
        if decay_steps < 1:
            # Blame the key the user changed: the decay's length is what train.steps leaves after the warm-up.
            raise ConfigError(
                f"the {dkind} decay runs from the end of the {wsteps}-step warm-up to train.steps = {total}, "
                f"which leaves it {decay_steps} steps", key="train.steps",
                hint=f"raise train.steps above {wsteps}, shorten train.warmup, or set train.decay.steps")
    every = decay.get("every")
    if "every_epochs" in decay:
        if not steps_per_epoch:
            raise ConfigError("every_epochs needs the data's steps per epoch", key="train.decay.every_epochs",
                              hint="give train.decay.every in steps instead")
        every = int(round(float(decay["every_epochs"]) * steps_per_epoch))
    params = {
        "base_lr": float(train_cfg["lr"]),
        "world_size": world_size,
        "scaling": scaling,
        "warmup_kind": wkind,
        "warmup_steps": wsteps,
        "warmup_start": str(warm.get("start", "zero")),
        "decay_kind": dkind,
        "decay_steps": None if decay_steps is None else int(decay_steps),
        "gamma": float(decay.get("gamma", 0.1)),
        "every": None if every is None else int(every),
        "power": float(decay.get("power", 1.0)),
        "min_lr": float(decay.get("min_lr", 0.0)),
    }
    check_parameters(params)
    return params


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a mapping, got {value!r}", key=key, hint="e.g. {kind: linear, steps: 50}")
    return value


def _check_keys(cfg: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}", key=f"{where}.{unknown[0]}",
                          hint=f"valid keys: {sorted(allowed)}")


def _warmup_length(warm: Mapping[str, Any], kind: str, world_size: int, steps_per_epoch: int | None) -> int:
    if kind not in WARMUPS:
        raise ConfigError(f"unknown warm-up {kind!r}", key="train.warmup.kind", hint=f"use one of {list(WARMUPS)}")
    if kind == "none":
        return 0
    if ("steps" in warm) == ("epochs" in warm):
        raise ConfigError("give exactly one of steps or epochs", key="train.warmup",
                          hint="e.g. warmup: {kind: linear, steps: 50}")
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
        raise ConfigError("warm-up in epochs needs the data's steps per epoch", key="train.warmup.epochs",
                          hint="give warmup.steps instead")
    return int(round(float(warm["epochs"]) * steps_per_epoch))
