"""hpctrain.ffn.perf: the CPU speed settings compute what eager PyTorch computes, and fall back cleanly.

Tolerance: per tensor, |tuned − eager| <= 2e-5 · max|eager| for outputs and gradients (float32 reordering
measured at ~3e-7 on these sizes; a wrong layout or weight would be off by O(1)). No timing assertions.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from hpctrain.ffn import perf
from hpctrain.ffn.model import ConvStack3D
from hpctrain_bench.ffn_perf_checks import is_compiled, num_threads

TOL = 2e-5


@pytest.fixture(autouse=True)
def _one_thread():
    with num_threads(1):
        yield


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> float:
    """Max |a − b| relative to max |b|; asserts it is within ``tol``."""
    err = ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()
    assert err <= tol, f"relative difference {err:.3g} > {tol}"
    return err


def _model(seed: int = 0, depth: int = 3, features: int = 8, fov: int = 9) -> ConvStack3D:
    torch.manual_seed(seed)
    model = ConvStack3D(depth, features, (fov,) * 3)
    with torch.no_grad():  # non-zero biases so the bias gradient paths are exercised with real values
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(-0.1, 0.1)
    return model


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    y = model(x)
    (y * y).mean().backward()
    return y.detach(), [p.grad.detach().clone() for p in model.parameters()]


def _input(batch: int, fov: int = 9, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, fov, fov, fov, generator=g)


@pytest.mark.parametrize("batch", [1, 2])
def test_tuned_training_matches_eager_outputs_and_gradients(batch: int) -> None:
    base = _model()
    x = _input(batch)
    y_ref, g_ref = _step(copy.deepcopy(base), x)
    y64, g64 = _step(copy.deepcopy(base).double(), x.double())
    tuned = perf.tune_for_cpu(copy.deepcopy(base), threads=1)
    y, g = _step(tuned, x)
    assert y.shape == y_ref.shape == (batch, 1, 9, 9, 9)
    _close(y, y_ref)
    _close(y, y64)
    assert len(g) == len(g_ref)
    for a, b, c in zip(g, g_ref, g64, strict=True):
        assert a.shape == b.shape
        _close(a, b)
        _close(a, c)


def test_tuning_keeps_parameters_and_state_dict_keys() -> None:
    base = _model()
    tuned = perf.tune_for_cpu(copy.deepcopy(base))
    assert list(tuned.state_dict()) == list(base.state_dict())
    assert all(isinstance(m, perf.OneDNNConv3d) for m in tuned.modules() if isinstance(m, nn.Conv3d))
    w = tuned.conv0_b.weight
    assert w.is_contiguous(memory_format=torch.channels_last_3d) and not w.is_contiguous()
    assert perf.is_channels_last(tuned) and not perf.is_channels_last(base)
    # a plain (contiguous) checkpoint loads into the tuned model and back
    fresh = _model(seed=5)
    tuned.load_state_dict(fresh.state_dict())
    back = _model(seed=9)
    back.load_state_dict(tuned.state_dict())
    x = _input(1)
    with torch.no_grad():
        _close(back(x), fresh(x))
    # applying twice adds no second input hook and changes nothing
    perf.tune_for_cpu(tuned)
    assert len(tuned._forward_pre_hooks) == 1


def test_onednn_conv_avoids_slow_conv3d_for_a_batch_of_one() -> None:
    """PyTorch's heuristic sends batch-1 small inputs to slow_conv3d; the tuned model must not."""
    x = _input(1)

    def ops(model: nn.Module) -> set[str]:
        with torch.inference_mode(), torch.profiler.profile() as prof:
            model(x)
        return {e.key for e in prof.key_averages()}

    eager_ops = ops(_model())
    tuned_ops = ops(perf.tune_for_cpu(_model()))
    assert "aten::slow_conv3d_forward" in eager_ops
    assert "aten::slow_conv3d_forward" not in tuned_ops
    assert "aten::mkldnn_convolution" in tuned_ops


