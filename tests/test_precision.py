"""``train.precision``: which arithmetic a rank's forward runs in (runtime/precision.py), pure parts.

The end-to-end runs are in tests/test_trainer.py (2 MPI ranks in bfloat16) and tests/test_ffn_resume.py (an
FFN run stopped and resumed in bfloat16 is bit-identical)."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config.job import TrainConfig
from hpctrain.runtime.precision import forward_context, native_bf16, resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize(("requested", "native", "want"), [
    ("float32", True, "float32"),
    ("float32", False, "float32"),
    ("bfloat16", True, "bfloat16"),
    ("bfloat16", False, "bfloat16"),  # asked for explicitly: honoured, even where it is emulated
    ("auto", True, "bfloat16"),
    ("auto", False, "float32"),
])
def test_resolve_precision_honours_the_request_and_auto_follows_the_hardware(requested: str, native: bool,
                                                                             want: str) -> None:
    asked: list[torch.device] = []

    def probe(device: torch.device) -> bool:
        asked.append(device)
        return native

    assert resolve_precision(requested, CPU, native=probe) == want
    assert asked == ([CPU] if requested == "auto" else [])  # only auto looks at the hardware


def test_resolve_precision_refuses_an_unknown_name() -> None:
    with pytest.raises(ValueError, match="'fp8'.*float32, bfloat16, auto"):
        resolve_precision("fp8", CPU)


def test_native_bf16_on_this_cpu_agrees_with_torch_amx_probe() -> None:
    assert native_bf16(CPU) is bool(torch.cpu._is_amx_tile_supported())
    assert native_bf16(torch.device("meta")) is False


def test_forward_context_casts_a_matrix_product_to_bfloat16_and_float32_leaves_it() -> None:
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with forward_context("bfloat16", CPU):
        assert layer(x).dtype == torch.bfloat16
        # what the loss needs stays float32 (autocast's float32 list)
        assert torch.nn.functional.mse_loss(layer(x), torch.zeros(3, 4)).dtype == torch.float32
    with forward_context("float32", CPU):
        assert layer(x).dtype == torch.float32
    assert layer.weight.dtype == torch.float32


def test_train_precision_is_validated_in_the_job_spec() -> None:
    base = {"steps": 1, "batch_per_rank": 1, "lr": 0.1}
    assert TrainConfig.model_validate(base).precision == "float32"
    assert TrainConfig.model_validate({**base, "precision": "auto"}).precision == "auto"
    with pytest.raises(ValueError, match="precision"):
        TrainConfig.model_validate({**base, "precision": "fp16"})
