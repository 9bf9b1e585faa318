"""``model: resnet``: the small residual CNN on scikit-learn's 8x8 digits, its ``model_args`` and ``data``.

The dataset's size is known without loading it, so the laptop checks that a step's batch fits in the
training images and can count steps per epoch (LEGW warm-up, decay every N epochs) as the ranks do.
"""

from __future__ import annotations

from pydantic import Field

from hpctrain.config.common import Strict
from hpctrain.config.job import JobSpec
from hpctrain.config.plugin import ModelSchema
from hpctrain.errors import ConfigError

# Images in sklearn.datasets.load_digits (fixed since scikit-learn 0.x; tests/test_preflight.py checks it).
DIGITS_IMAGES = 1797


class DigitsArgs(Strict):
    """``model_args`` of ``model: resnet``."""

    channels: int = Field(16, ge=1, description="Feature maps of every convolution")
    blocks: int = Field(2, ge=0, description="Residual blocks after the stem convolution")


class DigitsData(Strict):
    """``data`` of ``model: resnet``."""

    holdout: int = Field(297, ge=1, lt=DIGITS_IMAGES,
                         description=f"First images kept out of training for the test accuracy (of {DIGITS_IMAGES})")


class DigitsSchema(ModelSchema):
    model_args = DigitsArgs
    data = DigitsData

    def dataset_size(self, args: DigitsArgs, data: DigitsData) -> int:
        return DIGITS_IMAGES - data.holdout

    def check(self, args: DigitsArgs, data: DigitsData, job: JobSpec, world_size: int) -> list[str]:
        images, batch = self.dataset_size(args, data), job.train.batch_per_rank
        if images < batch * world_size:
            raise ConfigError(f"{images} training images cannot fill one step of {world_size} ranks x {batch}",
                              key="train.batch_per_rank",
                              hint=f"lower batch_per_rank to {max(1, images // world_size)} or data.holdout")
        return []


SCHEMA = DigitsSchema()
