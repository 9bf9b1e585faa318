"""The arithmetic of a rank's forward pass: float32, or bfloat16 autocast where the hardware has it.

``train.precision`` in a job spec: ``float32`` (the default: every run of a job on the same CPU kind gives the
same floats), ``bfloat16`` (the forward and its backward under ``torch.autocast``: convolutions and matrix
products in bfloat16 with float32 accumulation, the loss and every weight, gradient and optimizer state in
float32 — no loss scaling needed), or ``auto``: bfloat16 where the rank's device computes it natively (an Intel
CPU with AMX, or a CUDA GPU that supports bfloat16), else float32. bfloat16 on a CPU without AMX is emulated and
slower than float32 (docs/runtime.md, "Precision").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from hpctrain.config.precision import PRECISION_REQUESTS

if TYPE_CHECKING:
    import torch

Precision = Literal["float32", "bfloat16"]


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 convolutions and matrix products in hardware: AMX tiles on a CPU
    (Sapphire Rapids and later), a CUDA device that reports bfloat16 support."""
    import torch

    if device.type == "cpu":
        probe: Callable[[], bool] | None = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(probe()) if probe is not None else False
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return False


def resolve_precision(requested: str, device: torch.device,
                      native: Callable[[torch.device], bool] = native_bf16) -> Precision:
    """The precision a rank trains in: ``requested`` itself, or for ``auto`` bfloat16 where ``native(device)``."""
    if requested not in PRECISION_REQUESTS:
        raise ValueError(f"precision {requested!r}: expected one of {', '.join(PRECISION_REQUESTS)}")
    if requested == "auto":
        return "bfloat16" if native(device) else "float32"
    return "bfloat16" if requested == "bfloat16" else "float32"


def forward_context(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """What the forward pass (and so its backward) runs under: autocast to bfloat16, or nothing."""
    import torch

    if precision == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
