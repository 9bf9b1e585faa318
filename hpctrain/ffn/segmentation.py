"""Segmentations as label volumes: the clean-up of a flood's objects (google/ffn ``segmentation.py``:
``clear_dust``, ``split_cc``, ``make_labels_contiguous``) and writing a segmentation with what made it (HDF5 attrs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_volumes import parse_volume_spec
from hpctrain.errors import DataError
from hpctrain.files import atomic_path


def clear_dust(labels: np.ndarray, min_size: int) -> np.ndarray:
    """``labels`` with objects smaller than ``min_size`` voxels set to 0 (google/ffn ``clear_dust``); the input is
    left as it is (returned itself where nothing is that small)."""
    if min_size <= 1:
        return labels
    ids, counts = np.unique(labels, return_counts=True)
    small = ids[(counts < min_size) & (ids != 0)]
    if small.size == 0:
        return labels
    return np.where(np.isin(labels, small), 0, labels).astype(labels.dtype, copy=False)


def split_disconnected(seg: np.ndarray, min_size: int = 1) -> np.ndarray:
    """Every object's 6-connected components as objects of their own (ids 1..N, in order of the objects' ids),
    components under ``min_size`` voxels set to 0 (google/ffn ``segmentation.clean_up`` with ``split_cc`` and
    ``min_size``). 0 stays 0."""
    from scipy import ndimage

    out = np.zeros(seg.shape, dtype=np.int64)
    next_id = 0
    ids = np.unique(seg[seg > 0])
    if not len(ids):
        return out.astype(np.uint32)
    dense = np.searchsorted(ids, seg) + 1
    dense[seg <= 0] = 0
    for index, box in enumerate(ndimage.find_objects(dense)):
        if box is None:
            continue
        components, count = ndimage.label(dense[box] == index + 1)  # 6-connected (the default structure)
        sizes = np.bincount(components.ravel(), minlength=count + 1)
        keep = np.flatnonzero(sizes[1:] >= min_size) + 1
        table = np.zeros(count + 1, dtype=np.int64)
        table[keep] = np.arange(next_id + 1, next_id + 1 + len(keep))
        next_id += len(keep)
        view = out[box]
        inside = components > 0
        view[inside] = table[components[inside]]
    return out.astype(np.uint32 if next_id < 2**32 else np.uint64)


def make_labels_contiguous(seg: np.ndarray) -> np.ndarray:
    """Renumber ids to 1..N in order of first id, keeping 0 as 0 (``segmentation.make_labels_contiguous``)."""
    ids, inverse = np.unique(seg, return_inverse=True)
    new = np.arange(len(ids), dtype=np.int64)
    if len(ids) and ids[0] != 0:
        new += 1  # no background present: ids start at 1
    out = new[inverse].reshape(seg.shape)
    return out.astype(np.uint32 if out.max(initial=0) < 2**32 else np.uint64)


def h5_target(path: str | Path, default_dataset: str = "segmentation") -> tuple[Path, str]:
    """(file, dataset) of ``FILE.h5[:DATASET]``, ``default_dataset`` where none is named."""
    file, dataset = parse_volume_spec(str(path))
    return file, dataset or default_dataset


def _attr_value(value: Any) -> Any:
    if isinstance(value, str | int | float | bool | np.integer | np.floating):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, int | float) for v in value):
        return np.asarray(value)
    return json.dumps(value, default=str)


def write_segmentation_hdf5(
    path: str | Path, seg: np.ndarray, attrs: Mapping[str, Any] | None = None, dataset: str = "segmentation"
) -> Path:
    """Write ``seg`` to ``path`` (``file.h5`` or ``file.h5:dataset``) atomically, gzip-chunked, with attrs.

    Attribute values that HDF5 cannot hold directly (mappings, mixed lists) are stored as JSON text.
    """
    import h5py

    file, name = h5_target(path, dataset)
    file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(file) as tmp, h5py.File(tmp, "w") as f:
            ds = f.create_dataset(name, data=seg, chunks=True, compression="gzip", compression_opts=1)
            for key, value in (attrs or {}).items():
                ds.attrs[key] = _attr_value(value)
    except OSError as e:
        raise DataError(f"could not write segmentation to {file}: {e}", hint="check the output path") from e
    return file
