"""Open image and label volumes (HDF5 ``path.h5:dataset`` or zarr) lazily, with checks that name the fix.

Mirrors the ``<volume_path>:<dataset>`` convention of google/ffn ``train.py`` (``--data_volumes``,
``--label_volumes``). Volumes are (z, y, x); slicing reads only the requested box.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn import parse_volume_spec
from hpctrain.errors import DataError

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


def _h5_datasets(f: Any) -> list[str]:
    import h5py

    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def _zarr_arrays(group: Any, prefix: str = "") -> list[str]:
    import zarr

    names: list[str] = []
    for key, member in group.members():
        if isinstance(member, zarr.Array):
            names.append(prefix + key)
        else:
            names.extend(_zarr_arrays(member, prefix + key + "/"))
    return names


def open_volume(spec: VolumeSpec) -> Volume:
    """Open a volume lazily; raise DataError naming the file and the datasets that do exist."""
    path, dataset = parse_volume_spec(spec)
    name = f"{path}:{dataset}" if dataset else str(path)
    if not path.exists():
        raise DataError(f"volume file {path} does not exist", hint="check the data path in the job spec")
    if path.is_dir() or path.suffix == ".zarr":
        return _open_zarr(path, dataset, name)
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(
            f"{path} is not a readable HDF5 file ({e})", hint="give path.h5:dataset or a .zarr"
        ) from e
    if dataset is None:
        names = _h5_datasets(f)
        f.close()
        raise DataError(f"{path}: no dataset named", hint=f"write {path}:NAME with NAME one of {names}")
    if dataset not in f or not isinstance(f[dataset], h5py.Dataset):
        names = _h5_datasets(f)
        f.close()
        raise DataError(f"{path}: no dataset '{dataset}'", hint=f"datasets in the file: {names}")
    return Volume(f[dataset], name, handle=f)


def _open_zarr(path: Path, dataset: str | None, name: str) -> Volume:
    import zarr

    try:
        node = zarr.open(str(path), mode="r")
    except Exception as e:  # zarr raises several unrelated types for a non-store directory
        raise DataError(f"{path} is not a readable zarr store ({e})") from e
    if isinstance(node, zarr.Array):
        if dataset:
            raise DataError(
                f"{path} is a single zarr array; it has no dataset '{dataset}'", hint=f"use {path}"
            )
        return Volume(node, name)
    names = _zarr_arrays(node)
    if dataset is None:
        raise DataError(f"{path}: no dataset named", hint=f"write {path}:NAME with NAME one of {names}")
    if dataset not in names:
        raise DataError(f"{path}: no dataset '{dataset}'", hint=f"datasets in the store: {names}")
    return Volume(node[dataset], name)


def load_volume(spec: VolumeSpec) -> np.ndarray:
    """Read a whole volume into memory (use ``open_volume`` to read boxes lazily)."""
    with open_volume(spec) as vol:
        return vol.read()


def check_image(vol: Volume) -> None:
    """Images are 3-D uint8, or float (both normalised by image_mean / image_stddev in training)."""
    if vol.ndim != 3:
        raise DataError(f"image {vol.name} has shape {vol.shape}; expected a 3-D (z, y, x) volume")
    if vol.dtype != np.uint8 and vol.dtype.kind != "f":
        raise DataError(
            f"image {vol.name} has dtype {vol.dtype}; expected uint8 (or float32)",
            hint="rescale the image to uint8 0..255, or store float32 and set image_mean/image_stddev",
        )


def check_labels(vol: Volume) -> None:
    """Labels are a 3-D integer volume; 0 is background."""
    if vol.ndim != 3:
        raise DataError(f"labels {vol.name} have shape {vol.shape}; expected a 3-D (z, y, x) volume")
    if vol.dtype.kind not in "iub":
        raise DataError(
            f"labels {vol.name} have dtype {vol.dtype}; expected an integer type (uint32/uint64/int64)",
            hint="labels are object ids, 0 = background: convert them with astype(np.uint64)",
        )


def load_image_and_labels(image_spec: VolumeSpec, labels_spec: VolumeSpec) -> tuple[Volume, Volume]:
    """Open an image and its labels lazily and check dtypes and matching shapes."""
    image = open_volume(image_spec)
    labels = open_volume(labels_spec)
    try:
        check_image(image)
        check_labels(labels)
        if image.shape != labels.shape:
            raise DataError(
                f"image {image.name} has shape {image.shape} but labels {labels.name} "
                f"have shape {labels.shape}",
                hint="the image and its labels must cover the same (z, y, x) box",
            )
    except DataError:
        image.close()
        labels.close()
        raise
    return image, labels
