"""The seeded-watershed baseline: both marker kinds separate touching-through-faint-membrane objects that
a global threshold merges, its parameters are chosen on training labels, and `hpctrain ffn evaluate
--baseline` prints it beside the segmentation being evaluated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.ffn.evaluation.baseline import baseline_segmentation
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
from hpctrain.ffn.evaluation.watershed import WatershedParams, default_grid, tune_watershed, watershed_segmentation

REPO = Path(__file__).resolve().parent.parent


def two_balls(gap_contrast: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """Two bright balls that touch along a plane whose membrane is barely darker than the cells."""
    z, y, x = np.mgrid[:24, :24, :40]
    labels = np.zeros((24, 24, 40), np.uint32)
    labels[((z - 12) ** 2 + (y - 12) ** 2 + (x - 11) ** 2) < 100] = 1
    labels[((z - 12) ** 2 + (y - 12) ** 2 + (x - 29) ** 2) < 100] = 2
    labels[:, :, 19:21] = 0
    image = np.where(labels > 0, 200.0, 40.0)
    image[:, :, 19:21] = np.where(np.isin(labels[:, :, 18:22].max(axis=2, keepdims=True), (1, 2)), 200 - gap_contrast,
                                  40.0)
    noise = np.random.default_rng(0).normal(0, 2, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8), labels


@pytest.mark.parametrize("params", [WatershedParams("distance", 1.0, 2.0), WatershedParams("intensity", 1.0, 4.0,
                                                                                            grow=0)])
def test_watershed_splits_what_a_threshold_merges(params: WatershedParams) -> None:
    image, labels = two_balls()
    assert evaluate_segmentation(baseline_segmentation(image), labels)["merging_segments"] == 1  # Otsu merges
    seg = watershed_segmentation(image, params)
    m = evaluate_segmentation(seg, labels)
    assert m["merging_segments"] == 0 and m["n_segments"] == 2 and m["adapted_rand_error"] < 0.05
    assert seg.dtype == np.uint32


def test_tuning_chooses_the_best_grid_point_on_the_given_labels() -> None:
    image, labels = two_balls()
    grid = [WatershedParams("distance", 1.0, 40.0), WatershedParams("distance", 1.0, 2.0)]  # h 40: one marker
    best, tried = tune_watershed(image, labels, grid)
    assert best == grid[1] and len(tried) == 2 and tried[0]["voi"] > tried[1]["voi"]
    assert len(default_grid()) >= 8 and {p.markers for p in default_grid()} == {"distance", "intensity"}
    with pytest.raises(ValueError, match="markers must be one of"):
        WatershedParams("peaks")


@pytest.mark.processes
def test_evaluate_baseline_prints_both_baselines(tmp_path: Path) -> None:
    image, labels = two_balls()
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f["image"], f["labels"], f["seg"] = image, labels, labels
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    v = f"{tmp_path}/v.h5"
    cmd = [sys.executable, "-m", "hpctrain", "ffn", "evaluate", f"{v}:seg", f"{v}:labels", "--baseline", f"{v}:image",
           "--train", f"{v}:image", f"{v}:labels"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "watershed (tuned on --train)" in proc.stdout and "baseline (Otsu components)" in proc.stdout
    rows = {line[:30].strip(): line[30:].split() for line in proc.stdout.splitlines()[-3:]}
    assert rows["this segmentation"] == ["0.000"] * 4 and float(rows["baseline (Otsu components)"][2]) > 0.5
    proc = subprocess.run([*cmd, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    scores = json.loads(proc.stdout)["baselines"]
    assert scores["watershed (tuned on --train)"]["voi"] < scores["baseline (Otsu components)"]["voi"]
    proc = subprocess.run(cmd[:7] + ["--train", f"{v}:image", f"{v}:labels"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "needs --baseline" in proc.stderr and "Traceback" not in proc.stderr
