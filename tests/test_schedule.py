"""Tests for runtime/schedule.py with hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from hpctrain.config.schedule_rules import warmup_steps_legw
from hpctrain.errors import ConfigError
from hpctrain.runtime.schedule import LRSchedule, scaled_lr


def test_scaled_lr_rules() -> None:
    assert scaled_lr(0.1, 16, "none") == pytest.approx(0.1)
    assert scaled_lr(0.1, 16, "linear") == pytest.approx(1.6)
    assert scaled_lr(0.1, 16, "sqrt") == pytest.approx(0.4)
    assert scaled_lr(0.1, 1, "sqrt") == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="train.lr_scaling"):
        scaled_lr(0.1, 4, "cubic")


def test_warmup_steps_legw() -> None:
    assert warmup_steps_legw(1, 4, 100) == 400  # warm-up epochs × k
    assert warmup_steps_legw(0.5, 8, 30) == 120
    assert warmup_steps_legw(2, 1, 50) == 100


def test_linear_warmup_from_zero_and_from_base() -> None:
    s = LRSchedule(0.1, world_size=16, scaling="sqrt", warmup_kind="linear", warmup_steps=4)
    assert [s.lr_at(i) for i in range(6)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    b = LRSchedule(
        0.1, world_size=16, scaling="sqrt", warmup_kind="linear", warmup_steps=3, warmup_start="base"
    )
    # from 0.1 to 0.4 in 3 steps: 0.1 + 0.3·(s+1)/3
    assert [b.lr_at(i) for i in range(4)] == pytest.approx([0.2, 0.3, 0.4, 0.4])


def test_cosine_decay_after_warmup() -> None:
    s = LRSchedule(1.0, warmup_kind="linear", warmup_steps=2, decay_kind="cosine", decay_steps=4)
    got = [s.lr_at(i) for i in range(8)]
    assert got == pytest.approx(
        [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 - math.cos(math.pi / 4)), 0.0, 0.0]
    )
    m = LRSchedule(1.0, decay_kind="cosine", decay_steps=2, min_lr=0.2)
    assert [m.lr_at(i) for i in range(4)] == pytest.approx([1.0, 0.6, 0.2, 0.2])


def test_step_exponential_polynomial_decay() -> None:
    st = LRSchedule(0.8, decay_kind="step", gamma=0.5, every=3)
    assert [st.lr_at(i) for i in range(8)] == pytest.approx([0.8, 0.8, 0.8, 0.4, 0.4, 0.4, 0.2, 0.2])
    ex = LRSchedule(1.0, decay_kind="exponential", gamma=0.9)
    assert [ex.lr_at(i) for i in range(3)] == pytest.approx([1.0, 0.9, 0.81])
    po = LRSchedule(1.0, decay_kind="polynomial", decay_steps=4, power=2.0, min_lr=0.1)
    # 0.1 + 0.9·(1 − d/4)²
    assert [po.lr_at(i) for i in range(6)] == pytest.approx([1.0, 0.60625, 0.325, 0.15625, 0.1, 0.1])


def test_from_spec_linear_warmup_sqrt_cosine() -> None:
    train = {
        "steps": 104,
        "lr": 0.1,
        "lr_scaling": "sqrt",
        "warmup": {"kind": "linear", "steps": 4},
        "decay": {"kind": "cosine"},
    }
    s = LRSchedule.from_spec(train, world_size=16, steps_per_epoch=None)
    assert s.peak_lr == pytest.approx(0.4)
    assert s.decay_steps == 100  # train.steps − warm-up
    assert s.lr_at(0) == pytest.approx(0.1)
    assert s.lr_at(3) == pytest.approx(0.4)
    assert s.lr_at(54) == pytest.approx(0.2)  # half-way through the cosine
    assert s.lr_at(104) == pytest.approx(0.0)


def test_from_spec_legw_k4_peak_times_two_warmup_times_four() -> None:
    train = {"lr": 0.05, "lr_scaling": "sqrt", "warmup": {"kind": "legw", "epochs": 2}}
    base = LRSchedule.from_spec(train, world_size=1, steps_per_epoch=100)
    big = LRSchedule.from_spec(train, world_size=4, steps_per_epoch=100)
    assert base.peak_lr == pytest.approx(0.05) and base.warmup_steps == 200
    assert big.peak_lr == pytest.approx(0.1) and big.warmup_steps == 800
    assert big.lr_at(399) == pytest.approx(0.05)  # half-way up the ramp
    assert big.lr_at(799) == pytest.approx(0.1)


def test_from_spec_epochs_and_every_epochs() -> None:
    train = {
        "lr": 1.0,
        "warmup": {"kind": "linear", "epochs": 0.5},
        "decay": {"kind": "step", "every_epochs": 1},
    }
    s = LRSchedule.from_spec(train, world_size=2, steps_per_epoch=10)
    assert s.warmup_steps == 5 and s.every == 10
    assert s.lr_at(14) == pytest.approx(1.0) and s.lr_at(15) == pytest.approx(0.1)


def test_from_spec_defaults_and_errors() -> None:
    s = LRSchedule.from_spec({"lr": 0.01}, world_size=8)
    assert all(s.lr_at(i) == pytest.approx(0.01) for i in (0, 10, 10_000))
    cases = [
        (
            {"lr": 0.1, "warmup": {"kind": "legw", "epochs": 1}, "lr_scaling": "linear"},
            10,
            "train.lr_scaling",
        ),
        (
            {"lr": 0.1, "warmup": {"kind": "legw", "steps": 10}, "lr_scaling": "sqrt"},
            10,
            "train.warmup.epochs",
        ),
        (
            {"lr": 0.1, "warmup": {"kind": "legw", "epochs": 1}, "lr_scaling": "sqrt"},
            None,
            "train.warmup.epochs",
        ),
        ({"lr": 0.1, "warmup": {"kind": "linear", "steps": 1, "epochs": 1}}, None, "train.warmup"),
        ({"lr": 0.1, "warmup": {"kind": "linear", "stepz": 1}}, None, "train.warmup.stepz"),
        ({"lr": 0.1, "decay": {"kind": "cosine"}}, None, "train.decay.steps"),
        ({"lr": 0.1, "decay": {"kind": "step", "gamma": 0.5, "period": 3}}, None, "train.decay.period"),
        ({"lr": 0.1, "decay": {"kind": "linearish"}}, None, "train.decay.kind"),
        ({"lr": -1.0}, None, "train.lr"),
        ({}, None, "train.lr"),
    ]
    for train, spe, key in cases:
        with pytest.raises(ConfigError) as info:
            LRSchedule.from_spec(train, world_size=4, steps_per_epoch=spe)
        assert info.value.key == key, (train, str(info.value))


def test_state_dict_roundtrip() -> None:
    s = LRSchedule(
        0.1,
        world_size=4,
        scaling="linear",
        warmup_kind="linear",
        warmup_steps=10,
        decay_kind="step",
        every=5,
        gamma=0.5,
    )
    state = s.state_dict()
    t = LRSchedule(1.0)
    t.load_state_dict(state)
    assert t == s and [t.lr_at(i) for i in range(30)] == [s.lr_at(i) for i in range(30)]
    with pytest.raises(ValueError, match="unknown keys"):
        t.load_state_dict({"bogus": 1})
