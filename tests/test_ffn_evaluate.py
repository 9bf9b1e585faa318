"""Segmentation metrics on hand-made label arrays (expected values computed by hand) and the baseline."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpctrain.errors import DataError
from hpctrain.ffn.evaluation.baseline import baseline_segmentation, interior_threshold
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation, format_report, run_evaluate


def two_objects() -> np.ndarray:
    """GT: object 1 and object 2 of 8 voxels each, separated by 4 background (ignored) voxels."""
    gt = np.zeros((1, 1, 20), np.uint32)
    gt[0, 0, :8] = 1
    gt[0, 0, 12:] = 2
    return gt


def test_identical_segmentation_scores_zero() -> None:
    gt = two_objects()
    m = evaluate_segmentation(gt.copy(), gt)
    assert m["voi_split"] == 0.0 and m["voi_merge"] == 0.0 and m["adapted_rand_error"] == pytest.approx(0.0)
    assert m["rand_precision"] == 1.0 and m["rand_recall"] == 1.0
    assert m["split_objects"] == 0 and m["merging_segments"] == 0 and m["evaluated_voxels"] == 16


def test_split_of_one_object_in_halves() -> None:
    gt = two_objects()
    seg = gt.astype(np.int64) * 10
    seg[0, 0, 4:8] = 11  # object 1 cut in two halves of 4
    seg[0, 0, 8:12] = 99  # a segment on ignored voxels only: invisible to the metrics
    m = evaluate_segmentation(seg, gt)
    # H(seg|gt) = p(obj 1) * 1 bit + p(obj 2) * 0 = 0.5; H(gt|seg) = 0 (every segment inside one object).
    assert m["voi_split"] == pytest.approx(0.5)
    assert m["voi_merge"] == pytest.approx(0.0, abs=1e-12)
    # Ordered pairs: together in both 2·4·3 + 8·7 = 80; in gt 2·8·7 = 112; in seg 80.
    assert m["rand_precision"] == pytest.approx(1.0)
    assert m["rand_recall"] == pytest.approx(80 / 112)
    assert m["adapted_rand_error"] == pytest.approx(1 - 2 * 80 / (112 + 80))
    by_id = {o["gt_id"]: o for o in m["objects"]}
    assert by_id[1]["n_segments"] == 2 and by_id[1]["overlap"] == 0.5 and by_id[1]["best_segment"] in (10, 11)
    assert by_id[2] == {"gt_id": 2, "size": 8, "best_segment": 20, "overlap": 1.0, "n_segments": 1}
    assert m["split_objects"] == 1 and [s["segment_id"] for s in m["segments"]] == [20, 10, 11]


def test_merge_of_two_objects() -> None:
    gt = two_objects()
    seg = np.where(gt > 0, 7, 0)
    m = evaluate_segmentation(seg, gt)
    assert m["voi_merge"] == pytest.approx(1.0) and m["voi_split"] == pytest.approx(0.0, abs=1e-12)
    assert m["rand_precision"] == pytest.approx(112 / 240) and m["rand_recall"] == pytest.approx(1.0)
    assert m["merging_segments"] == 1 and m["segments"] == [{"segment_id": 7, "size": 16, "n_gt": 2}]


def test_unsegmented_voxels_count_as_segment_zero() -> None:
    gt = two_objects()
    seg = gt.copy()
    seg[0, 0, 12:16] = 0  # half of object 2 left unsegmented
    m = evaluate_segmentation(seg, gt)
    assert m["unsegmented_fraction"] == pytest.approx(4 / 16)
    assert m["voi_split"] == pytest.approx(0.5)  # object 2 is split between segment 2 and "0"
    by_id = {o["gt_id"]: o for o in m["objects"]}
    assert by_id[2]["n_segments"] == 1 and by_id[2]["overlap"] == 0.5  # 0 is not a segment in the table


def test_no_ignore_label_and_large_or_negative_ids() -> None:
    gt = two_objects().astype(np.uint64) + np.uint64(2**40)
    seg = np.full(gt.shape, -3, np.int64)
    m = evaluate_segmentation(seg, gt, ignore_label=None)
    # gt has 3 ids (4, 8, 8 voxels of 20); one segment: merge = H(gt).
    p = np.array([4, 8, 8]) / 20
    assert m["voi_merge"] == pytest.approx(float(-(p * np.log2(p)).sum()))


def test_errors_name_the_problem() -> None:
    with pytest.raises(DataError, match="shape"):
        evaluate_segmentation(np.zeros((2, 2, 2), int), np.zeros((2, 2, 3), int))
    with pytest.raises(DataError, match="no voxel"):
        evaluate_segmentation(np.zeros((2, 2, 2), int), np.zeros((2, 2, 2), int))


def test_format_report_and_run_evaluate(tmp_path) -> None:
    gt = two_objects()
    seg = np.where(gt > 0, 7, 0).astype(np.uint32)
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f["labels"] = gt
        f["seg"] = seg
    m = run_evaluate(f"{tmp_path / 'v.h5'}:seg", f"{tmp_path / 'v.h5'}:labels")
    assert m["voi_merge"] == pytest.approx(1.0) and m["segmentation"].endswith("v.h5:seg")
    text = format_report(m)
    assert "VOI merge  H(gt|seg)  1.0000" in text and "segments merging objects" in text
    assert text.count("\n") > 8


# --------------------------------------------------------------------------- baseline
def test_baseline_recovers_separable_cubes_for_either_membrane_polarity() -> None:
    image = np.full((30, 30, 30), 30, np.uint8)
    labels = np.zeros(image.shape, np.uint32)
    for k, (a, b) in enumerate([(2, 13), (15, 28)]):
        for j, (c, d) in enumerate([(2, 13), (15, 28)]):
            image[2:28, a:b, c:d] = 200
            labels[2:28, a:b, c:d] = 1 + 2 * k + j
    seg = baseline_segmentation(image, min_size=10)
    m = evaluate_segmentation(seg, labels)
    assert m["voi"] == pytest.approx(0.0, abs=1e-9) and m["n_segments"] == 4
    inverted = baseline_segmentation(255 - image, membrane="bright", min_size=10)
    np.testing.assert_array_equal(inverted, seg)
    assert 30 <= interior_threshold(image) < 200  # Otsu of a two-valued image is the lower value


def test_baseline_on_clean_synthetic_volume_is_sensible() -> None:
    from hpctrain.ffn.synthetic import make_synthetic_volume

    image, labels = make_synthetic_volume((40, 56, 56), seed=3, faint_fraction=0.0, noise_sigma=2.0)
    seg = baseline_segmentation(image)
    m = evaluate_segmentation(seg, labels)
    assert m["adapted_rand_error"] < 0.2 and m["voi"] < 1.0
    assert m["unsegmented_fraction"] < 0.1
    # Far better than calling everything one object or every voxel its own.
    one = evaluate_segmentation(np.ones_like(labels), labels)
    assert m["adapted_rand_error"] < 0.5 * one["adapted_rand_error"]
    with pytest.raises(ValueError, match="membrane"):
        baseline_segmentation(image, membrane="grey")
