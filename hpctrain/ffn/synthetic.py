"""Synthetic EM-like volumes with ground truth: packed branching neurites, dark membranes, texture, noise.

Stands in for FIB-25 in tests and benchmarks: deterministic by seed, 64×96×96 in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage


def _random_walk(
    rng: np.random.Generator, shape: np.ndarray, start: np.ndarray, direction: np.ndarray, wiggle: float
) -> np.ndarray:
    """Integer voxel positions of a smooth random walk from ``start`` until it leaves the volume."""
    points = []
    pos = start.astype(float)
    d = direction / np.linalg.norm(direction)
    for _ in range(4 * int(shape.max())):
        if np.any(pos < 0) or np.any(pos > shape - 1):
            break
        points.append(np.round(pos).astype(np.int64))
        d = d + rng.normal(0.0, wiggle, 3)
        d /= np.linalg.norm(d)
        pos = pos + d
    return np.array(points, dtype=np.int64).reshape(-1, 3)


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    """Gaussian-smoothed white noise rescaled to zero mean, unit standard deviation."""
    field = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma)
    return (field - field.mean()) / (field.std() + 1e-8)


def make_synthetic_volume(
    shape: tuple[int, int, int] = (64, 96, 96),
    seed: int = 0,
    *,
    neurites: int | None = None,
    branch_prob: float = 0.4,
    blobs: int = 2,
    wiggle: float = 0.12,
    membrane_contrast: float = 90.0,
    faint_fraction: float = 0.25,
    faint_contrast: float = 0.15,
    blur_sigma: float = 0.7,
    noise_sigma: float = 8.0,
    shading: float = 0.0,
    membrane_width: int = 2,
    membrane_on_neighbours: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(image uint8, labels uint32)`` of ``shape`` (z, y, x), deterministic in ``seed``.

    Objects are the Voronoi cells (nearest-centreline regions) of smooth random walks, so they are elongated,
    tightly packed, and branch where a walk starts from a point of an earlier walk with the same id; ``blobs``
    point seeds add round cell-body-like objects. Voxels with a 6-neighbour of another object are membrane:
    a 2-voxel dark boundary, labelled **0** (background, as google/ffn treats 0: never a training object).
    The image has a per-object base intensity, smooth intracellular texture, dark vesicle-like specks inside
    objects (false boundaries for a threshold), membranes whose contrast fades to ``faint_contrast`` (a fraction of
    ``membrane_contrast``) over a ``faint_fraction`` of their area, Gaussian blur, Gaussian noise and optional
    ``shading`` (a smooth brightness field across the volume). ``membrane_width`` (2, 4, 6, ... voxels) thickens
    the membranes symmetrically; cell sizes follow from ``neurites`` (default: one per 15 000 voxels).

    ``membrane_on_neighbours`` (off by default, so every volume of earlier runs stays the same): the brightness a
    membrane voxel is darkened from is that of the nearest object, so a membrane is ``membrane_contrast`` (times
    ``faint_contrast`` where faint) darker than the objects it separates. Off, every membrane voxel starts from
    one brightness drawn like an object's (that of label 0), so the membranes' real contrast differs from volume
    to volume by that draw: where faint they can be as bright as their objects (held-out seed 2: 3.5 grey levels
    darker, seed 3: 0.2) or clearly darker (seed 5: 23), docs/ffn_log.md.
    """
    if membrane_width < 2 or membrane_width % 2:
        raise ValueError(f"membrane_width must be an even number of voxels >= 2, got {membrane_width}")
    rng = np.random.default_rng(seed)  # drawn from in this order: centrelines, then the image
    centre = _centrelines(rng, shape, neurites, branch_prob, blobs, wiggle)
    labels, membrane = _cells(centre, membrane_width)
    image = _image(rng, labels, membrane, membrane_contrast=membrane_contrast, faint_fraction=faint_fraction,
                   faint_contrast=faint_contrast, blur_sigma=blur_sigma, noise_sigma=noise_sigma, shading=shading,
                   membrane_on_neighbours=membrane_on_neighbours)
    return image, labels