def test_onednn_conv_leaves_other_dtypes_to_nn_conv3d() -> None:
    conv = nn.Conv3d(2, 3, 3, padding=1)
    ref = copy.deepcopy(conv).double()
    perf.onednn_convs_(conv)
    conv.double()
    x = torch.randn(1, 2, 5, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(conv(x), ref(x))


@pytest.mark.parametrize("freeze", [False, True])
def test_tune_for_inference_matches_and_leaves_model_alone(freeze: bool) -> None:
    base = _model(depth=2)
    x = _input(1)
    with torch.no_grad():
        ref = base(x)
    fast = perf.tune_for_inference(base, x, freeze=freeze)
    assert isinstance(fast, perf.FrozenInference) == freeze
    with torch.inference_mode():
        _close(fast(x), ref)
        _close(fast(_input(1, seed=7)), base(_input(1, seed=7)))
    assert not perf.is_channels_last(base) and base.conv0_b.weight.is_contiguous()
    assert all(p.requires_grad for p in base.parameters())
    assert type(base.conv0_b) is nn.Conv3d


def test_tuned_inference_module_runs_in_the_canvas() -> None:
    from hpctrain.config.plugins.ffn_inference import FloodSettings
    from hpctrain.ffn.inference.batching import BatchPredictor
    from hpctrain.ffn.inference.canvas import Canvas

    base = _model(depth=2)
    image = np.random.default_rng(0).integers(0, 255, size=(11, 11, 11)).astype(np.uint8)
    seed = np.full((9, 9, 9), 0.5, dtype=np.float32)
    x = torch.zeros(1, 2, 9, 9, 9)
    plain, fast = (BatchPredictor(model, "cpu", (9, 9, 9))([(Canvas(model, image, FloodSettings(fov=9, deltas=2)),
                                                           (5, 5, 5), seed)])[0]
                   for model in (base, perf.tune_for_inference(base, x, freeze=True)))
    assert fast.shape == plain.shape == (9, 9, 9)
    _close(torch.from_numpy(fast), torch.from_numpy(plain))


def test_freeze_failure_falls_back_to_eager() -> None:
    class Untraceable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv3d(2, 1, 1)

        def forward(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return ("a string: torch.jit.trace refuses it", self.conv(x))

    with pytest.warns(UserWarning, match="inference stays eager"):
        fast = perf.tune_for_inference(Untraceable(), _input(1), freeze=True)
    assert not isinstance(fast, perf.FrozenInference)
    assert fast(_input(1))[1].shape == (1, 1, 9, 9, 9)


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
    raise RuntimeError("no C++ compiler here (simulated)")


def test_compile_failure_falls_back_to_eager_and_keeps_gradients() -> None:
    base = _model()
    x = _input(1)
    y_ref, g_ref = _step(copy.deepcopy(base), x)
    model = perf.tune_for_cpu(copy.deepcopy(base))
    marker = [torch.full_like(p, 3.0) for p in model.parameters()]
    for p, m in zip(model.parameters(), marker, strict=True):
        p.grad = m
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = perf.compile_(model, x, backend=_failing_backend)
    assert ok is False
    assert any("torch.compile failed" in str(w.message) for w in caught)
    assert not is_compiled(model)
    assert all(p.grad is m for p, m in zip(model.parameters(), marker, strict=True))  # untouched
    y, g = _step(model, x)  # still trains, eagerly, with the same numbers
    _close(y, y_ref)
    for a, b in zip(g, g_ref, strict=True):
        _close(a, b)


def test_compile_needs_an_example_input() -> None:
    with pytest.raises(ValueError, match="example_input"):
        perf.tune_for_cpu(_model(), compile=True)


def test_compiled_model_matches_eager_with_dynamo() -> None:
    """The compile path itself (dynamo graph capture, backend 'eager': no C++ build) keeps the numbers."""
    base = _model()
    x = _input(2)
    y_ref, g_ref = _step(copy.deepcopy(base), x)
    model = perf.tune_for_cpu(copy.deepcopy(base))
    assert perf.compile_(model, x, backend="eager") is True
    assert is_compiled(model)
    assert list(model.state_dict()) == list(base.state_dict())
    y, g = _step(model, x)
    _close(y, y_ref)
    for a, b in zip(g, g_ref, strict=True):
        _close(a, b)
    torch._dynamo.reset()


@pytest.mark.slow
def test_inductor_compiled_model_matches_eager() -> None:
    """The real inductor build (gcc) on this machine: ~15-40 s."""
    base = _model(depth=2, features=4, fov=5)
    x = _input(1, fov=5)
    y_ref, g_ref = _step(copy.deepcopy(base), x)
    model = perf.tune_for_cpu(copy.deepcopy(base), compile=True, example_input=x)
    assert is_compiled(model), "inductor compilation fell back to eager"
    y, g = _step(model, x)
    _close(y, y_ref)
    for a, b in zip(g, g_ref, strict=True):
        _close(a, b)
    torch._dynamo.reset()


def test_threads_helpers() -> None:
    before = torch.get_num_threads()
    with num_threads(2) as n:
        assert n == 2 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    assert perf.set_threads(None) == before
    with pytest.raises(ValueError, match="threads"):
        perf.set_threads(0)
    assert perf.available_cpus() >= 1
