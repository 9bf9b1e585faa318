"""Object probabilities as the model's logits: the one conversion the canvas's thresholds, the training seeds
and the training move thresholds are written with."""

from __future__ import annotations

import math


def logit(p: float) -> float:
    """log(p / (1 - p)) for 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a probability threshold must lie strictly between 0 and 1, got {p}")
    return math.log(p / (1.0 - p))
