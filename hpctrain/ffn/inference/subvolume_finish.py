"""Agglomeration and fill of a volume segmented in subvolumes, done once over the reconciled pieces.

A piece that agglomerates and fills on its own sees only its box: two pieces of an object that meet outside it
are never joined, and the fills of two pieces disagree at their border. So the pieces flood only (bounded
floods, ``settings.flood_only``), are reconciled into one over-segmentation, and then, as google/ffn agglomerates after
its subvolumes, the finishing steps run over that one segmentation, split the same way:

1. ``count_contacts`` (one process, O(volume) numpy): each core, read with ``reach`` voxels beyond it, counts
   the voxel pairs of touching objects whose first voxel it holds, so every contact is counted exactly once;
   a pair with ``min_contact`` or more is scored by the piece holding most of its contact (``pairs.json``).
2. ``finish_parts`` (the ranks, one piece at a time): the FFN's mutual claims of the piece's pairs from bare
   seeds inside its box (``agglomeration.mutual_claims``), and the watershed fill of
   the piece's box, of which the core is kept. Neither depends on the join: a watershed from markers gives
   each unsegmented voxel the marker that reaches it first, whatever the markers are called.
3. ``assemble`` (one process): the pairs scoring at least the threshold are joined (transitively) and the
   filled cores are written with the joined ids, numbered 1..N.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_inference import InferenceConfig
from hpctrain.errors import DataError
from hpctrain.ffn.inference.agglomeration import UnionFind, contact_pairs, join_groups, mutual_claims
from hpctrain.ffn.inference.runner import join_and_fill
from hpctrain.ffn.inference.subvolumes import (
    Subvolume,
    check_pieces_fit,
    existing_part_file,
    mine,
    read_plan,
    renumbering,
    write_cores,
)
from hpctrain.files import write_atomic
from hpctrain.memory_budget import MemoryBudget

OVERSEGMENTATION = "oversegmentation.h5"
PAIRS = "pairs.json"
REACH = 3  # voxels across which two objects touch (agglomeration.contact_pairs)


def finished_path(parts_dir: Path, sub: Subvolume) -> Path:
    return Path(parts_dir) / f"finished-{sub.index:05d}.h5"


def _read(path: Path, box: tuple[slice, ...]) -> np.ndarray:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return np.asarray(f["segmentation"][box])
    except (OSError, KeyError) as e:
        raise DataError(f"cannot read {path} ({e})",
                        hint="run the earlier steps of hpctrain ffn segment --subvolumes again") from e


def _write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data))


# ---------------------------------------------------------------------------------------- 1. the contacts


def count_contacts(plan: Sequence[Subvolume], overseg: Path, shape: Sequence[int],
                   reach: int = REACH) -> dict[tuple[int, int], dict[int, int]]:
    """(a, b) -> {piece index: voxel pairs of a and b within ``reach`` whose first voxel is in that core}."""
    out: dict[tuple[int, int], dict[int, int]] = {}
    for sub in plan:
        box = tuple(slice(a, min(b + reach, s)) for a, b, s in zip(sub.core_start, sub.core_stop, shape, strict=True))
        core_shape = [b - a for a, b in zip(sub.core_start, sub.core_stop, strict=True)]
        for pair, count in contact_pairs(_read(overseg, box), reach, 1, counted=core_shape).items():
            out.setdefault(pair, {})[sub.index] = count
    return out


def assign_pairs(plan: Sequence[Subvolume], parts_dir: Path, shape: Sequence[int], min_contact: int) -> int:
    """Write ``pairs.json``: for each piece, the pairs (``min_contact`` contacts or more in all) it scores —
    those it holds most of the contact of (ties: the lower index). Returns the number of pairs."""
    contacts = count_contacts(plan, Path(parts_dir) / OVERSEGMENTATION, shape)
    pieces: dict[str, list[list[int]]] = {str(sub.index): [] for sub in plan}
    chosen = 0
    for pair, by_piece in sorted(contacts.items()):
        if sum(by_piece.values()) >= min_contact:
            owner = min(by_piece, key=lambda i: (-by_piece[i], i))
            pieces[str(owner)].append(list(pair))
            chosen += 1
    _write_json_atomic(Path(parts_dir) / PAIRS, {"pieces": pieces})
    return chosen


# ------------------------------------------------------------------------------------------ 2. the pieces


def finish_piece(model: Any, config: InferenceConfig, image: np.ndarray, seg: np.ndarray,
                 pairs: Sequence[Sequence[int]]) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """One piece: (its box filled, with the ids of ``seg``; the score of each of ``pairs``: its mutual claim, or
    the join model's probability, from what the piece's box holds of the two)."""
    from hpctrain.ffn.inference.canvas import make_canvas
    from hpctrain.ffn.inference.runner import pair_scores

    ids, local = np.unique(seg, return_inverse=True)  # small local ids: object boxes are a list as long as the
    local = local.reshape(seg.shape).astype(np.int64)  # largest id
    if ids[0] != 0:  # no unsegmented voxel: local id 0 would be an object
        ids, local = np.concatenate([[0], ids]), local + 1
    position = {int(g): i for i, g in enumerate(ids)}
    scores: dict[tuple[int, int], float] = {}
    todo = [(position[int(a)], position[int(b)]) for a, b in pairs if int(a) in position and int(b) in position]
    if config.joins.agglomerate_threshold > 0 and todo:
        canvas = make_canvas(model, image, config)
        claims = mutual_claims(local, canvas.predict_bare, canvas.fov, canvas.segment_logit, todo)
        for (a, b), score in pair_scores(image, local, claims, config.joins).items():
            scores[(int(ids[a]), int(ids[b]))] = score
    # the join is applied once over all pieces (``assemble``); here only the fill of the piece's box
    local = join_and_fill(image, local, {}, config.joins.model_copy(update={"agglomerate_threshold": 0.0}),
                          config.fill)
    return ids[local].astype(np.uint32), scores


def finish_parts(plan_path: str | Path, rank: int = 0, size: int = 1, *, threads: int | None = None,
                 model: Any = None, config: Any = None, budget: MemoryBudget | None = None) -> list[str]:
    """Finish this rank's pieces (``finish_piece``): each writes its core and scores to ``finished-*.h5``.
    A piece already finished is skipped, so a stopped job run again does only the rest."""
    from hpctrain.ffn.inference.runner import prepare_inference
    from hpctrain.ffn.segmentation import write_segmentation_hdf5
    from hpctrain.ffn.volume import open_volume

    plan_path = Path(plan_path)
    parts = plan_path.parent
    plan, settings = read_plan(plan_path)
    todo = [s for s in mine(plan, rank, size) if not finished_path(parts, s).exists()]
    if not todo:
        return []
    try:
        assigned = json.loads((parts / PAIRS).read_text())["pieces"]
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{parts / PAIRS} is missing or unreadable ({e})",
                        hint="the pairs are written after reconciling: run hpctrain ffn segment --subvolumes") from e
    if model is None:
        model, config, _ = prepare_inference(settings["checkpoint"], settings.get("config"), threads=threads)
    model.eval()
    volume = open_volume(settings["volume"], budget)
    written = []
    try:
        check_pieces_fit(todo, volume, together=1)
        for sub in todo:
            image = np.asarray(volume[sub.box()])
            seg = _read(parts / OVERSEGMENTATION, sub.box())
            filled, scores = finish_piece(model, config, image, seg, assigned.get(str(sub.index), []))
            core = tuple(slice(a - s, b - s) for a, b, s in zip(sub.core_start, sub.core_stop, sub.start, strict=True))
            attrs = {"subvolume": sub.index,
                     "scores": json.dumps([[a, b, s] for (a, b), s in sorted(scores.items())])}
            written.append(str(write_segmentation_hdf5(finished_path(parts, sub), filled[core], attrs)))
    finally:
        volume.close()
    return written


# ----------------------------------------------------------------------------------------- 3. the output


def assemble(plan: Sequence[Subvolume], parts_dir: Path, out_path: str | Path, shape: Sequence[int],
             threshold: float, attrs: dict[str, Any] | None = None, linkage: str = "single") -> dict[str, Any]:
    """Join the scored pairs as ``agglomeration.join_groups`` says (every pair's score, from whichever piece
    scored it, in one place) and write the finished cores as one segmentation (ids 1..N)."""
    import h5py

    scores: dict[tuple[int, int], float] = {}
    present: set[int] = set()
    for sub in plan:
        path = existing_part_file(finished_path(parts_dir, sub), sub, "finished segmentation", "finish-parts PLAN")
        with h5py.File(path, "r") as f:
            ds = f["segmentation"]
            present.update(np.unique(ds[()]).tolist())
            for a, b, score in json.loads(ds.attrs["scores"]) if "scores" in ds.attrs else []:
                scores[(int(a), int(b))] = float(score)
    union = join_groups(scores, threshold, linkage) if threshold > 0 else UnionFind()
    scored = len(scores)
    joined = sum(union.find(a) == union.find(b) for a, b in scores)
    present.discard(0)
    table, objects = renumbering(union, present)
    file = write_cores(out_path, shape, plan, lambda sub: table[_read(finished_path(parts_dir, sub), ())], attrs)
    return {"out": str(file), "objects": objects, "pieces": len(plan), "scored_pairs": scored,
            "agglomerated_pairs": joined}
