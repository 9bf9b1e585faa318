"""Inference over a volume too large for one process: overlapping subvolumes, segmented independently (by
the ranks of one job, or one after the other), then reconciled across their borders into one segmentation.

Each subvolume owns a *core* (the volume cut into a grid of disjoint boxes) and reads ``overlap`` more voxels
on each side. Two subvolumes' segments are joined when they share most of the voxels that either has in the
region both segmented (google/ffn reconciles subvolumes the same way: by the overlap of their objects); the
output takes every voxel from the subvolume whose core holds it. Only one subvolume is in memory at a time.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_fields import Zyx, zyx
from hpctrain.errors import ConfigError, DataError
from hpctrain.ffn.inference.agglomeration import UnionFind
from hpctrain.files import atomic_path, write_atomic
from hpctrain.memory_budget import RAISE_HINT, MemoryBudget

TOGETHER = 4  # pieces a rank floods in lock step (their FOVs batched into one model call)


@dataclass(frozen=True)
class Subvolume:
    """One piece of the plan: ``start``/``stop`` is the box it segments, ``core_*`` the box it writes."""

    index: int
    start: Zyx
    stop: Zyx
    core_start: Zyx
    core_stop: Zyx

    def box(self) -> tuple[slice, slice, slice]:
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop, strict=True))  # type: ignore[return-value]

    @property
    def shape(self) -> Zyx:
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))  # type: ignore[return-value]


def plan_subvolumes(shape: Sequence[int], counts: int | Sequence[int], overlap: int | Sequence[int],
                    min_size: Sequence[int] = (1, 1, 1)) -> list[Subvolume]:
    """Cut ``shape`` into ``counts`` (z, y, x) cores of near-equal size, each read with ``overlap`` more voxels
    per side (clipped at the volume's border). ``min_size`` (the FOV) is the smallest box a piece may read."""
    shape3 = zyx(list(shape), "volume shape")
    n = zyx(counts, "subvolumes")
    halo = zyx(overlap, "overlap")
    if any(c < 1 for c in n) or any(h < 0 for h in halo):
        raise ConfigError(f"subvolume counts {n} must be >= 1 and overlap {halo} >= 0", key="subvolumes")
    if any(c > s for c, s in zip(n, shape3, strict=True)):
        raise ConfigError(f"cannot cut a volume of shape {shape3} into {n} subvolumes", key="subvolumes")
    edges = [np.linspace(0, s, c + 1).round().astype(int) for s, c in zip(shape3, n, strict=True)]
    plan = []
    for index, (iz, iy, ix) in enumerate(itertools.product(*(range(c) for c in n))):
        core_start = (int(edges[0][iz]), int(edges[1][iy]), int(edges[2][ix]))
        core_stop = (int(edges[0][iz + 1]), int(edges[1][iy + 1]), int(edges[2][ix + 1]))
        start = tuple(max(a - h, 0) for a, h in zip(core_start, halo, strict=True))
        stop = tuple(min(b + h, s) for b, h, s in zip(core_stop, halo, shape3, strict=True))
        sub = Subvolume(index, start, stop, core_start, core_stop)  # type: ignore[arg-type]
        if any(s < m for s, m in zip(sub.shape, min_size, strict=True)):
            raise ConfigError(f"subvolume {index} reads {sub.shape} voxels, less than the FOV {tuple(min_size)}",
                              key="subvolumes", hint="use fewer subvolumes or a larger overlap")
        plan.append(sub)
    return plan


# ----------------------------------------------------------------------------------------- the plan file


def write_plan(path: Path, plan: list[Subvolume], **settings: Any) -> Path:
    """The plan and the run's settings as JSON, for the ranks that segment the pieces (written atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"subvolumes": [asdict(s) for s in plan], **settings}, indent=1))
    return path


def read_plan(path: Path) -> tuple[list[Subvolume], dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
        plan = [Subvolume(int(s["index"]), *(tuple(int(v) for v in s[k]) for k in  # type: ignore[arg-type]
                          ("start", "stop", "core_start", "core_stop"))) for s in data.pop("subvolumes")]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is not a subvolume plan written by hpctrain ffn segment ({e})") from e
    return plan, data


def part_path(parts_dir: Path, sub: Subvolume) -> Path:
    return Path(parts_dir) / f"sub-{sub.index:05d}.h5"


def mine(plan: list[Subvolume], rank: int, size: int) -> list[Subvolume]:
    """The pieces rank ``rank`` of ``size`` segments: every ``size``-th, so sizes balance across ranks."""
    return [s for s in plan if s.index % size == rank]


# -------------------------------------------------------------------------------------------- reconcile


def existing_part_file(path: Path, sub: Subvolume, output: str, command: str) -> Path:
    """``path`` of one subvolume's ``output``, or an error naming it and the command that writes it."""
    if not path.exists():
        raise DataError(f"subvolume {sub.index} has no {output}: {path} is missing",
                        hint=f"run hpctrain ffn {command} on every piece of the plan first")
    return path


def _read_part(parts_dir: Path, sub: Subvolume, box: tuple[slice, ...] | None = None) -> np.ndarray:
    import h5py

    path = existing_part_file(part_path(parts_dir, sub), sub, "segmentation", "segment-parts PLAN")
    with h5py.File(path, "r") as f:
        data = f["segmentation"]
        if tuple(data.shape) != sub.shape:
            raise DataError(f"{path} holds shape {tuple(data.shape)}, but subvolume {sub.index} is {sub.shape}")
        return np.asarray(data[box] if box is not None else data[()])


def _shared_box(a: Subvolume, b: Subvolume) -> tuple[Zyx, Zyx] | None:
    lo = tuple(max(x, y) for x, y in zip(a.start, b.start, strict=True))
    hi = tuple(min(x, y) for x, y in zip(a.stop, b.stop, strict=True))
    return None if any(h <= low for low, h in zip(lo, hi, strict=True)) else (lo, hi)  # type: ignore[return-value]


def _local(sub: Subvolume, lo: Zyx, hi: Zyx) -> tuple[slice, ...]:
    return tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, sub.start, strict=True))


