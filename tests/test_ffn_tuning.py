"""Inference thresholds chosen per trained model on a labelled volume (hpctrain/ffn/inference/tuning.py, ``hpctrain ffn
tune``, ``data.eval.tune``).

The models are the oracle stand-ins of test_ffn_inference (a trained FFN's answer is not known in advance);
``ShyOracle`` is the same oracle as a less confident model: its object voxels sit at p ~ 0.83, between a move
threshold of 0.8 and one of 0.9 — the situation the tuning exists for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from test_ffn_inference import OracleModel
from test_ffn_subvolumes import REPO, everything_model, painted_volume

from hpctrain.config.plugins.ffn_inference import InferenceConfig
from hpctrain.errors import ConfigError, DataError
from hpctrain.ffn.inference.runner import segment_volume
from hpctrain.ffn.inference.tuning import candidates, central_crop, tune_inference


class ShyOracle(OracleModel):
    """The oracle's answer at a fifth of its confidence: objects ~ logit 1.6 (p 0.83), the rest ~ -1.6."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ShyOracle.calls += 1
        return super().forward(x) * 0.2


BASE = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=20, seed_policy="grid",
                       seed_args={"step": 6, "offsets": (0, 3)}, max_seed_distance=4, segment_threshold=0.6,
                       move_threshold=0.9, agglomerate_threshold=0.8, watershed_fill=True)


def test_central_crop_and_candidates() -> None:
    assert central_crop((64, 128, 128), (48, 96, 96)) == (slice(8, 56), slice(16, 112), slice(16, 112))
    assert central_crop((20, 128, 128), (48, 96, 97)) == (slice(0, 20), slice(16, 112), slice(15, 112))
    assert central_crop((5, 6, 7), None) == (slice(0, 5), slice(0, 6), slice(0, 7))
    grid = {"agglomerate_threshold": [0.6, 0.8], "move_threshold": [0.7, 0.9]}
    assert candidates(grid) == [{"move_threshold": 0.7, "agglomerate_threshold": 0.6},
                                {"move_threshold": 0.7, "agglomerate_threshold": 0.8},
                                {"move_threshold": 0.9, "agglomerate_threshold": 0.6},
                                {"move_threshold": 0.9, "agglomerate_threshold": 0.8}]
    with pytest.raises(ConfigError, match="cannot tune"):
        candidates({"fov": [9]})


def test_a_less_confident_model_gets_the_move_threshold_its_floods_need() -> None:
    image, labels = painted_volume((32, 48, 48))
    # With the job's 0.9 this model's floods stop at their seeds: nearly nothing is segmented by the floods.
    stuck = segment_volume(ShyOracle(), image, BASE)
    ShyOracle.calls = 0
    chosen, rows = tune_inference(ShyOracle(), image, labels, BASE,
                                  {"move_threshold": [0.9, 0.8], "agglomerate_threshold": [0.5, 0.9]})
    assert chosen.flood.move_threshold == 0.8 and chosen.flood.segment_threshold == BASE.flood.segment_threshold
    assert [r["settings"] for r in rows] == [{"move_threshold": 0.9, "agglomerate_threshold": 0.5},
                                             {"move_threshold": 0.9, "agglomerate_threshold": 0.9},
                                             {"move_threshold": 0.8, "agglomerate_threshold": 0.5},
                                             {"move_threshold": 0.8, "agglomerate_threshold": 0.9}]
    by = {(r["settings"]["move_threshold"], r["settings"]["agglomerate_threshold"]): r for r in rows}
    assert by[(0.8, 0.5)]["voi"] < by[(0.9, 0.5)]["voi"] - 1.0
    # the join thresholds share one flood each: the model ran only for the two floods and their pair scores
    assert by[(0.8, 0.5)]["ffn_calls"] == by[(0.8, 0.9)]["ffn_calls"] > 0
    tuning_calls, ShyOracle.calls = ShyOracle.calls, 0
    for move in (0.9, 0.8):
        segment_volume(ShyOracle(), image, BASE.replace(move_threshold=move))
    assert tuning_calls == ShyOracle.calls
    tuned = segment_volume(ShyOracle(), image, chosen)
    from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation

    assert evaluate_segmentation(tuned, labels)["voi"] < evaluate_segmentation(stuck, labels)["voi"] - 1.0
    assert min(r["voi"] for r in rows) == pytest.approx(evaluate_segmentation(tuned, labels)["voi"])


