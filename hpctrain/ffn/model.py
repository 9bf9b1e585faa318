"""The FFN convolution stack: image + seed logits in, updated object-mask logits out.

Mirrors google/ffn ``ffn/training/models/convstack_3d.py`` (``_predict_object_mask`` and
``ConvStack3DFFNModel.define_tf_graph``) in PyTorch, channels-first ``(N, C, Z, Y, X)``.
"""

from __future__ import annotations

import torch
from torch import nn

from hpctrain.config.plugins.ffn_fields import zyx


class ConvStack3D(nn.Module):
    """The residual 3-D convolution stack of the FFN (google/ffn ``ConvStack3DFFNModel``).

    Layer order, exactly as ``_predict_object_mask`` in the reference:

    * ``conv0_a``: conv 3³ 'same' (2 → features) + ReLU; ``conv0_b``: conv 3³ (features → features), no ReLU.
    * ``depth - 1`` residual modules: ``in = x; x = relu(x); x = relu(conv_a(x)); x = conv_b(x); x = x + in``.
      The ReLU sits *before* ``conv_a`` (pre-activation), none after ``conv_b``.
    * ReLU, then ``conv_lom``: conv 1³ (features → 1), no ReLU.
    * ``update_seed``: the output logits are the ``conv_lom`` logits *plus* the input seed logits (channel 1).

    Every conv has a bias (``tf.contrib.layers.conv3d`` default). Weights are Xavier/Glorot-uniform and biases
    zero, as ``tf.contrib.layers.conv3d`` initialises them.
    Parameters: ``(2·27·F + F) + (2·depth − 1)·(27·F² + F) + (F + 1)`` for ``F`` features.
    The network is fully convolutional: ``fov`` (z, y, x) only records the
    field of view it was built for, used by the training-example and inference code. ``dilations`` (not in
    the reference; default all 1) dilates each residual module's two convolutions: the receptive field grows
    by 4·d per module instead of 4 at the same cost.
    """

    def __init__(self, depth: int = 9, features: int = 32, fov: tuple[int, int, int] = (33, 33, 33),
                 dilations: tuple[int, ...] | None = None) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        dilations = tuple(int(d) for d in dilations) if dilations else (1,) * (depth - 1)
        if len(dilations) != depth - 1 or any(d < 1 for d in dilations):
            raise ValueError(f"dilations needs one value >= 1 per residual module ({depth - 1}), got {dilations}")
        if len(fov) != 3 or any(int(s) < 1 or int(s) % 2 == 0 for s in fov):
            raise ValueError(f"fov must be three odd sizes (z, y, x), got {tuple(fov)}")
        self.depth = depth
        self.features = features
        self.fov = tuple(int(s) for s in fov)
        self.dilations = dilations
        self.conv0_a = nn.Conv3d(2, features, 3, padding=1)
        self.conv0_b = nn.Conv3d(features, features, 3, padding=1)
        self.residual_a = nn.ModuleList(nn.Conv3d(features, features, 3, padding=d, dilation=d) for d in dilations)
        self.residual_b = nn.ModuleList(nn.Conv3d(features, features, 3, padding=d, dilation=d) for d in dilations)
        self.conv_lom = nn.Conv3d(features, 1, 1)
        for module in self.modules():
            if isinstance(module, nn.Conv3d):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (N, 2, Z, Y, X) = (image, seed logits). Returns (N, 1, Z, Y, X) updated seed logits."""
        if x.dim() != 5 or x.shape[1] != 2:
            raise ValueError(f"expected input of shape (N, 2, Z, Y, X) (image, seed), got {tuple(x.shape)}")
        seed = x[:, 1:2]
        net = torch.relu(self.conv0_a(x))
        net = self.conv0_b(net)
        for conv_a, conv_b in zip(self.residual_a, self.residual_b, strict=True):
            skip = net
            net = torch.relu(net)
            net = torch.relu(conv_a(net))
            net = conv_b(net) + skip
        net = torch.relu(net)
        return self.conv_lom(net) + seed


NETWORKS: dict[str, type[nn.Module]] = {"ffn": ConvStack3D, "convstack_3d": ConvStack3D}
"""FFN networks by the name a checkpoint records (``model_name``, the job's ``model``); inference builds the one
named. Every network takes the (N, 2, Z, Y, X) image + seed logits and returns (N, 1, Z, Y, X) logits."""


def build_network(name: str, model_args: dict[str, object]) -> nn.Module:
    """The network ``name`` with the ``model_args`` its constructor takes (others, such as ``deltas``, are the
    training's and inference's); an unknown name raises KeyError listing the known ones."""
    import inspect

    if name not in NETWORKS:
        raise KeyError(f"no FFN network {name!r}; known: {', '.join(sorted(NETWORKS))}")
    network = NETWORKS[name]
    accepted = set(inspect.signature(network.__init__).parameters) - {"self"}
    kwargs = {k: v for k, v in model_args.items() if k in accepted}
    if "fov" in kwargs:
        kwargs["fov"] = zyx(kwargs["fov"], "model_args.fov")  # type: ignore[arg-type]
    return network(**kwargs)
