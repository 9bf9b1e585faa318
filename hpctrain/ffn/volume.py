"""Open image and label volumes (HDF5 ``path.h5:dataset`` or zarr) lazily, with checks that name the fix.

Mirrors the ``<volume_path>:<dataset>`` convention of google/ffn ``train.py`` (``--data_volumes``,
``--label_volumes``). Volumes are (z, y, x); slicing reads only the requested box. Every read is checked against
the memory budget (``hpctrain.memory_budget``) from the shape and dtype alone, before a voxel is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_volumes import VolumeSpec, check_pair, open_array
from hpctrain.errors import DataError
from hpctrain.memory_budget import RAISE_HINT, MemoryBudget, array_bytes, memory_budget


class Volume:
    """A lazily read 3-D volume: ``shape``, ``dtype``, ``vol[z0:z1, y0:y1, x0:x1] -> np.ndarray``.

    Keeps its HDF5 file open (close it with ``close()`` or a ``with`` block); zarr needs no handle. A read
    larger than ``budget`` (default: ``memory_budget()``) is refused before it starts.
    """

    def __init__(self, array: Any, name: str, handle: Any = None, budget: MemoryBudget | None = None) -> None:
        self._array = array
        self._handle = handle
        self.name = name
        self.budget = budget if budget is not None else memory_budget()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._array.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def bytes_for(self, shape: tuple[int, ...], work_per_voxel: int = 0) -> int:
        """Bytes of a box of ``shape`` read from this volume, with ``work_per_voxel`` more per voxel for the work
        done on it."""
        return array_bytes(shape, self.dtype.itemsize + work_per_voxel)

    def check_fits(self, doing: str, work_per_voxel: int = 0, shape: tuple[int, ...] | None = None,
                   hint: str = RAISE_HINT) -> None:
        """DataError unless ``doing`` (e.g. "segmenting") a box of ``shape`` (default: all of it), read and
        ``work_per_voxel`` bytes more per voxel, fits the budget."""
        box = self.shape if shape is None else shape
        self.budget.check(self.bytes_for(box, work_per_voxel), f"{doing} {self.name} {box} {self.dtype}", hint)

    def __getitem__(self, key: Any) -> np.ndarray:
        shape = selection_shape(self.shape, key)
        if shape is not None:
            self.check_fits("reading", shape=shape)
        return np.asarray(self._array[key])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self.read()
        return data if dtype is None else data.astype(dtype)

    def read(self) -> np.ndarray:
        """Read the whole volume into memory (refused, before anything is read, when it does not fit the budget)."""
        self.check_fits("reading")
        return np.asarray(self._array[...])

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> Volume:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Volume({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def selection_shape(shape: tuple[int, ...], key: Any) -> tuple[int, ...] | None:
    """The shape ``array[key]`` has, from ``shape`` alone, for keys of ints, slices and one Ellipsis; None for
    any other key (a list or array of indices), whose size is not known before it is read."""
    keys = key if isinstance(key, tuple) else (key,)
    ellipses = sum(k is Ellipsis for k in keys)
    if ellipses > 1:
        return None
    if ellipses:
        at = next(i for i, k in enumerate(keys) if k is Ellipsis)
        keys = (*keys[:at], *(slice(None),) * (len(shape) - len(keys) + 1), *keys[at + 1:])
    if len(keys) > len(shape):
        return None
    out: list[int] = []
    for k, n in zip((*keys, *(slice(None),) * (len(shape) - len(keys))), shape, strict=True):
        if isinstance(k, slice):
            out.append(len(range(*k.indices(n))))
        elif not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            return None
    return tuple(out)


def open_volume(spec: VolumeSpec, budget: MemoryBudget | None = None) -> Volume:
    """Open a volume lazily; raise DataError naming the file and the datasets that do exist. Its reads are
    checked against ``budget`` (default: ``memory_budget()``)."""
    opened = open_array(spec)
    return Volume(opened.array, opened.name, handle=opened.handle, budget=budget)


def load_volume(spec: VolumeSpec, budget: MemoryBudget | None = None) -> np.ndarray:
    """Read a whole volume into memory (use ``open_volume`` to read boxes lazily); refused before anything is
    read when its shape and dtype say it does not fit ``budget``."""
    with open_volume(spec, budget) as vol:
        return vol.read()


def load_image_and_labels(image_spec: VolumeSpec, labels_spec: VolumeSpec) -> tuple[Volume, Volume]:
    """Open an image and its labels lazily and check dtypes and matching shapes."""
    image = open_volume(image_spec)
    labels = open_volume(labels_spec)
    try:
        check_pair(image, labels)
    except DataError:
        image.close()
        labels.close()
        raise
    return image, labels
