"""The FFN's image and label files: how a volume spec is opened and what its arrays must be, in one place.

``hpctrain.ffn.volume`` reads training data on the ranks through these functions; the preflight opens the same
files with them on the laptop (headers only: names, shapes and dtypes, no voxels) wherever the files are
visible, so that a wrong dataset name, a file that is not HDF5 or an image and labels of different shapes fail
before the job waits in a queue. h5py, zarr and numpy are imported when a file is opened, never at import.
An HDF5 volume must be a regular file and a zarr store a directory (a FIFO would block the open, a device read
forever): checked with ``stat`` before h5py or zarr sees the path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpctrain.config.common import Strict
from hpctrain.errors import ConfigError, DataError
from hpctrain.files import kind_of


class VolumeRef(Strict):
    path: str
    dataset: str | None = None


VolumeSpec = str | Mapping[str, Any] | VolumeRef


def parse_volume_spec(spec: VolumeSpec) -> tuple[Path, str | None]:
    """``"path.h5:dataset"`` or ``{path: ..., dataset: ...}`` -> (path, dataset or None)."""
    if isinstance(spec, VolumeRef):
        return Path(spec.path), spec.dataset
    if isinstance(spec, Mapping):
        if "path" not in spec:
            raise DataError(f"volume spec {dict(spec)!r} has no 'path'", hint="write {path: FILE, dataset: NAME}")
        dataset = spec.get("dataset")
        return Path(str(spec["path"])), None if dataset is None else str(dataset)
    text = str(spec)
    # Split on the last ':' after the file suffix so that Windows-like or odd paths keep working.
    for suffix in (".h5:", ".hdf5:", ".hdf:", ".zarr:"):
        at = text.rfind(suffix)
        if at >= 0:
            return Path(text[: at + len(suffix) - 1]), text[at + len(suffix):] or None
    return Path(text), None

ZARR_SUFFIX = ".zarr"
# The files of a zarr store (v3, then v2) that zarr reads when it opens a group or an array.
ZARR_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
SHOWN_PATH = 200  # characters of a path an error repeats


class ArrayInfo(Protocol):
    """What the checks read of an opened volume: its name in messages, shape and dtype (a numpy dtype)."""

    name: str

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...


@dataclass
class OpenedArray:
    """An array of an opened volume file: ``array`` is read lazily; ``handle`` (an HDF5 file) must be closed."""

    array: Any
    name: str
    handle: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.array.shape)

    @property
    def dtype(self) -> Any:
        import numpy as np

        return np.dtype(self.array.dtype)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def is_zarr(path: Path) -> bool:
    """A zarr store (a directory, or a name ending in .zarr) rather than an HDF5 file."""
    return path.is_dir() or path.suffix == ZARR_SUFFIX


def reader_module(spec: VolumeSpec) -> str:
    """The Python package that opens ``spec``'s file: h5py, or zarr for a store."""
    path, _ = parse_volume_spec(spec)
    return "zarr" if is_zarr(path) else "h5py"


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


def _shown(path: Path) -> str:
    """A path as an error repeats it: whole, or its first SHOWN_PATH characters (one refused for its length)."""
    text = str(path)
    return text if len(text) <= SHOWN_PATH else f"{text[:SHOWN_PATH]}… ({len(text)} characters)"


def _stat(path: Path) -> os.stat_result:
    """``stat`` of a volume's path; DataError when it is missing or the OS refuses it (a name too long)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise DataError(f"volume file {_shown(path)} does not exist",
                        hint="check the data path in the job spec") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DataError(f"volume file {_shown(path)} cannot be opened: {reason}") from None


def _check_store_files(path: Path) -> None:
    """A zarr store's metadata files, where present, are regular files (zarr opens them blocking)."""
    for meta in ZARR_METADATA:
        try:
            mode = os.stat(path / meta).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise DataError(f"{path / meta} is {kind_of(mode)}, not a regular file: not a zarr store")


