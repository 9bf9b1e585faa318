"""Open image and label volumes (HDF5 ``path.h5:dataset`` or zarr) lazily, with checks that name the fix.

Mirrors the ``<volume_path>:<dataset>`` convention of google/ffn ``train.py`` (``--data_volumes``,
``--label_volumes``). Volumes are (z, y, x); slicing reads only the requested box.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_volumes import check_image, check_labels, check_pair, open_array
from hpctrain.errors import DataError

__all__ = ["Volume", "check_image", "check_labels", "load_image_and_labels", "load_volume", "open_volume"]

VolumeSpec = str | Mapping[str, Any]


class Volume:
    """A lazily read 3-D volume: ``shape``, ``dtype``, ``vol[z0:z1, y0:y1, x0:x1] -> np.ndarray``.

    Keeps its HDF5 file open (close it with ``close()`` or a ``with`` block); zarr needs no handle.
    """

    def __init__(self, array: Any, name: str, handle: Any = None) -> None:
        self._array = array
        self._handle = handle
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._array.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        return np.asarray(self._array[key])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._array[...])
        return data if dtype is None else data.astype(dtype)

    def read(self) -> np.ndarray:
        """Read the whole volume into memory."""
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


def open_volume(spec: VolumeSpec) -> Volume:
    """Open a volume lazily; raise DataError naming the file and the datasets that do exist."""
    opened = open_array(spec)
    return Volume(opened.array, opened.name, handle=opened.handle)


def load_volume(spec: VolumeSpec) -> np.ndarray:
    """Read a whole volume into memory (use ``open_volume`` to read boxes lazily)."""
    with open_volume(spec) as vol:
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
