"""Tests for runtime/optim.py: the optimizer factory, LAMB against NumPy, and the Adasum delta step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpctrain.errors import ConfigError
from hpctrain.runtime.optim import Lamb, apply_deltas, build_optimizer, delta_step

torch.set_num_threads(1)


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(4, 3, generator=g, dtype=torch.float64)),
        torch.nn.Parameter(torch.randn(5, generator=g, dtype=torch.float64)),
    ]


def _grads(seed: int, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]


def test_build_optimizer_kinds_and_options() -> None:
    ps = _params()
    sgd = build_optimizer(
        ps, {"name": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}, lr=0.1
    )
    assert isinstance(sgd, torch.optim.SGD)
    group = sgd.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (
        0.1,
        0.9,
        True,
        1e-4,
    )
    adam = build_optimizer(ps, {"name": "adam", "betas": [0.8, 0.99]}, lr=1e-3)
    assert isinstance(adam, torch.optim.Adam) and adam.param_groups[0]["betas"] == (0.8, 0.99)
    lamb = build_optimizer(ps, {"name": "lamb", "weight_decay": 0.01}, lr=1e-3)
    assert isinstance(lamb, Lamb) and lamb.param_groups[0]["weight_decay"] == 0.01


@pytest.mark.parametrize(
    "cfg,key",
    [
        ({"name": "rmsprop"}, "train.optimizer.name"),
        ({"name": "sgd", "beta": 0.9}, "train.optimizer.beta"),
        ({"name": "adam", "momentum": 0.9}, "train.optimizer.momentum"),
        ({"name": "lamb", "betas": 0.9}, "train.optimizer.betas"),
        ({"name": "sgd", "momentum": -1.0}, "train.optimizer"),
    ],
)
def test_build_optimizer_errors_name_the_key(cfg: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(_params(), cfg, lr=0.1)
    assert info.value.key == key


def ref_lamb(ws, grads_per_step, lr, b1, b2, eps, wd):  # noqa: ANN001, ANN201
    """Float64 NumPy LAMB (You et al. 2019, Algorithm 2 with bias correction), written from the paper."""
    ws = [w.copy() for w in ws]
    ms = [np.zeros_like(w) for w in ws]
    vs = [np.zeros_like(w) for w in ws]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat = ms[i] / (1 - b1**t)
            v_hat = vs[i] / (1 - b2**t)
            u = m_hat / (np.sqrt(v_hat) + eps) + wd * ws[i]
            wn, un = np.linalg.norm(ws[i]), np.linalg.norm(u)
            trust = wn / un if wn > 0 and un > 0 else 1.0
            ws[i] = ws[i] - lr * trust * u
    return ws


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_numpy_reference_two_steps(wd: float) -> None:
    ps = _params(1)
    with torch.no_grad():
        ps[1].zero_()  # ‖w‖ = 0 → trust ratio 1
    start = [p.detach().numpy().copy() for p in ps]
    opt = Lamb(ps, lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=wd)
    steps = [_grads(10, ps), _grads(11, ps)]
    for grads in steps:
        for p, g in zip(ps, grads, strict=True):
            p.grad = g.clone()
        opt.step()
    ref = ref_lamb(start, [[g.numpy() for g in gs] for gs in steps], 0.01, 0.9, 0.999, 1e-6, wd)
    for p, r in zip(ps, ref, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), r, rtol=1e-12, atol=1e-14)
    assert not np.allclose(ref[1], 0.0)  # the zero tensor moved (trust ratio 1, not 0)


def test_lamb_trust_ratio_scales_step_to_weight_norm() -> None:
    # lr·trust·‖u‖ = lr·‖w‖: the step norm follows the weight norm, whatever the gradient scale.
    for scale in (1e-3, 1e3):
        p = torch.nn.Parameter(torch.full((100,), 2.0, dtype=torch.float64))
        opt = Lamb([p], lr=0.1)
        p.grad = torch.full_like(p, scale)
        before = p.detach().clone()
        opt.step()
        assert float(torch.linalg.vector_norm(p.detach() - before)) == pytest.approx(0.1 * 20.0, rel=1e-6)


def test_delta_step_sgd_is_minus_lr_grad_and_restores_params() -> None:
    ps = _params(2)
    old = [p.detach().clone() for p in ps]
    opt = build_optimizer(ps, {"name": "sgd"}, lr=0.05)
    grads = _grads(20, ps)
    for p, g in zip(ps, grads, strict=True):
        p.grad = g.clone()
    deltas = delta_step(opt, ps)
    for p, o, d, g in zip(ps, old, deltas, grads, strict=True):
        assert torch.equal(p.detach(), o)  # restored bitwise
        torch.testing.assert_close(d, -0.05 * g, rtol=1e-12, atol=1e-15)
    apply_deltas(ps, deltas)
    for p, o, g in zip(ps, old, grads, strict=True):
        torch.testing.assert_close(p.detach(), o - 0.05 * g, rtol=1e-12, atol=1e-15)


def test_delta_step_advances_optimizer_state() -> None:
    ps = _params(3)
    opt = build_optimizer(ps, {"name": "sgd", "momentum": 0.9}, lr=0.1)
    grads = _grads(30, ps)
    for p, g in zip(ps, grads, strict=True):
        p.grad = g.clone()
    first = delta_step(opt, ps)
    second = delta_step(opt, ps)  # same gradient again: momentum buffer is 1.9·g now
    for d1, d2, g in zip(first, second, grads, strict=True):
        torch.testing.assert_close(d1, -0.1 * g, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(d2, -0.1 * 1.9 * g, rtol=1e-12, atol=1e-15)