def match_segments(a: np.ndarray, b: np.ndarray, *, min_fraction: float = 0.5,
                   min_voxels: int = 50) -> list[tuple[int, int]]:
    """Pairs (segment of ``a``, segment of ``b``) on the same voxels that belong together: they share at least
    ``min_voxels`` voxels and at least ``min_fraction`` of each one's voxels in this region. Requiring both
    sides keeps one subvolume's merge error from joining two objects the other kept apart."""
    keep = (a > 0) & (b > 0)
    if not keep.any():
        return []
    pairs, counts = np.unique(np.stack([a[keep], b[keep]]).astype(np.int64), axis=1, return_counts=True)
    ids_a, size_a = np.unique(a[a > 0], return_counts=True)
    ids_b, size_b = np.unique(b[b > 0], return_counts=True)
    na = dict(zip(ids_a.tolist(), size_a.tolist(), strict=True))
    nb = dict(zip(ids_b.tolist(), size_b.tolist(), strict=True))
    out = []
    for (sa, sb), n in zip(pairs.T.tolist(), counts.tolist(), strict=True):
        if n >= min_voxels and n >= min_fraction * na[sa] and n >= min_fraction * nb[sb]:
            out.append((int(sa), int(sb)))
    return out


def renumbering(union: UnionFind, ids: Iterable[int]) -> tuple[np.ndarray, int]:
    """(a table from each of ``ids`` to its joined object's final id 1..N in the order of the roots, N); ids not
    in ``ids`` map to 0."""
    ids = set(ids)
    roots = sorted({union.find(g) for g in ids})
    final = {r: i + 1 for i, r in enumerate(roots)}
    table = np.zeros(max(ids, default=0) + 1, dtype=np.uint32)
    for g in ids:
        table[g] = final[union.find(g)]
    return table, len(roots)


def write_cores(out_path: str | Path, shape: Sequence[int], plan: Sequence[Subvolume],
                core_labels: Callable[[Subvolume], np.ndarray], attrs: dict[str, Any] | None = None) -> Path:
    """One segmentation of ``shape`` written atomically to ``out_path`` (FILE.h5[:DATASET]) from each piece's
    core labels, one core in memory at a time."""
    import h5py

    from hpctrain.ffn.segmentation import h5_target

    file, name = h5_target(out_path, "segmentation")
    file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(file) as tmp, h5py.File(tmp, "w") as f:
            ds = f.create_dataset(name, shape=tuple(int(s) for s in shape), dtype=np.uint32, chunks=True,
                                  compression="gzip", compression_opts=1)
            for sub in plan:
                ds[tuple(slice(a, b) for a, b in zip(sub.core_start, sub.core_stop, strict=True))] = core_labels(sub)
            for key, value in (attrs or {}).items():
                ds.attrs[key] = json.dumps(value, default=str) if not isinstance(value, (str, int, float)) else value
    except OSError as e:
        raise DataError(f"could not write the segmentation to {file}: {e}") from e
    return file


