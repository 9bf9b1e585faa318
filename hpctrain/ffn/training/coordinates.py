"""Training-example coordinates: partitions by local object fraction, balanced coordinates, rank shards.

Mirrors google/ffn ``compute_partitions.py`` (``compute_partitions``, ``_summed_volume_table``,
``_query_summed_volume``, ``segmentation.clear_dust``) and ``build_coordinates.py`` (``main``). All
coordinates here are (z, y, x) voxel indices of the full volume.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import ndimage

from hpctrain.errors import DataError
from hpctrain.ffn.segmentation import clear_dust
from hpctrain.files import write_atomic

#: google/ffn README thresholds for FIB-25 (14 partitions: 0 = background, 1..13 by active fraction).
DEFAULT_THRESHOLDS: tuple[float, ...] = (0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Partition value of voxels never used as a training centre (the reference's IGNORE_PARTITION).
IGNORE_PARTITION = 255


def lom_radius_for(fov: Sequence[int], deltas: Sequence[int]) -> tuple[int, int, int]:
    """The reference's recommended LOM radius: ``fov // 2 + deltas`` (z, y, x)."""
    return tuple(int(f) // 2 + int(d) for f, d in zip(fov, deltas, strict=True))  # type: ignore[return-value]


def _box_sums(mask: np.ndarray, radius: Sequence[int]) -> np.ndarray:
    """Sum of ``mask`` over the (2r+1)-box around every voxel, zero outside (summed-volume table)."""
    rz, ry, rx = radius
    dtype = np.int32 if mask.size < 2**31 else np.int64
    padded = np.pad(mask.astype(dtype), [(rz + 1, rz), (ry + 1, ry), (rx + 1, rx)])
    svt = padded.cumsum(0).cumsum(1).cumsum(2)
    dz, dy, dx = 2 * rz + 1, 2 * ry + 1, 2 * rx + 1
    nz, ny, nx = mask.shape
    hi_z, hi_y, hi_x = slice(dz, dz + nz), slice(dy, dy + ny), slice(dx, dx + nx)
    lo_z, lo_y, lo_x = slice(0, nz), slice(0, ny), slice(0, nx)
    return (
        svt[hi_z, hi_y, hi_x]
        - svt[lo_z, hi_y, hi_x]
        - svt[hi_z, lo_y, hi_x]
        - svt[hi_z, hi_y, lo_x]
        + svt[lo_z, lo_y, hi_x]
        + svt[lo_z, hi_y, lo_x]
        + svt[hi_z, lo_y, lo_x]
        - svt[lo_z, lo_y, lo_x]
    )


def compute_partitions(
    labels: np.ndarray,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    lom_radius: Sequence[int] = (24, 24, 24),
    min_size: int = 10000,
) -> np.ndarray:
    """Quantised fraction of same-label voxels in the (2r+1)³ box around each voxel -> uint8, same shape.

    Like google/ffn ``compute_partitions``: objects below ``min_size`` voxels become background; voxels of
    label 0 get partition 0; a labelled voxel with active fraction ``a`` gets
    ``1 + #{t in thresholds: t <= a}`` (1 .. len(thresholds)+1).
    Unlike the reference, the output keeps the input shape: voxels within
    ``lom_radius`` of the border (where the reference crops its 'VALID' output) are ``IGNORE_PARTITION``.
    One summed-volume table per object, over its bounding box grown by the radius only.
    """
    labels = np.asarray(labels)
    if labels.ndim != 3:
        raise DataError(f"labels have shape {labels.shape}; compute_partitions needs a 3-D (z, y, x) volume")
    radius = np.array([int(r) for r in lom_radius])
    thresholds = np.asarray(sorted(float(t) for t in thresholds))
    if len(thresholds) + 1 >= IGNORE_PARTITION:
        raise ValueError(f"at most {IGNORE_PARTITION - 2} thresholds, got {len(thresholds)}")
    shape = np.array(labels.shape)
    if np.any(shape <= 2 * radius):
        raise DataError(
            f"labels of shape {tuple(shape)} are too small for lom_radius {tuple(radius)}",
            hint="every axis needs more than 2 * lom_radius voxels",
        )
    labels = clear_dust(labels, min_size)
    # Dense ids 1..n (0 stays background) so that find_objects is not sized by the largest raw id.
    ids, dense = np.unique(labels, return_inverse=True)
    dense = dense.reshape(labels.shape) + (0 if ids[0] == 0 else 1)
    out = np.full(labels.shape, IGNORE_PARTITION, dtype=np.uint8)
    valid = tuple(slice(int(r), int(s - r)) for r, s in zip(radius, shape, strict=True))
    out[valid] = 0
    fov_volume = float(np.prod(2 * radius + 1))
    for index, box in enumerate(ndimage.find_objects(dense)):
        if box is None:
            continue
        obj = index + 1
        region = tuple(
            slice(max(b.start - int(r), 0), min(b.stop + int(r), int(s)))
            for b, r, s in zip(box, radius, shape, strict=True)
        )
        mask = dense[region] == obj
        fraction = _box_sums(mask, radius) / fov_volume
        part = (np.searchsorted(thresholds, fraction, side="right") + 1).astype(np.uint8)
        view = out[region]
        sel = mask & (view == 0)
        view[sel] = part[sel]
    return out


def build_coordinates(
    partitions: np.ndarray, margin: Sequence[int], seed: int = 0, *, ignore: int = IGNORE_PARTITION
) -> np.ndarray:
    """Training centres (K, 3) int64 (z, y, x), every partition equally often (google/ffn build_coordinates).

    Voxels within ``margin`` of the border and of partition ``ignore`` are left out. Each partition's voxels
    are permuted and repeated (``np.resize``) up to the largest partition's count, then all are shuffled; so
    K = (number of partitions present) x (largest count). Deterministic in ``seed``.
    """
    partitions = np.asarray(partitions)
    m = [int(x) for x in margin]
    inner = tuple(slice(mi, s - mi) for mi, s in zip(m, partitions.shape, strict=True))
    part = partitions[inner]
    if part.size == 0:
        raise DataError(f"margin {tuple(m)} leaves nothing of a volume of shape {partitions.shape}")
    rng = np.random.default_rng(seed)
    flat = part.ravel()
    values = [int(v) for v in np.unique(flat) if int(v) != ignore]
    if not values:
        raise DataError(
            "no voxel is eligible as a training centre", hint="lower min_size, margin or lom_radius"
        )
    groups = [np.flatnonzero(flat == v) for v in values]
    max_count = max(len(g) for g in groups)
    picked = np.concatenate([np.resize(rng.permutation(g), max_count) for g in groups])
    rng.shuffle(picked)
    coords = np.stack(np.unravel_index(picked, part.shape), axis=1).astype(np.int64)
    return coords + np.array(m, dtype=np.int64)


def write_coordinates(path: str | Path, coords: np.ndarray, **meta: object) -> Path:
    """Write coordinates once, atomically, as .npz ('coords' (K, 3) int64 z, y, x, plus scalar metadata)."""
    path = Path(path)
    coords = np.asarray(coords, dtype=np.int64)
    if coords.ndim != 2 or coords.shape[1] != 3:
        raise ValueError(f"coords must be (K, 3), got {coords.shape}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: np.savez(f, coords=coords, **{k: np.asarray(v) for k, v in meta.items()}))
    return path


def read_coordinates(path: str | Path) -> np.ndarray:
    """Read coordinates written by ``write_coordinates``; DataError for a missing or malformed file."""
    path = Path(path)
    if not path.exists():
        raise DataError(
            f"coordinate file {path} does not exist", hint="build it with build_coordinates first"
        )
    try:
        with np.load(path) as data:
            coords = data["coords"]
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{path} is not a coordinate file written by write_coordinates ({e})") from e
    if coords.ndim != 2 or coords.shape[1] != 3 or coords.dtype.kind not in "iu":
        raise DataError(
            f"{path}: 'coords' has shape {coords.shape} dtype {coords.dtype}; expected (K, 3) integers"
        )
    return coords.astype(np.int64, copy=False)


def shard(coords: np.ndarray, rank: int, world_size: int, epoch: int, seed: int = 0) -> np.ndarray:
    """This rank's coordinates for ``epoch``: a per-epoch permutation cut into ``world_size`` equal blocks.

    Every rank computes the same permutation (seeded by ``(seed, epoch)``), so blocks are disjoint and each
    rank gets ``K // world_size`` coordinates (synchronous ranks must run equally many steps); the
    ``K % world_size`` left over differ from epoch to epoch.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    per_rank = len(coords) // world_size
    if per_rank == 0:
        raise DataError(
            f"{len(coords)} coordinates cannot feed {world_size} ranks", hint="build more coordinates"
        )
    order = np.random.default_rng([seed, epoch]).permutation(len(coords))
    return np.asarray(coords)[order[rank * per_rank : (rank + 1) * per_rank]]
