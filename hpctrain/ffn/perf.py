"""CPU speed settings for the FFN: threads, channels-last 3-D layout, torch.compile with an eager fallback, and
a frozen inference module. Every setting keeps the model's float32 arithmetic (no TF32/bf16, no fast-math):
results differ from plain eager PyTorch only by the order of float32 summation. Measured in docs/ffn_speed.md.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hpctrain.runtime.precision import forward_context

log = logging.getLogger(__name__)

_HOOK_ATTR = "_hpctrain_channels_last_hook"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a launcher's binding narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads; ``None`` leaves the current setting (OMP_NUM_THREADS / the launcher's).
    Returns the number now in use."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def _to_channels_last(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    x = args[0]
    if isinstance(x, torch.Tensor) and x.dim() == 5:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    return (x, *args[1:])


def channels_last_(model: nn.Module) -> nn.Module:
    """Store the conv weights channels-last (N, Z, Y, X, C) and convert 5-D inputs on entry, in place.

    oneDNN's direct 3-D convolutions run on this layout without reordering tensors at every layer. The
    parameter names and ``state_dict`` keys are unchanged; gradients and optimizer state take the same
    layout. Code that flattens gradients must use ``reshape``/``copy_`` rather than ``view``; a contiguous
    ``.grad`` assigned from outside still accumulates correctly (PyTorch warns about the layout contract).
    """
    model.to(memory_format=torch.channels_last_3d)
    if not is_channels_last(model):
        setattr(model, _HOOK_ATTR, model.register_forward_pre_hook(_to_channels_last))
    return model


class OneDNNConv3d(nn.Conv3d):
    """``nn.Conv3d`` that always runs oneDNN's convolution (``torch.mkldnn_convolution``) on CPU float32.

    PyTorch sends a batch-1 input with ``C·Z·Y <= 20480`` (e.g. a 17³ FOV with 24 features, or the 2-channel
    first layer) to its unblocked ``slow_conv3d`` instead: 4-5× slower here. Same parameters, same sums in
    float32; other devices, dtypes and padding modes, and torch.compile tracing, use ``nn.Conv3d`` unchanged.
    """

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # aten.mkldnn_convolution has no meta kernel, so torch.compile traces the plain conv (inductor
        # picks its own oneDNN kernel for it).
        if (
            not torch.compiler.is_compiling()
            and input.device.type == "cpu"
            and input.dtype == torch.float32
            and self.padding_mode == "zeros"
            and not isinstance(self.padding, str)
            and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled
        ):
            return torch.mkldnn_convolution(
                input, weight, bias, list(self.padding), list(self.stride), list(self.dilation), self.groups
            )
        return super()._conv_forward(input, weight, bias)


def onednn_convs_(model: nn.Module) -> nn.Module:
    """Make every ``nn.Conv3d`` in ``model`` a :class:`OneDNNConv3d`, in place (state_dict unchanged)."""
    for module in model.modules():
        if type(module) is nn.Conv3d:
            module.__class__ = OneDNNConv3d
    return model


def is_channels_last(model: nn.Module) -> bool:
    """Whether :func:`channels_last_` was applied to ``model``."""
    return getattr(model, _HOOK_ATTR, None) is not None


def _uncompile(model: nn.Module) -> None:
    # nn.Module.compile() stores the compiled callable here; None restores the plain eager __call__.
    model._compiled_call_impl = None  # type: ignore[attr-defined]


def compile_(
    model: nn.Module,
    example_input: torch.Tensor,
    *,
    backward: bool = True,
    backend: str | Callable[..., Any] = "inductor",
    **compile_kwargs: Any,
) -> bool:
    """``model.compile()`` in place and compile it now on ``example_input`` (forward, and backward when
    ``backward``). Returns True when compiled; on any failure logs a warning, restores the eager model and
    returns False. Existing ``.grad`` values are left as they were. The state_dict keys do not change.

    Compilation is specialised to the example's shape: use the FOV and batch the caller will run.
    """
    grads = {p: p.grad for p in model.parameters()}
    try:
        model.compile(backend=backend, dynamic=False, **compile_kwargs)
        if backward:
            with torch.enable_grad():
                model(example_input).sum().backward()
        else:
            with torch.inference_mode():
                model(example_input)
        return True
    except Exception as e:  # a missing C++ compiler, an unsupported op, a backend bug: stay eager
        _uncompile(model)
        with contextlib.suppress(Exception):
            torch._dynamo.reset()
        warnings.warn(f"torch.compile failed, FFN model stays eager: {type(e).__name__}: {e}", stacklevel=2)
        log.warning("torch.compile failed, FFN model stays eager: %s", e)
        return False
    finally:
        for p, g in grads.items():
            p.grad = g


def tune_for_cpu(
    model: nn.Module,
    *,
    threads: int | None = None,
    channels_last: bool = True,
    onednn: bool = True,
    compile: bool = False,
    example_input: torch.Tensor | None = None,
) -> nn.Module:
    """Apply the CPU settings that measurably speed up FFN training (docs/ffn_speed.md), in place.

    ``threads``: intra-op threads (``None``: leave as set by the launcher / OMP_NUM_THREADS).
    ``channels_last``: channels-last 3-D weights and inputs (the largest gain for training).
    ``onednn``: every 3-D conv through oneDNN (:class:`OneDNNConv3d`; the largest gain for batch-1 17³).
    ``compile``: ``torch.compile`` with an eager fallback; needs ``example_input`` of the training batch's
    shape, (B, 2, Z, Y, X). The returned object is ``model`` itself: same parameters and state_dict keys.
    """
    set_threads(threads)
    if onednn:
        onednn_convs_(model)
    if channels_last:
        channels_last_(model)
    if compile:
        if example_input is None:
            raise ValueError("tune_for_cpu(compile=True) needs example_input of the training batch's shape")
        compile_(model, example_input, backward=model.training)
    return model


class FrozenInference(nn.Module):
    """A traced, frozen copy of a model for inference (oneDNN conv+ReLU/+add fusion, weights pre-packed).

    Called like the model, inside ``torch.inference_mode``; the weights are copies: re-create it after
    loading new weights.
    """

    def __init__(self, traced: torch.jit.ScriptModule, channels_last: bool) -> None:
        super().__init__()
        self.traced = traced
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        with torch.inference_mode():
            return self.traced(x)


class BFloat16Inference(nn.Module):
    """``model``'s forward under bfloat16 autocast (convolutions in bfloat16 with float32 accumulation), its logits
    returned in float32: what the canvas reads stays float32 (``precision: bfloat16`` of the inference settings).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with forward_context("bfloat16", x.device):
            out = self.model(x)
        return out.float()