def open_array(spec: VolumeSpec) -> OpenedArray:
    """Open a volume's array lazily; raise DataError naming the file and the datasets that do exist."""
    path, dataset = parse_volume_spec(spec)
    name = f"{path}:{dataset}" if dataset else str(path)
    mode = _stat(path).st_mode
    if stat.S_ISDIR(mode) or path.suffix == ZARR_SUFFIX:
        if stat.S_ISDIR(mode):
            _check_store_files(path)
            if dataset:
                _check_store_files(path / dataset)
        elif not stat.S_ISREG(mode):
            raise DataError(f"{path} is {kind_of(mode)}, not a zarr store (a directory)")
        return _open_zarr(path, dataset, name)
    if not stat.S_ISREG(mode):
        raise DataError(f"volume file {path} is {kind_of(mode)}, not a regular file",
                        hint="give FILE.h5:DATASET of an HDF5 file, or a .zarr store")
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
    return OpenedArray(f[dataset], name, handle=f)


def _open_zarr(path: Path, dataset: str | None, name: str) -> OpenedArray:
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
        return OpenedArray(node, name)
    names = _zarr_arrays(node)
    if dataset is None:
        raise DataError(f"{path}: no dataset named", hint=f"write {path}:NAME with NAME one of {names}")
    if dataset not in names:
        raise DataError(f"{path}: no dataset '{dataset}'", hint=f"datasets in the store: {names}")
    return OpenedArray(node[dataset], name)


def check_image(vol: ArrayInfo) -> None:
    """Images are 3-D uint8, or float (both normalised by image_mean / image_stddev in training)."""
    if len(vol.shape) != 3:
        raise DataError(f"image {vol.name} has shape {vol.shape}; expected a 3-D (z, y, x) volume")
    dtype = vol.dtype
    if not (dtype.kind == "u" and dtype.itemsize == 1) and dtype.kind != "f":
        raise DataError(
            f"image {vol.name} has dtype {dtype}; expected uint8 (or float32)",
            hint="rescale the image to uint8 0..255, or store float32 and set image_mean/image_stddev",
        )


def check_labels(vol: ArrayInfo) -> None:
    """Labels are a 3-D integer volume; 0 is background."""
    if len(vol.shape) != 3:
        raise DataError(f"labels {vol.name} have shape {vol.shape}; expected a 3-D (z, y, x) volume")
    if vol.dtype.kind not in "iub":
        raise DataError(
            f"labels {vol.name} have dtype {vol.dtype}; expected an integer type (uint32/uint64/int64)",
            hint="labels are object ids, 0 = background: convert them with astype(np.uint64)",
        )


def check_pair(image: ArrayInfo, labels: ArrayInfo) -> None:
    """An image and its labels: each as above, and the same (z, y, x) box."""
    check_image(image)
    check_labels(labels)
    if image.shape != labels.shape:
        raise DataError(
            f"image {image.name} has shape {image.shape} but labels {labels.name} have shape {labels.shape}",
            hint="the image and its labels must cover the same (z, y, x) box",
        )


def source_shape(key: str, image_spec: VolumeSpec, labels_spec: VolumeSpec) -> tuple[int, int, int]:
    """Open a volume source's image and labels (headers only), check them as the ranks do and return their
    shape; a problem is a ConfigError naming ``key.image`` or ``key.labels`` (``data.train.labels``)."""
    opened: list[OpenedArray] = []
    try:
        for role, spec in (("image", image_spec), ("labels", labels_spec)):
            with _keyed(f"{key}.{role}"):
                opened.append(open_array(spec))
        image, labels = opened
        with _keyed(f"{key}.image"):
            check_image(image)
        with _keyed(f"{key}.labels"):
            check_pair(image, labels)
        z, y, x = image.shape
        return (z, y, x)
    finally:
        for array in opened:
            array.close()


@contextmanager
def _keyed(key: str) -> Iterator[None]:
    try:
        yield
    except DataError as exc:
        raise ConfigError(exc.message, key=key, hint=exc.hint) from None
