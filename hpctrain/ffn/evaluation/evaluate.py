"""Segmentation quality against ground truth: VOI split/merge, adapted Rand error, per-object tables.

Conventions (also in docs/ffn_inference.md): voxels whose ground truth is ``ignore_label`` are left out of
everything; segment id 0 (unsegmented) counts as one more segment, and its share is reported separately.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.errors import DataError
from hpctrain.memory_budget import RAISE_HINT, MemoryBudget

# Bytes per voxel ``evaluate_segmentation`` holds besides its two inputs: int64 copies of both, the compacted ids and
# the contingency keys (the peak of its numpy allocations, measured with tracemalloc on 64^3 to 128^3: 80.4).
EVALUATE_BYTES_PER_VOXEL = 81


def _contingency(seg: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique (gt id, seg id) pairs and their voxel counts, as three aligned 1-D arrays."""
    gt_ids, gt_inv = np.unique(gt, return_inverse=True)
    seg_ids, seg_inv = np.unique(seg, return_inverse=True)
    key = gt_inv.ravel().astype(np.int64) * len(seg_ids) + seg_inv.ravel()
    pairs, counts = np.unique(key, return_counts=True)
    return gt_ids[pairs // len(seg_ids)], seg_ids[pairs % len(seg_ids)], counts


def _rand_pairs(gt_of: np.ndarray, seg_of: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """Adapted Rand precision and recall from the contingency counts (ordered voxel pairs).

    precision = pairs together in both / pairs together in the segmentation (falls with merges);
    recall = pairs together in both / pairs together in the ground truth (falls with splits). Computed
    here because ``skimage.metrics.adapted_rand_error`` returns the two swapped against its own docstring
    (scikit-image issue #6485).
    """
    nf = n.astype(np.float64)
    both = float(np.sum(nf * (nf - 1)))
    _, gt_inv = np.unique(gt_of, return_inverse=True)
    _, seg_inv = np.unique(seg_of, return_inverse=True)
    a = np.bincount(gt_inv, weights=nf)
    b = np.bincount(seg_inv, weights=nf)
    pairs_gt = float(np.sum(a * (a - 1)))
    pairs_seg = float(np.sum(b * (b - 1)))
    precision = both / pairs_seg if pairs_seg else 1.0
    recall = both / pairs_gt if pairs_gt else 1.0
    return precision, recall


def evaluate_segmentation(
    seg: np.ndarray, labels: np.ndarray, ignore_label: int | None = 0, min_overlap: int = 1
) -> dict[str, Any]:
    """Compare a segmentation with ground-truth ``labels`` (same shape).

    * ``voi_split`` = H(seg | gt) in bits: grows when a ground-truth object is cut into several segments;
      ``voi_merge`` = H(gt | seg): grows when one segment covers several objects. ``voi`` is their sum.
      (``skimage.metrics.variation_of_information(gt, seg)`` returns exactly [H(seg|gt), H(gt|seg)].)
    * ``adapted_rand_error`` (SNEMI3D, skimage, alpha 0.5) with ``rand_precision`` / ``rand_recall``.
    * ``objects``: per ground-truth object its size, the nonzero segment covering most of it
      (``best_segment``, 0 if none), ``overlap`` = that share of the object, and ``n_segments`` = nonzero
      segments holding >= ``min_overlap`` of its voxels. ``segments``: per nonzero segment its size (on
      evaluated voxels) and ``n_gt`` = ground-truth objects it holds >= ``min_overlap`` voxels of.
    """
    seg = np.asarray(seg)
    labels = np.asarray(labels)
    if seg.shape != labels.shape:
        raise DataError(
            f"segmentation has shape {seg.shape} but ground truth has {labels.shape}",
            hint="both must cover the same (z, y, x) box",
        )
    if seg.dtype.kind not in "iub" or labels.dtype.kind not in "iub":
        raise DataError(f"segmentation ({seg.dtype}) and labels ({labels.dtype}) must be integer ids")
    keep = np.ones(labels.shape, bool) if ignore_label is None else labels != ignore_label
    n_eval = int(keep.sum())
    if n_eval == 0:
        raise DataError(f"ground truth has no voxel other than the ignored label {ignore_label}")
    # Ids as int64 so that negative or uint64 inputs index alike.
    gt_v = labels[keep].astype(np.int64)
    seg_v = seg[keep].astype(np.int64)

    split, merge, are = _voi_and_rand_error(seg, labels, ignore_label)

    gt_of, seg_of, n = _contingency(seg_v, gt_v)
    precision, recall = _rand_pairs(gt_of, seg_of, n)

    objects, segments = _object_tables(seg_v, gt_v, (gt_of, seg_of, n), min_overlap)

    return {
        "voi_split": float(split),
        "voi_merge": float(merge),
        "voi": float(split + merge),
        "adapted_rand_error": float(are),
        "rand_precision": float(precision),
        "rand_recall": float(recall),
        "n_gt_objects": len(objects),
        "n_segments": len(segments),
        "split_objects": sum(1 for o in objects if o["n_segments"] > 1),
        "merging_segments": sum(1 for s in segments if s["n_gt"] > 1),
        "unsegmented_fraction": float(np.mean(seg_v == 0)),
        "evaluated_voxels": n_eval,
        "ignore_label": ignore_label,
        "objects": objects,
        "segments": segments,
    }


def _voi_and_rand_error(seg: np.ndarray, labels: np.ndarray, ignore_label: int | None) -> tuple[float, float, float]:
    """(VOI split, VOI merge, adapted Rand error) as skimage computes them, ``ignore_label`` left out."""
    from skimage.metrics import adapted_rand_error, variation_of_information

    ignore = () if ignore_label is None else (int(ignore_label),)
    # skimage's contingency table is indexed by the label values: pass compacted ids.
    gt_c = np.unique(labels, return_inverse=True)[1].reshape(labels.shape)
    seg_c = np.unique(seg, return_inverse=True)[1].reshape(seg.shape)
    ignore_c = ()
    if ignore:
        hit = np.flatnonzero(np.unique(labels) == ignore[0])
        ignore_c = (int(hit[0]),) if len(hit) else ()
    split, merge = variation_of_information(gt_c, seg_c, ignore_labels=ignore_c)
    are = adapted_rand_error(gt_c, seg_c, ignore_labels=ignore_c)[0]
    return split, merge, are


def _object_tables(seg_v: np.ndarray, gt_v: np.ndarray, table: tuple[np.ndarray, np.ndarray, np.ndarray],
                   min_overlap: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The per-object and per-segment rows of ``evaluate_segmentation``, largest first, from the evaluated voxels'
    ids and their contingency ``table`` (``_contingency``)."""
    gt_of, seg_of, n = table
    objects = []
    gt_ids, gt_sizes = np.unique(gt_v, return_counts=True)
    for gid, size in zip(gt_ids, gt_sizes, strict=True):
        rows = (gt_of == gid) & (seg_of != 0)
        segs, cnts = seg_of[rows], n[rows]
        best = int(segs[np.argmax(cnts)]) if len(segs) else 0
        best_n = int(cnts.max()) if len(cnts) else 0
        objects.append(
            {
                "gt_id": int(gid),
                "size": int(size),
                "best_segment": best,
                "overlap": best_n / int(size),
                "n_segments": int(np.sum(cnts >= min_overlap)),
            }
        )
    segments = []
    seg_ids, seg_sizes = np.unique(seg_v, return_counts=True)
    for sid, size in zip(seg_ids, seg_sizes, strict=True):
        if sid == 0:
            continue
        cnts = n[seg_of == sid]
        segments.append({"segment_id": int(sid), "size": int(size), "n_gt": int(np.sum(cnts >= min_overlap))})
    objects.sort(key=lambda o: (-o["size"], o["gt_id"]))
    segments.sort(key=lambda s: (-s["size"], s["segment_id"]))
    return objects, segments


def format_report(metrics: dict[str, Any], max_rows: int = 20) -> str:
    """A readable text report of ``evaluate_segmentation``'s result (largest objects first)."""
    m = metrics
    lines = [
        f"VOI split  H(seg|gt)  {m['voi_split']:.4f} bits   (over-segmentation)",
        f"VOI merge  H(gt|seg)  {m['voi_merge']:.4f} bits   (under-segmentation)",
        f"VOI total             {m['voi']:.4f} bits",
        f"adapted Rand error    {m['adapted_rand_error']:.4f}"
        f"   precision {m['rand_precision']:.4f}   recall {m['rand_recall']:.4f}",
        f"ground-truth objects  {m['n_gt_objects']}   split into >1 segment: {m['split_objects']}",
        f"segments              {m['n_segments']}   merging >1 object: {m['merging_segments']}",
        f"unsegmented fraction  {m['unsegmented_fraction']:.4f} of {m['evaluated_voxels']} evaluated voxels",
        "",
        f"{'gt id':>8} {'size':>9} {'best seg':>9} {'overlap':>8} {'#segs':>6}",
    ]
    for o in m["objects"][:max_rows]:
        lines.append(
            f"{o['gt_id']:>8} {o['size']:>9} {o['best_segment']:>9} {o['overlap']:>8.3f} {o['n_segments']:>6}"
        )
    if len(m["objects"]) > max_rows:
        lines.append(f"{'':>8} ... {len(m['objects']) - max_rows} more objects")
    merging = [s for s in m["segments"] if s["n_gt"] > 1]
    if merging:
        lines += ["", f"{'seg id':>8} {'size':>9} {'#gt':>6}   (segments merging objects)"]
        for s in merging[:max_rows]:
            lines.append(f"{s['segment_id']:>8} {s['size']:>9} {s['n_gt']:>6}")
    return "\n".join(lines)


def run_evaluate(seg_spec: Any, labels_spec: Any, ignore_label: int | None = 0,
                 budget: MemoryBudget | None = None) -> dict[str, Any]:
    """`hpctrain evaluate`: read both volumes (``path.h5:dataset``) and evaluate; returns the metrics. Their
    dtypes and shapes are checked, and what the evaluation holds against ``budget`` (default:
    ``memory_budget()``), from the headers before a voxel is read."""
    from hpctrain.ffn.volume import open_volume

    with open_volume(seg_spec, budget) as seg_volume, open_volume(labels_spec, budget) as labels_volume:
        for role, volume in (("segmentation", seg_volume), ("labels", labels_volume)):
            if volume.dtype.kind not in "iub":
                raise DataError(f"{role} {volume.name} has dtype {volume.dtype}; expected integer ids",
                                hint="labels are object ids, 0 = background (uint32/uint64/int64)")
        if seg_volume.shape != labels_volume.shape:
            raise DataError(
                f"segmentation {seg_spec} has shape {seg_volume.shape} but labels {labels_spec} have "
                f"{labels_volume.shape}",
                hint="evaluate a segmentation of the same volume the labels describe",
            )
        shape = seg_volume.shape
        need = seg_volume.bytes_for(shape) + labels_volume.bytes_for(shape, EVALUATE_BYTES_PER_VOXEL)
        seg_volume.budget.check(need, f"evaluating {seg_volume.name} against {labels_volume.name} {shape}",
                                hint=f"evaluate a crop of both, or {RAISE_HINT}")
        seg, labels = seg_volume.read(), labels_volume.read()
    metrics = evaluate_segmentation(seg, labels, ignore_label=ignore_label)
    metrics["segmentation"] = str(seg_spec)
    metrics["labels"] = str(labels_spec)
    return metrics