def tune_for_inference(
    model: nn.Module,
    example_input: torch.Tensor,
    *,
    threads: int | None = None,
    channels_last: bool = True,
    onednn: bool = True,
    freeze: bool = False,
    precision: str = "float32",
) -> nn.Module:
    """A module for fast flood-fill inference with the same outputs as ``model`` (which is not modified).

    ``channels_last``/``onednn``: as in :func:`tune_for_cpu`, applied to a copy with gradients off.
    ``freeze``: also trace + ``torch.jit.freeze`` (conv+ReLU/add fusion; within noise here, costs seconds of
    setup; falls back to the eager copy on failure).
    ``precision`` ``"bfloat16"``: a :class:`BFloat16Inference` around the channels-last copy with torch's own
    convolutions (autocast casts those, not the oneDNN wrapper's), not frozen; outputs within bfloat16's rounding.
    ``example_input`` is the (N, 2, Z, Y, X) input the canvas will feed (batch 1 for ``Canvas``).
    """
    set_threads(threads)
    eager = copy.deepcopy(model).eval()
    for p in eager.parameters():
        p.requires_grad_(False)
    half = precision == "bfloat16"
    if onednn and not half:
        onednn_convs_(eager)
    if channels_last:
        channels_last_(eager)
    if half:
        return BFloat16Inference(eager)
    if not freeze:
        return eager
    x = example_input.contiguous(memory_format=torch.channels_last_3d) if channels_last else example_input
    plain = copy.deepcopy(eager)
    if channels_last:
        getattr(plain, _HOOK_ATTR).remove()  # the traced graph gets its input already converted
        setattr(plain, _HOOK_ATTR, None)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarning for the model's input-shape check
            traced = torch.jit.freeze(torch.jit.trace(plain, x))
            frozen = FrozenInference(traced, channels_last)
            frozen(x)  # run once: freezing optimisations happen on the first calls
        return frozen
    except Exception as e:
        warnings.warn(f"torch.jit trace/freeze failed, inference stays eager: {e}", stacklevel=2)
        return eager