def reconcile(plan: list[Subvolume], parts_dir: Path, out_path: str | Path, shape: Sequence[int], *,
              min_fraction: float = 0.5, min_voxels: int = 50, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Join the pieces' segments across borders and write one segmentation (uint32 ids 1..N) to ``out_path``.

    Segment ``k`` of piece ``i`` first gets the global id ``offset_i + k``; pairs that ``match_segments`` in
    the region both pieces segmented are joined (transitively), then ids are renumbered 1..N in order.
    """
    offsets, total, written = {}, 0, set()
    for sub in plan:
        offsets[sub.index] = total
        labels = _read_part(parts_dir, sub)
        core = labels[_local(sub, sub.core_start, sub.core_stop)]
        written.update((total + np.unique(core[core > 0]).astype(np.int64)).tolist())
        total += int(labels.max(initial=0))
    union = UnionFind()
    joined = 0
    for a, b in itertools.combinations(plan, 2):
        shared = _shared_box(a, b)
        if shared is None:
            continue
        la = _read_part(parts_dir, a, _local(a, *shared))
        lb = _read_part(parts_dir, b, _local(b, *shared))
        for sa, sb in match_segments(la, lb, min_fraction=min_fraction, min_voxels=min_voxels):
            union.union(offsets[a.index] + sa, offsets[b.index] + sb)
            joined += 1
    # Global ids -> final ids 1..N in order of their root; segments seen only in overlaps never reach the output.
    table, objects = renumbering(union, written)

    def core_ids(sub: Subvolume) -> np.ndarray:
        local = _read_part(parts_dir, sub, _local(sub, sub.core_start, sub.core_stop)).astype(np.int64)
        return np.where(local > 0, local + offsets[sub.index], 0)

    file = write_cores(out_path, shape, plan, lambda sub: table[core_ids(sub)], attrs)
    return {"out": str(file), "objects": objects, "pieces": len(plan), "joined_pairs": joined}


# ------------------------------------------------------------------------------------------- the pieces


def check_pieces_fit(plan: Sequence[Subvolume], volume: Any, together: int = TOGETHER) -> None:
    """DataError unless the ``together`` largest pieces of ``plan``, read from ``volume`` (a ``Volume``) and
    flooded at once, fit its budget: said before any piece is read."""
    from hpctrain.ffn.inference.runner import FLOOD_BYTES_PER_VOXEL

    largest = sorted((math.prod(sub.shape) for sub in plan), reverse=True)[:max(1, together)]
    need = sum(volume.bytes_for((voxels,), FLOOD_BYTES_PER_VOXEL) for voxels in largest)
    biggest = max(plan, key=lambda sub: math.prod(sub.shape)).shape
    volume.budget.check(need, f"flooding {len(largest)} pieces of up to {biggest} of {volume.name} {volume.dtype} "
                              "at once", hint=f"cut it into more --subvolumes, or {RAISE_HINT}")


def segment_parts(plan_path: str | Path, rank: int = 0, size: int = 1, *, threads: int | None = None,
                  model: Any = None, config: Any = None, together: int = TOGETHER,
                  budget: MemoryBudget | None = None) -> list[str]:
    """Segment this rank's pieces of the plan, each read from the volume on its own; returns the files written.

    The pieces flood only: agglomeration and fill run once after reconciling
    (``subvolume_finish.py``). ``together`` pieces at a time are flooded in lock step, their FOVs batched into
    one model call (the same segmentation as one at a time, fewer and larger model calls). The plan's
    checkpoint and settings are used unless ``model`` and ``config`` (an InferenceConfig) are given. A piece
    whose file already exists is skipped, so a job that was stopped and run again only does the rest.
    """
    from hpctrain.ffn.inference.runner import prepare_inference, segment_volumes_together
    from hpctrain.ffn.inference.settings import flood_only
    from hpctrain.ffn.segmentation import write_segmentation_hdf5
    from hpctrain.ffn.volume import open_volume

    plan_path = Path(plan_path)
    plan, settings = read_plan(plan_path)
    todo = [s for s in mine(plan, rank, size) if not part_path(plan_path.parent, s).exists()]
    if not todo:
        return []
    if model is None:
        model, config, _ = prepare_inference(settings["checkpoint"], settings.get("config"), threads=threads)
    config = flood_only(config)  # agglomeration and fill run after reconciling (subvolume_finish.py)
    volume = open_volume(settings["volume"], budget)
    written = []
    try:
        check_pieces_fit(todo, volume, together)
        for first in range(0, len(todo), max(1, together)):
            group = todo[first:first + max(1, together)]
            images = [np.asarray(volume[sub.box()]) for sub in group]
            for sub, labels in zip(group, segment_volumes_together(model, images, config), strict=True):
                attrs = {"subvolume": sub.index, "start": list(sub.start), "stop": list(sub.stop)}
                written.append(str(write_segmentation_hdf5(part_path(plan_path.parent, sub), labels, attrs)))
    finally:
        volume.close()
    return written
