"""Training volumes read from the shared file system once per node, not once per rank.

The node's local rank 0 copies image and labels into node-local storage (``$HPCTRAIN_NODE_LOCAL`` when the job
stages there, else the RAM-backed ``/dev/shm``) as raw .npy files; after a barrier every rank of the node maps
them read-only (one copy in memory per node, shared by its ranks), and after a second barrier the files are
unlinked (the mappings stay valid), so nothing is left behind. Volumes already on node-local storage, or too
large for it, are opened by each rank as before. docs/scaling.md, "Input".
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_volumes import VolumeSpec, parse_volume_spec
from hpctrain.config.staging import node_local_root
from hpctrain.errors import DataError
from hpctrain.ffn.volume import Volume, load_image_and_labels
from hpctrain.files import atomic_path, write_atomic
from hpctrain.runtime.counting import work_counts

log = logging.getLogger("hpctrain.ffn")

SLAB_BYTES = 64 * 2**20  # copied slab by slab along z: local rank 0 never holds a large volume whole
FREE_FRACTION = 0.5  # copy only what leaves at least half of the node-local space free
PLAN = "plan.json"


def _path_of(spec: VolumeSpec) -> Path:
    return Path(parse_volume_spec(spec)[0]).resolve()


def copy_key(run_dir: Path, image_spec: VolumeSpec, labels_spec: VolumeSpec) -> str:
    """Names this run's copy: the run directory, both specs and the sources' sizes and times."""
    parts = [str(run_dir.resolve()), json.dumps(image_spec, sort_keys=True), json.dumps(labels_spec, sort_keys=True)]
    for spec in (image_spec, labels_spec):
        stat = _path_of(spec).stat()
        parts += [str(stat.st_size), str(stat.st_mtime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _copy(volume: Volume | np.ndarray, final: Path) -> int:
    """``volume`` into ``final`` (.npy) slab by slab; returns its bytes (read from the shared path when a Volume)."""
    with atomic_path(final, durable=False) as tmp:  # node-local and rebuilt by any later run: no fsync
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=volume.dtype, shape=volume.shape)
        plane = max(1, int(np.prod(volume.shape[1:])) * volume.dtype.itemsize)
        step = max(1, SLAB_BYTES // plane)
        for z in range(0, volume.shape[0], step):
            out[z:z + step] = volume[z:z + step]
        out.flush()
        del out
    return int(np.prod(volume.shape)) * volume.dtype.itemsize


def _direct(image_spec: VolumeSpec, labels_spec: VolumeSpec, in_memory_bytes: int,
            held: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
    """Each rank opens the volumes itself: small ones read whole, large ones left lazy (read box by box)."""
    image, labels = load_image_and_labels(image_spec, labels_spec)
    nbytes = int(np.prod(labels.shape)) * (image.dtype.itemsize + labels.dtype.itemsize)
    if nbytes > in_memory_bytes:
        return image, labels
    if "image" in held and "labels" in held:  # already read whole by this process (rank 0's preparation)
        image.close()
        labels.close()
        return held["image"], held["labels"]
    # A small volume is read once: every example would otherwise decompress its HDF5 chunks again.
    arrays = image.read(), labels.read()
    image.close()
    labels.close()
    counts = work_counts.active()
    if counts is not None:
        counts.add_input("volume", nbytes)
    return arrays


def _write_copy(directory: Path, image_spec: VolumeSpec, labels_spec: VolumeSpec,
                held: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Local rank 0: the copy and its plan (``mapped``), or a plan that says why not (``direct``). A volume in
    ``held`` (read whole by this process already) is copied from memory, not read again."""
    shutil.rmtree(directory, ignore_errors=True)  # a copy a crashed run left under the same name
    directory.mkdir(parents=True)
    image, labels = load_image_and_labels(image_spec, labels_spec)
    try:
        nbytes = int(np.prod(labels.shape)) * (image.dtype.itemsize + labels.dtype.itemsize)
        free = shutil.disk_usage(directory).free
        if nbytes > FREE_FRACTION * free:
            plan = {"mode": "direct", "why": f"{nbytes} bytes of volume, {free} bytes free in {directory.parent}"}
        else:
            read = 0
            for name, volume in (("image", image), ("labels", labels)):
                if name in held:
                    _copy(held[name], directory / f"{name}.npy")
                else:
                    read += _copy(volume, directory / f"{name}.npy")
            counts = work_counts.active()
            if counts is not None and read:
                counts.add_input("volume", read)
            plan = {"mode": "mapped", "bytes": nbytes}
    finally:
        image.close()
        labels.close()
    # written last: its presence means the copy is whole
    write_atomic(directory / PLAN, json.dumps(plan), durable=False)
    return plan


def node_volumes(image_spec: VolumeSpec, labels_spec: VolumeSpec, *, local_rank: int, run_dir: Path,
                 barrier: Callable[[], None], in_memory_bytes: int,
                 environ: Mapping[str, str] | None = None,
                 held: Mapping[str, np.ndarray] | None = None) -> tuple[Any, Any]:
    """(image, labels) for this rank, read from the shared path once per node; collective (two barriers).

    Arrays are mapped read-only from the node's copy; the values are those of the source volumes. Where no
    node-local storage is usable, or the volumes already lie on it, every rank opens them (``_direct``).
    ``held``: volumes this process already read whole from the shared path (``image``, ``labels``), used instead
    of reading them again.
    """
    held = held or {}
    root = node_local_root(environ)
    sources = (_path_of(image_spec), _path_of(labels_spec))
    if root is None or all(p.is_relative_to(root.resolve()) for p in sources):
        barrier()  # every rank takes the same two collectives whichever way its node goes
        barrier()
        return _direct(image_spec, labels_spec, in_memory_bytes, held)
    directory = root / f"hpctrain-volume-{copy_key(run_dir, image_spec, labels_spec)}"
    error: Exception | None = None
    if local_rank == 0:
        try:
            _write_copy(directory, image_spec, labels_spec, held)
        except Exception as exc:  # the barrier first, so the others do not wait for a collective that never comes
            error = exc
    barrier()
    if error is not None:
        raise error
    try:
        plan = json.loads((directory / PLAN).read_text())
    except OSError as exc:
        raise DataError(f"the node-local copy of the training volume in {directory} is missing ({exc})",
                        hint="this node's local rank 0 failed to write it: see its error above") from exc
    if plan["mode"] == "mapped":
        arrays: tuple[Any, Any] = (np.load(directory / "image.npy", mmap_mode="r"),
                                   np.load(directory / "labels.npy", mmap_mode="r"))
    barrier()  # every rank of the node has mapped the copy (or chosen the direct path)
    if local_rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
        if plan["mode"] != "mapped":
            log.warning("training volume not copied to node-local storage (%s): every rank reads it", plan["why"])
    if plan["mode"] != "mapped":
        return _direct(image_spec, labels_spec, in_memory_bytes, held)
    return arrays
