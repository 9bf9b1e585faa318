"""The baseline a user would try first: seeded watershed, its few parameters chosen on a training volume.

Markers are either the h-maxima of the distance transform of the thresholded (smoothed) image, flooded over
the negated distance inside the cell interior (``markers="distance"``), or the h-maxima of the smoothed image
itself (the h-minima of the inverted image, membranes being dark), flooded over the negated image
(``markers="intensity"``). ``tune_watershed`` scores a small grid against the *training* labels only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hpctrain.ffn.segmentation import clear_dust, make_labels_contiguous

MARKERS = ("distance", "intensity")


@dataclass(frozen=True)
class WatershedParams:
    """One point of the watershed's parameter space.

    ``sigma``: Gaussian smoothing of the image; ``h``: the h-maxima depth (distance voxels, or grey levels
    for ``intensity`` markers); ``threshold_offset``: added to the Otsu threshold of the smoothed image that
    separates interior from membrane (``distance`` markers only); ``grow``: voxels each object is grown into
    the membrane afterwards (``distance`` only: the intensity flood already fills everything).
    """

    markers: str = "distance"
    sigma: float = 0.5
    h: float = 1.0
    threshold_offset: float = 0.0
    grow: int = 2
    min_size: int = 100

    def __post_init__(self) -> None:
        if self.markers not in MARKERS:
            raise ValueError(f"watershed markers must be one of {MARKERS}, got {self.markers!r}")
        if self.sigma < 0 or self.h <= 0:
            raise ValueError(f"watershed sigma must be >= 0 and h > 0, got sigma={self.sigma}, h={self.h}")


def watershed_segmentation(image: np.ndarray, params: WatershedParams | Mapping[str, Any] | None = None) -> np.ndarray:
    """Labels (uint32, 1..N, 0 = unassigned) of a seeded watershed of ``image`` (dark membranes)."""
    from scipy import ndimage
    from skimage.filters import threshold_otsu
    from skimage.morphology import h_maxima
    from skimage.segmentation import expand_labels, watershed

    p = params if isinstance(params, WatershedParams) else WatershedParams(**dict(params or {}))
    if image.ndim != 3:
        raise ValueError(f"watershed_segmentation: image must be 3-D (z, y, x), got shape {image.shape}")
    smooth = image.astype(np.float32)
    if p.sigma > 0:
        smooth = ndimage.gaussian_filter(smooth, p.sigma)
    if p.markers == "distance":
        interior = smooth > threshold_otsu(smooth) + p.threshold_offset
        dist = ndimage.distance_transform_edt(interior).astype(np.float32)
        markers, _ = ndimage.label(h_maxima(dist, p.h))
        labels = watershed(-dist, markers, mask=interior)
        if p.grow > 0:
            labels = expand_labels(labels, distance=p.grow)
    else:
        markers, _ = ndimage.label(h_maxima(smooth, p.h))
        labels = watershed(-smooth, markers)
    labels = clear_dust(labels, p.min_size)
    return make_labels_contiguous(labels)


def default_grid() -> list[WatershedParams]:
    """The candidates ``tune_watershed`` tries: both marker kinds over the smoothing and depths that matter on
    EM-like images (measured on the demo's training volume, docs/ffn_inference.md)."""
    grid = [WatershedParams("distance", sigma, h, offset)
            for sigma, h, offset in itertools.product((0.5, 1.0), (1.0, 2.0), (-15.0, 0.0))]
    grid += [WatershedParams("intensity", sigma, h, grow=0) for sigma, h in itertools.product((1.0, 1.5), (8.0, 12.0))]
    return grid


def tune_watershed(image: np.ndarray, labels: np.ndarray,
                   grid: Iterable[WatershedParams] | None = None) -> tuple[WatershedParams, list[dict[str, Any]]]:
    """The grid point with the lowest VOI on (``image``, ``labels``) — a training volume — and every score."""
    from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation

    tried: list[dict[str, Any]] = []
    for params in grid if grid is not None else default_grid():
        m = evaluate_segmentation(watershed_segmentation(image, params), labels)
        tried.append({**asdict(params), "voi": m["voi"], "voi_split": m["voi_split"], "voi_merge": m["voi_merge"],
                      "adapted_rand_error": m["adapted_rand_error"]})
    if not tried:
        raise ValueError("tune_watershed needs at least one parameter set")
    best = min(tried, key=lambda t: t["voi"])
    keys = WatershedParams.__dataclass_fields__
    return WatershedParams(**{k: v for k, v in best.items() if k in keys}), tried