def test_the_first_of_equal_candidates_is_kept_and_bad_volumes_are_refused() -> None:
    image, labels = painted_volume((32, 48, 48))
    # the confident oracle floods alike at 0.8 and 0.9: the first listed wins the tie
    chosen, rows = tune_inference(OracleModel(), image, labels, BASE, {"move_threshold": [0.9, 0.8]})
    assert rows[0]["voi"] == pytest.approx(rows[1]["voi"]) and chosen.flood.move_threshold == 0.9
    with pytest.raises(DataError, match="differ in shape"):
        tune_inference(OracleModel(), image, labels[1:], BASE, {"move_threshold": [0.9]})
    with pytest.raises(DataError, match="all 0"):
        tune_inference(OracleModel(), image, np.zeros_like(labels), BASE, {"move_threshold": [0.9]})


def _job(tmp_path: Path, tune: object) -> Path:
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    job["data"]["eval"]["tune"] = tune
    if tune is None:
        del job["data"]["eval"]["tune"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.processes
def test_ffn_tune_command_prints_every_candidate_and_the_choice(tmp_path: Path) -> None:
    ckpt = everything_model(tmp_path / "m.pt")
    image, labels = painted_volume((24, 32, 32))
    with h5py.File(tmp_path / "vol.h5", "w") as f:
        f["image"], f["labels"] = image, labels
    job = _job(tmp_path, {"move_threshold": [0.8, 0.9], "agglomerate_threshold": [0.6, 0.9], "crop": [24, 24, 24]})
    run = [sys.executable, "-m", "hpctrain", "ffn", "tune", str(ckpt), f"{tmp_path}/vol.h5:image",
           f"{tmp_path}/vol.h5:labels", "--threads", "1"]
    proc = subprocess.run([*run, "--job", str(job), "--json"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    out = json.loads(proc.stdout)
    assert len(out["rows"]) == 4 and set(out["chosen"]) == {"move_threshold", "agglomerate_threshold"}
    assert out["chosen"] == min(out["rows"], key=lambda r: r["voi"])["settings"]
    # no data.eval.tune: one message naming the key, exit 2
    proc = subprocess.run([*run, "--job", str(_job(tmp_path, None))], cwd=REPO, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "data.eval.tune" in proc.stderr and "Traceback" not in proc.stderr


def test_a_wrong_tune_value_is_refused_by_jobs_validate(tmp_path: Path) -> None:
    job = _job(tmp_path, {"move_threshold": [0.8, 1.5]})
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "jobs", "validate", str(job)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "data.eval.tune.move_threshold" in proc.stdout + proc.stderr


@pytest.mark.processes
def test_a_tuning_volume_is_checked_like_the_training_volume(tmp_path: Path) -> None:
    """data.eval.tune.volume: a synthetic volume or image + labels files, checked by jobs validate before any
    work — a missing file names its key (``--check-paths``: the files are read where the job runs), and both
    kinds at once are refused."""
    for name in ("missing", "both", "synthetic"):
        (tmp_path / name).mkdir()
    missing = _job(tmp_path / "missing", {"move_threshold": [0.8], "volume": {"image": f"{tmp_path}/nope.h5:image",
                                                                  "labels": f"{tmp_path}/nope.h5:labels"}})
    both = _job(tmp_path / "both", {"move_threshold": [0.8], "volume": {"synthetic": {"shape": [8, 8, 8]},
                                                               "image": f"{tmp_path}/nope.h5:image"}})
    for job, key in ((missing, "data.eval.tune.volume.image"), (both, "data.eval.tune.volume")):
        proc = subprocess.run([sys.executable, "-m", "hpctrain", "jobs", "validate", str(job), "--check-paths"],
                              cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert proc.returncode != 0 and key in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
    synthetic = _job(tmp_path / "synthetic",
                     {"move_threshold": [0.8], "volume": {"synthetic": {"shape": [16, 24, 24], "seed": 7}}})
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "jobs", "validate", str(synthetic)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
