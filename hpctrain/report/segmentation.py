"""The segmentation slices a report draws: a few z planes of an FFN run's label volume (``*segmentation*.h5``,
dataset ``segmentation``), each read subsampled to at most SIDE × SIDE voxels, the most its picture shows.

Only those voxels are read, whatever shape the file declares; its shape and dtype are checked from the header
first, and a file that is not a regular one (a FIFO would block the open) is named, never opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.files import NotRegularFile, check_regular
from hpctrain.memory_budget import MemoryBudget, array_bytes, memory_budget

SLICES = 3
SIDE = 256  # voxels per side of a drawn plane: its picture is 3 inches at 72 dpi, 216 pixels
DATASET = "segmentation"
PATTERN = "*segmentation*.h5"
# Bytes per drawn voxel besides the labels read: their int64 copy and the float64 RGB picture made of them.
DRAWN_BYTES_PER_VOXEL = 8 + 3 * 8


def slice_depths(depth: int, count: int = SLICES) -> list[int]:
    """``count`` z planes spread evenly through ``depth`` (fewer where the volume is thinner)."""
    return sorted({max(0, min(depth - 1, depth * (i + 1) // (count + 1))) for i in range(count)})


def plane_steps(height: int, width: int, side: int = SIDE) -> tuple[int, int]:
    """Strides along y and x that leave at most ``side`` voxels of each."""
    return max(1, -(-height // side)), max(1, -(-width // side))


def sampled_plane(labels: Any, z: int, sy: int, sx: int) -> Any:
    """``labels[z, ::sy, ::sx]`` of an HDF5 dataset, read one band of chunk rows at a time: each chunk is read
    once, and HDF5 never plans more than one band's chunks at once (a whole plane of a dataset declaring 10^6 per
    side would plan 65,536 chunks, half a GB of bookkeeping, for 256 x 256 voxels)."""
    import numpy as np

    height = int(labels.shape[1])
    band = int(labels.chunks[1]) if labels.chunks else 64
    rows = range(0, height, sy)
    parts = []
    first = 0
    while first < len(rows):
        last = first
        while last + 1 < len(rows) and rows[last + 1] // band == rows[first] // band:
            last += 1
        parts.append(np.asarray(labels[z, rows[first]:rows[last] + 1:sy, ::sx]))
        first = last + 1
    return np.concatenate(parts)


def sampled_planes(labels: Any, budget: MemoryBudget, name: str) -> list[tuple[str, Any]]:
    """(title, int64 plane) of the drawn z planes of an opened 3-D integer dataset, each subsampled."""
    import numpy as np

    depth, height, width = (int(n) for n in labels.shape)
    sy, sx = plane_steps(height, width)
    zs = slice_depths(depth)
    drawn = (len(zs), -(-height // sy), -(-width // sx))
    budget.check(array_bytes(drawn, labels.dtype.itemsize + DRAWN_BYTES_PER_VOXEL), f"drawing {drawn} of {name}")
    step = f" (every {sy}×{sx})" if (sy, sx) != (1, 1) else ""
    return [(f"{name} z={z}{step}", sampled_plane(labels, z, sy, sx).astype(np.int64)) for z in zs]


def segmentation_slices(places: tuple[Path, ...],
                        budget: MemoryBudget | None = None) -> tuple[list[tuple[str, Any]], str]:
    """The drawn planes of the first label volume found (a held-out one first), or none and why."""
    found = [p for place in places for p in sorted(place.glob(PATTERN))]
    if not found:
        return [], f"no segmentation in the run's files (an FFN run's {PATTERN})"
    found.sort(key=lambda p: (not p.name.startswith("heldout"), p.name))
    path = found[0]
    try:
        import h5py
    except ImportError as exc:
        return [], f"{path.name} is there but h5py/numpy are not installed to read it ({exc})"
    try:
        check_regular(path)
    except NotRegularFile as exc:
        return [], f"{path.name} is {exc.kind}, not a regular file: not read"
    except OSError as exc:
        return [], f"cannot read {path.name}: {exc.strerror or exc}"
    try:
        with h5py.File(path, "r") as f:
            labels = f.get(DATASET)
            if not isinstance(labels, h5py.Dataset):
                return [], f"{path.name} has no dataset '{DATASET}'"
            if labels.ndim != 3 or labels.dtype.kind not in "iub" or 0 in labels.shape:
                return [], (f"{path.name}:{DATASET} is {labels.shape} {labels.dtype}, not a 3-D volume of integer "
                            "labels: not drawn")
            return sampled_planes(labels, budget or memory_budget(), path.name), ""
    except HpctrainError as exc:  # the budget, or a budget variable that is not a number
        return [], f"{path.name} not drawn: {exc}"
    except (OSError, KeyError, ValueError, IndexError, TypeError) as exc:
        return [], f"cannot read {path.name}: {exc}"