def _centrelines(rng: np.random.Generator, shape: tuple[int, int, int], neurites: int | None, branch_prob: float,
                 blobs: int, wiggle: float) -> np.ndarray:
    """The objects' centrelines (random walks, branching) and blob points, as a uint32 id volume (0 elsewhere)."""
    zyx = np.array(shape, dtype=np.int64)
    if neurites is None:
        neurites = max(4, int(round(np.prod(zyx) / 15000)))
    centre = np.zeros(shape, dtype=np.uint32)
    walks: list[np.ndarray] = []
    next_id = 1
    for _ in range(neurites):
        if walks and rng.random() < branch_prob:
            parent = rng.integers(len(walks))
            start = walks[parent][rng.integers(len(walks[parent]))]
            obj = int(centre[tuple(start)])
            forward = [_random_walk(rng, zyx, start, rng.normal(size=3), wiggle)]
        else:
            start = rng.uniform(0, zyx - 1)
            obj, next_id = next_id, next_id + 1
            d = rng.normal(size=3)
            forward = [_random_walk(rng, zyx, start, d, wiggle), _random_walk(rng, zyx, start, -d, wiggle)]
        for walk in forward:
            if len(walk):
                centre[walk[:, 0], walk[:, 1], walk[:, 2]] = obj
                walks.append(walk)
    for _ in range(blobs):
        p = rng.integers(0, zyx)
        centre[tuple(p)] = next_id
        next_id += 1
    return centre


def _cells(centre: np.ndarray, membrane_width: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels 1..N with membranes 0, the membrane mask): the Voronoi cells of the centrelines, their borders
    ``membrane_width`` voxels thick."""
    shape = centre.shape
    # Voronoi of the centrelines: every voxel takes the id of its nearest centreline voxel.
    _, nearest = ndimage.distance_transform_edt(centre == 0, return_indices=True)
    labels = centre[nearest[0], nearest[1], nearest[2]]
    membrane = np.zeros(shape, dtype=bool)
    for axis in range(3):
        diff = np.diff(labels, axis=axis) != 0
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis] = slice(None, -1)
        hi[axis] = slice(1, None)
        membrane[tuple(lo)] |= diff
        membrane[tuple(hi)] |= diff
    if membrane_width > 2:  # one more voxel on each side per step
        membrane = ndimage.binary_dilation(membrane, ndimage.generate_binary_structure(3, 1),
                                           iterations=(membrane_width - 2) // 2)
    labels = np.where(membrane, 0, labels).astype(np.uint32)
    # Renumber consecutively (branches and blobs may leave gaps).
    _, labels = np.unique(labels, return_inverse=True)
    return labels.reshape(shape).astype(np.uint32), membrane


def _image(rng: np.random.Generator, labels: np.ndarray, membrane: np.ndarray, *, membrane_contrast: float,
           faint_fraction: float, faint_contrast: float, blur_sigma: float, noise_sigma: float, shading: float,
           membrane_on_neighbours: bool) -> np.ndarray:
    """The uint8 EM-like image of ``labels``: object brightness and texture, specks, fading membranes, blur,
    noise and shading (``make_synthetic_volume``'s knobs)."""
    shape = labels.shape
    base = rng.uniform(150.0, 200.0, size=int(labels.max()) + 1).astype(np.float32)
    if membrane_on_neighbours:  # no random draw: the volume's other features stay those of the default
        _, nearest = ndimage.distance_transform_edt(membrane, return_indices=True)
        image = base[labels[nearest[0], nearest[1], nearest[2]]]
    else:
        image = base[labels]
    image = image + 10.0 * _smooth_noise(rng, shape, 1.5)
    specks = _smooth_noise(rng, shape, 1.0) > 2.6
    image[specks & ~membrane] -= 0.6 * membrane_contrast
    # Membrane contrast varies smoothly; where the field is low the membrane is nearly invisible.
    fade = _smooth_noise(rng, shape, 6.0)
    faint = fade < np.quantile(fade, faint_fraction)
    contrast = np.where(faint, faint_contrast, 1.0) * membrane_contrast
    image[membrane] -= contrast[membrane]
    image = ndimage.gaussian_filter(image, blur_sigma)
    image += rng.normal(0.0, noise_sigma, shape).astype(np.float32)
    if shading:
        # Uneven staining / illumination: a smooth field (standard deviation ``shading`` grey levels) that a
        # global threshold cannot follow but local contrast ignores; drawn last, so all else stays the same.
        image += shading * _smooth_noise(rng, shape, max(shape) / 4)
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def write_hdf5(path: str | Path, image: np.ndarray, labels: np.ndarray) -> Path:
    """Write ``image`` and ``labels`` as datasets 'image' and 'labels' of one HDF5 file (chunked, gzip)."""
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("image", data=image, chunks=True, compression="gzip", compression_opts=1)
        f.create_dataset("labels", data=labels, chunks=True, compression="gzip", compression_opts=1)
    return path
