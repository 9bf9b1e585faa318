"""Optimizers for the runtime: SGD and Adam from torch, LAMB, and the delta step Adasum combines.

``build_optimizer`` reads the job spec's ``train.optimizer`` mapping; the LR comes from the schedule.
References and formulas: docs/combiners.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hpctrain.errors import ConfigError

OPTIMIZER_KEYS: dict[str, set[str]] = {
    "sgd": {"momentum", "nesterov", "weight_decay", "dampening"},
    "adam": {"betas", "eps", "weight_decay", "amsgrad"},
    "lamb": {"betas", "eps", "weight_decay", "bias_correction"},
}


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes").

    Per parameter tensor: Adam moments with bias correction, r = m̂/(√v̂ + eps), u = r + weight_decay·w
    (decoupled), trust = ‖w‖/‖u‖ (1 where either norm is 0), w ← w − lr·trust·u.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Lamb: invalid lr={lr} betas={betas} eps={eps} weight_decay={weight_decay}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                if group["bias_correction"]:
                    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
                else:
                    m_hat, v_hat = m, v
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm = float(torch.linalg.vector_norm(p))
                u_norm = float(torch.linalg.vector_norm(update))
                trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-group["lr"] * trust)
        return loss


def build_optimizer(params: Iterable[Tensor], cfg: Mapping[str, Any], lr: float) -> torch.optim.Optimizer:
    """An optimizer from ``train.optimizer`` ({name: sgd|adam|lamb, ...}); unknown keys are errors."""
    name = str(cfg.get("name", "sgd")).lower()
    if name not in OPTIMIZER_KEYS:
        raise ConfigError(
            f"unknown optimizer {name!r}",
            key="train.optimizer.name",
            hint=f"use one of {sorted(OPTIMIZER_KEYS)}",
        )
    allowed = OPTIMIZER_KEYS[name]
    unknown = sorted(set(cfg) - allowed - {"name"})
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} for {name}",
            key=f"train.optimizer.{unknown[0]}",
            hint=f"valid keys for {name}: {sorted(allowed)}",
        )
    kw = {k: cfg[k] for k in allowed if k in cfg}
    if "betas" in kw:
        betas = kw["betas"]
        if not (isinstance(betas, Sequence) and len(betas) == 2):
            raise ConfigError(
                f"betas must be two numbers, got {betas!r}",
                key="train.optimizer.betas",
                hint="e.g. betas: [0.9, 0.999]",
            )
        kw["betas"] = (float(betas[0]), float(betas[1]))
    try:
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr, **kw)
        if name == "adam":
            return torch.optim.Adam(params, lr=lr, **kw)
        return Lamb(params, lr=lr, **kw)
    except ValueError as exc:  # torch's own range checks (negative momentum, nesterov without momentum, …)
        raise ConfigError(
            str(exc), key="train.optimizer", hint="see docs/combiners.md for valid values"
        ) from exc


@torch.no_grad()
def delta_step(optimizer: torch.optim.Optimizer, params: Sequence[Tensor]) -> list[Tensor]:
    """Run ``optimizer.step()`` on the local gradients, return new − old per parameter, restore old.

    The optimizer's own state (momentum, Adam moments) does advance: that is Horovod's Adasum delta mode,
    where each rank's optimizer runs locally and only the deltas are combined. Apply the combined delta
    with :func:`apply_deltas`.
    """
    old = [p.detach().clone() for p in params]
    optimizer.step()
    deltas = []
    for p, o in zip(params, old, strict=True):
        deltas.append(p.detach() - o)
        p.copy_(o)
    return deltas


@torch.no_grad()
def apply_deltas(params: Sequence[Tensor], deltas: Sequence[Tensor]) -> None:
    """params ← params + delta (after :func:`delta_step` restored them to the old values)."""
    for p, d in zip(params, deltas, strict=True):
        p.add_(d)
