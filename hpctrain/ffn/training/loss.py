"""The FFN's loss and gradient clipping.

Mirrors google/ffn ``ffn/training/model.py`` (``set_up_sigmoid_pixelwise_loss``, ``max_gradient_entry_mag``). The
data-parallel loop is not here: the FFN task's ``forward_loss`` gives the runtime ``fov_loss``; the runtime runs
backward, reduces gradients, then calls the task's ``clip_gradients`` (``clip_gradients_``) and the optimizer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def edge_band(labels: torch.Tensor, radius: int) -> torch.Tensor:
    """1.0 where a voxel lies within ``radius`` (in the max-norm) of the seed object's edge, on either side:
    the object mask grown by ``radius`` less the mask shrunk by ``radius``. FOV borders are not edges."""
    mask = (labels > 0.5).to(labels.dtype)
    # grown - shrunk = max(mask) + max(-mask) over the cube, both in one pass over (mask, -mask) stacked as
    # channels: the same values as max-pooling, 1.2 -> 0.2 ms per 2 x 4 FOVs of 15^3 (docs/ffn_log.md)
    channels = mask.shape[1]
    both = _cube_max(torch.cat([mask, -mask], dim=1), radius)
    return both[:, :channels] + both[:, channels:]


def _cube_max(values: torch.Tensor, radius: int) -> torch.Tensor:
    """Max over the (2·radius + 1)³ cube around each voxel of (N, C, Z, Y, X) ``values``, the border excluded:
    per axis, each voxel takes the max of its neighbours 1..radius away on either side (exact, any order)."""
    for dim in (2, 3, 4):
        n = values.shape[dim]
        out = values.clone()
        for shift in range(1, min(radius, n - 1) + 1):
            lower, upper = out.narrow(dim, 0, n - shift), out.narrow(dim, shift, n - shift)
            torch.maximum(lower, values.narrow(dim, shift, n - shift), out=lower)
            torch.maximum(upper, values.narrow(dim, 0, n - shift), out=upper)
        values = out
    return values


def fov_loss(logits: torch.Tensor, labels: torch.Tensor, boundary_weight: float = 0.0,
             boundary_radius: int = 2) -> torch.Tensor:
    """Mean voxel-wise sigmoid cross-entropy (FFNModel.set_up_sigmoid_pixelwise_loss, unit weights).

    ``boundary_weight`` > 0 (not in the reference): a weighted mean in which voxels within ``boundary_radius``
    of the seed object's edge count ``1 + boundary_weight`` times. They are where a flood leaks into a
    neighbour or stops short; the bulk of a FOV (deep inside the object, or far outside it) is learnt early
    and otherwise dominates the mean."""
    if boundary_weight <= 0:
        return F.binary_cross_entropy_with_logits(logits, labels)
    weights = 1.0 + boundary_weight * edge_band(labels, boundary_radius)
    per_voxel = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (per_voxel * weights).sum() / weights.sum()


def clip_gradients_(model: torch.nn.Module, value: float = 0.7) -> None:
    """Clip every gradient entry to [-value, value] in place (FFNModel.set_up_optimizer,
    ``max_gradient_entry_mag=0.7``: ``tf.clip_by_value`` per element, not a norm). Call after the
    gradient reduction and before ``optimizer.step()``; ``value <= 0`` disables it, as in the reference."""
    if value <= 0:
        return
    for p in model.parameters():
        if p.grad is not None:
            p.grad.clamp_(-value, value)
