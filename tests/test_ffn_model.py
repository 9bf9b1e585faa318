"""ConvStack3D: shapes, parameter count, layer order against a hand-written forward, seed skip, FLOPs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpctrain.ffn.model import ConvStack3D
from hpctrain_bench.ffn_counts import parameter_count, training_flops_per_fov

torch.set_num_threads(1)


def test_output_shape_is_one_logit_per_voxel() -> None:
    model = ConvStack3D(depth=2, features=8, fov=(9, 11, 13))
    out = model(torch.zeros(3, 2, 9, 11, 13))
    assert out.shape == (3, 1, 9, 11, 13)


def test_parameter_count_depth12_features32_by_hand() -> None:
    model = ConvStack3D(depth=12, features=32, fov=(33, 33, 33))
    conv0_a = 3 * 3 * 3 * 2 * 32 + 32  # 2 input channels -> 32
    conv_32 = 3 * 3 * 3 * 32 * 32 + 32  # conv0_b and the two convs of each of the 11 residual modules
    conv_lom = 32 * 1 + 1
    expected = conv0_a + (1 + 2 * 11) * conv_32 + conv_lom
    assert expected == 638433
    assert sum(p.numel() for p in model.parameters()) == expected
    assert parameter_count(12, 32) == expected
    assert sum(p.numel() for p in ConvStack3D(depth=3, features=8).parameters()) == parameter_count(3, 8)


def test_forward_matches_reference_layer_order() -> None:
    """conv0_a+relu, conv0_b; per module relu -> conv_a+relu -> conv_b -> +skip; relu; conv_lom; + seed."""
    torch.manual_seed(0)
    model = ConvStack3D(depth=3, features=4, fov=(7, 7, 7))
    for p in model.parameters():  # non-zero biases so that a misplaced bias would show
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 2, 7, 7, 7)

    def conv(layer: torch.nn.Conv3d, v: torch.Tensor) -> torch.Tensor:
        return F.conv3d(v, layer.weight, layer.bias, padding=layer.padding)

    net = conv(model.conv0_b, F.relu(conv(model.conv0_a, x)))
    for a, b in zip(model.residual_a, model.residual_b, strict=True):
        net = conv(b, F.relu(conv(a, F.relu(net)))) + net
    expected = conv(model.conv_lom, F.relu(net)) + x[:, 1:2]
    torch.testing.assert_close(model(x), expected)


def test_zero_last_conv_returns_the_seed() -> None:
    model = ConvStack3D(depth=2, features=8, fov=(9, 9, 9))
    with torch.no_grad():
        model.conv_lom.weight.zero_()
        model.conv_lom.bias.zero_()
    x = torch.randn(2, 2, 9, 9, 9)
    assert torch.equal(model(x), x[:, 1:2])


def test_bad_input_and_arguments_are_refused() -> None:
    model = ConvStack3D(depth=1, features=4, fov=(5, 5, 5))
    with pytest.raises(ValueError, match=r"\(N, 2, Z, Y, X\)"):
        model(torch.zeros(1, 1, 5, 5, 5))
    with pytest.raises(ValueError, match="odd"):
        ConvStack3D(fov=(32, 33, 33))
    with pytest.raises(ValueError, match="depth"):
        ConvStack3D(depth=0)


def test_training_flops_of_the_published_model() -> None:
    flops = training_flops_per_fov(depth=12, features=32, fov=(33, 33, 33))
    macs_per_voxel = 27 * 2 * 32 + 23 * 27 * 32 * 32 + 32
    assert flops["macs_per_voxel"] == macs_per_voxel == 637664
    assert flops["forward"] == 2 * macs_per_voxel * 33**3
    assert 137e9 < flops["train"] < 138e9  # the issue's ~137 GFLOP per training FOV


def test_inference_builds_the_network_the_checkpoint_names(tmp_path, monkeypatch) -> None:
    """``load_model`` builds the network named by the checkpoint's ``model_name`` (``ffn.model.NETWORKS``), so
    another FFN network registered there segments too; an unknown name is refused listing the known ones."""
    from torch import nn

    from hpctrain.errors import CheckpointError
    from hpctrain.ffn import model as networks
    from hpctrain.ffn.inference.runner import load_model

    class Identity(nn.Module):  # another network with the FFN's contract: returns the seed logits
        def __init__(self, fov: tuple[int, int, int] = (5, 5, 5)) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.scale * x[:, 1:2]

    monkeypatch.setitem(networks.NETWORKS, "identity", Identity)
    args = {"fov": [5, 5, 5], "deltas": [1, 1, 1], "depth": 3}  # depth: the ConvStack's, not Identity's
    torch.save({"model": Identity().state_dict(), "model_args": args, "model_name": "identity"}, tmp_path / "a.pt")
    model, model_args, ckpt = load_model(tmp_path / "a.pt")
    assert isinstance(model, Identity) and model_args == args and ckpt["model_name"] == "identity"
    plain = ConvStack3D(depth=1, features=4, fov=(5, 5, 5))
    torch.save({"model": plain.state_dict(), "model_args": {"depth": 1, "features": 4, "fov": 5}}, tmp_path / "b.pt")
    assert isinstance(load_model(tmp_path / "b.pt")[0], ConvStack3D)  # no name: the FFN's own network
    torch.save({"model": {}, "model_args": args, "model_name": "nope"}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="no FFN network 'nope'; known: convstack_3d, ffn, identity"):
        load_model(tmp_path / "c.pt")
