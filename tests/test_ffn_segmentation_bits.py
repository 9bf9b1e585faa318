"""The inference path's output, bit for bit: a fixed stand-in model on a fixed synthetic volume with the demo
job's inference settings (bounded floods, self-prediction, reseeding, split pieces, a join model, average
linkage, watershed fill, objects flooded two at a time) gives the segmentation recorded in
``tests/data/ffn/segmentation_bits.npz``. The stand-in computes with exact float32 comparisons only, so the
recorded labels hold on any CPU; a change to the inference code that changes what it segments fails here.

Regenerate the record only for a change meant to change the segmentation:
``python tests/test_ffn_segmentation_bits.py --write``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

RECORD = Path(__file__).resolve().parent / "data" / "ffn" / "segmentation_bits.npz"
# A join model over the six pair features (a fit on a demo run's training volume, rounded).
JOIN_MODEL = {"features": ["claim", "gap", "brightness_difference", "log_contact", "touch", "membrane_dip"],
              "mean": [0.6, 0.3, 10.0, 4.0, 0.5, 5.0], "scale": [0.3, 0.2, 8.0, 1.5, 0.2, 4.0],
              "coef": [1.5, -1.0, -0.8, 0.4, 0.3, -1.2], "intercept": 0.2}
# The demo job's data.eval.inference, on a FOV of 9 (the stand-in needs no training).
SETTINGS = {"fov": (9, 9, 9), "deltas": (3, 3, 3), "segment_threshold": 0.7, "move_threshold": 0.7,
            "min_segment_size": 40, "reseed_passes": 3, "max_seed_distance": 6, "split_pieces": True,
            "agglomerate_threshold": 0.5, "linkage": "average", "watershed_fill": True,
            "seed_args": {"order": "distance"}, "self_prediction": 0.7, "self_prediction_radius": 3,
            "concurrent_floods": 2, "speculative_self_prediction": True, "join_model": JOIN_MODEL,
            "image_mean": 128.0, "image_stddev": 33.0}


class BrightnessModel(nn.Module):
    """Object = FOV voxels within 0.5 (normalised grey levels) of the median of those the seed marks, with a
    confidence that falls off from the FOV centre; exact comparisons only, so the same on every CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        img, seed = x[:, 0], x[:, 1]
        axes = [torch.arange(d, dtype=torch.float32) - d // 2 for d in seed.shape[1:]]
        zz, yy, xx = torch.meshgrid(*axes, indexing="ij")
        conf = 6.0 - 0.25 * (zz.abs() + yy.abs() + xx.abs())
        out = torch.full_like(seed, -6.0)
        for n in range(x.shape[0]):
            marked = seed[n] > 0
            if bool(marked.any()):
                value = img[n][marked].median()
                out[n] = torch.where((img[n] - value).abs() < 0.5, conf, torch.tensor(-6.0))
        return out[:, None]


def volume() -> np.ndarray:
    from hpctrain.ffn.synthetic import make_synthetic_volume

    image, _ = make_synthetic_volume((20, 40, 40), 5, neurites=20)
    return image


def segmentations() -> dict[str, np.ndarray]:
    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.ffn.inference.runner import segment_volume, segment_volumes_together

    torch.set_num_threads(1)
    image = volume()
    cfg = InferenceConfig.from_mapping(SETTINGS)
    whole = segment_volume(BrightnessModel(), image, cfg)
    halves = segment_volumes_together(BrightnessModel(), [image[:, :, :24], image[:, :, 16:]], cfg)
    return {"whole": whole, "left": halves[0], "right": halves[1]}


@pytest.mark.processes
def test_the_demo_settings_segment_a_fixed_volume_as_recorded() -> None:
    recorded = np.load(RECORD)
    got = segmentations()
    assert set(got) == set(recorded.files)
    assert got["whole"].max() >= 5  # the record is of a real segmentation, not an empty one
    for name, labels in got.items():
        assert labels.dtype == recorded[name].dtype and np.array_equal(labels, recorded[name]), name


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    np.savez_compressed(RECORD, **segmentations())
