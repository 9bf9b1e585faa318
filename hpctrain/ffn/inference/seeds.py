"""FFN seed policies: the (z, y, x) points from which the canvas tries to flood a new object.

Mirrors google/ffn ``ffn/inference/seed.py`` (``PolicyPeaks``, ``PolicyGrid3d``, the border filtering of
``BaseSeedPolicy.__next__``). Every policy returns an int64 array of shape (n, 3) in a deterministic order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SEED_POLICIES = ("peaks", "grid")


def peak_seeds(
    image: np.ndarray,
    *,
    min_distance: int = 3,
    sigma: float = 49.0 / 6.0,
    mask: np.ndarray | None = None,
    noise_seed: int = 42,
    order: str = "zyx",
) -> np.ndarray:
    """Points far from edges: google/ffn ``PolicyPeaks``.

    Sobel gradient magnitude of the image → edges are voxels whose magnitude exceeds a Gaussian-smoothed
    (sigma 49/6) copy of itself (the reference's adaptive threshold; it does not use Otsu) → Euclidean
    distance transform of the non-edge voxels → local maxima (``peak_local_max``, ``min_distance``,
    thresholds 0) of the distance plus 1e-4 of uniform noise drawn from a fixed seed (42, as the
    reference) to break ties on plateaus → sorted ascending in (z, y, x), as the reference does, or with
    ``order="distance"`` farthest from an edge first (not in the reference: an object is then started from
    its interior before a seed near a faint membrane can flood it from its neighbour).
    ``mask`` (True = excluded) counts as edge, so the distance transform is not skewed by masked areas.
    """
    from scipy import ndimage
    from skimage.feature import peak_local_max

    if image.ndim != 3:
        raise ValueError(f"peak_seeds: image must be 3-D (z, y, x), got shape {image.shape}")
    edges = ndimage.generic_gradient_magnitude(image.astype(np.float32), ndimage.sobel)
    local_mean = ndimage.gaussian_filter(edges, sigma, mode="reflect")
    filt_edges = edges > local_mean
    if mask is not None:
        filt_edges[mask.astype(bool)] = True
    dt = ndimage.distance_transform_edt(~filt_edges).astype(np.float32)
    # A private generator: reproducible whatever happened to the global numpy state before.
    noise = np.random.default_rng(noise_seed).random(dt.shape, dtype=np.float32) * np.float32(1e-4)
    idxs = peak_local_max(dt + noise, min_distance=min_distance, threshold_abs=0, threshold_rel=0)
    if len(idxs) == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if order == "distance":
        ranked = np.argsort(-(dt + noise)[idxs[:, 0], idxs[:, 1], idxs[:, 2]], kind="stable")
        return idxs[ranked].astype(np.int64)
    if order != "zyx":
        raise ValueError(f"peak_seeds: order must be 'zyx' or 'distance', got {order!r}")
    ranked = np.lexsort((idxs[:, 2], idxs[:, 1], idxs[:, 0]))
    return idxs[ranked].astype(np.int64)


def grid_seeds(
    shape: Sequence[int], *, step: int = 16, offsets: Sequence[int] = (0, 8, 4, 12, 2, 10, 14)
) -> np.ndarray:
    """Points on a uniform grid, one pass per offset: google/ffn ``PolicyGrid3d``."""
    coords = [
        (z, y, x)
        for off in offsets
        for z in range(off, shape[0], step)
        for y in range(off, shape[1], step)
        for x in range(off, shape[2], step)
    ]
    return np.array(coords, dtype=np.int64).reshape(-1, 3)


def within_margin(coords: np.ndarray, shape: Sequence[int], margin: Sequence[int]) -> np.ndarray:
    """Keep seeds whose FOV (+/- margin) lies inside the volume (``BaseSeedPolicy.__next__`` filter)."""
    c = np.asarray(coords, dtype=np.int64).reshape(-1, 3)
    m = np.asarray(margin, dtype=np.int64)
    ok = np.all(c - m >= 0, axis=1) & np.all(c + m < np.asarray(shape), axis=1)
    return c[ok]


def make_seeds(policy: str, image: np.ndarray, **kwargs: object) -> np.ndarray:
    """Seeds from the policy named ``policy`` ('peaks' or 'grid'); ``kwargs`` go to that policy."""
    if policy == "peaks":
        return peak_seeds(image, **kwargs)  # type: ignore[arg-type]
    if policy == "grid":
        return grid_seeds(image.shape, **kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unknown seed policy {policy!r}; valid: {', '.join(SEED_POLICIES)}")
