"""The FFN network's size and cost by formula: parameters and convolution FLOPs of one training FOV.

What docs/ffn.md and docs/ffn_speed.md derive by hand; the tests hold ``ConvStack3D`` to these numbers and
benchmarks/ffn.py turns FOVs/s into GFLOP/s with them.
"""

from __future__ import annotations


def parameter_count(depth: int, features: int) -> int:
    """Number of trainable parameters of ``ConvStack3D(depth, features)``, by formula."""
    f = features
    return (2 * 27 * f + f) + (2 * depth - 1) * (27 * f * f + f) + (f + 1)


def training_flops_per_fov(
    depth: int = 12, features: int = 32, fov: tuple[int, int, int] = (33, 33, 33)
) -> dict:
    """FLOPs of one FOV: forward = 2·MACs, backward ≈ 2 × forward (input and weight gradients).

    Counts only the convolutions (bias adds, ReLUs and the seed addition are < 0.1 %).
    """
    f = features
    macs_per_voxel = 27 * 2 * f + (2 * depth - 1) * 27 * f * f + f
    voxels = fov[0] * fov[1] * fov[2]
    forward = 2 * macs_per_voxel * voxels
    return {
        "macs_per_voxel": macs_per_voxel,
        "forward": forward,
        "backward": 2 * forward,
        "train": 3 * forward,
    }
