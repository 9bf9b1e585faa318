"""Learned joins (hpctrain/ffn/inference/join_model.py): pair features, the logistic fit, and the fit inside the
threshold tuning (``data.eval.tune.fit_joins``, ``hpctrain ffn tune --fit-joins``).

The flooding model is the oracle stand-in of test_ffn_inference (a trained FFN's answer is not known in advance);
the logistic fit is checked against scikit-learn's on the same data.
"""

from __future__ import annotations

import json
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
from hpctrain.errors import ConfigError
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
from hpctrain.ffn.inference.join_model import (
    FEATURES,
    JoinModel,
    fit_join_model,
    join_scores,
    pair_features,
    same_object,
    training_pairs,
)
from hpctrain.ffn.inference.runner import segment_volume
from hpctrain.ffn.inference.tuning import fit_joins, tune_inference


def test_the_fit_is_scikit_learns_logistic_regression() -> None:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, len(FEATURES))) * [1, 2, 10, 0.5, 1, 5] + [0.5, 0.3, 10, 6, 0.4, 8]
    truth = x[:, 0] - 0.1 * x[:, 2] + rng.logistic(size=400) > 0
    weight = rng.uniform(1, 30, size=400)
    model = fit_join_model(x, truth, weight, l2=0.5)
    standard = (x - x.mean(axis=0)) / x.std(axis=0)
    reference = LogisticRegression(C=2.0, tol=1e-12, max_iter=100000).fit(standard, truth,
                                                                          sample_weight=weight / weight.mean())
    assert np.allclose(model.coef, reference.coef_[0], atol=1e-6)
    assert model.intercept == pytest.approx(reference.intercept_[0], abs=1e-6)
    assert np.allclose(model.probability(x), reference.predict_proba(standard)[:, 1], atol=1e-7)
    # a dictionary round trip keeps the model
    again = JoinModel.from_mapping(json.loads(json.dumps(model.as_dict())))
    assert np.array_equal(again.probability(x), model.probability(x))
    with pytest.raises(ValueError, match="both kinds"):
        fit_join_model(x, np.ones(400), weight)


def _two_objects() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image, pieces, labels): object 1 (x < 14, brightness 170) cut by a bounded flood into pieces 1 (y < 12) and
    2 (y >= 12), which touch face to face; object 2 (x >= 16, brightness 195) = piece 3; a 2-voxel membrane of
    brightness 120 between them that no flood took."""
    shape = (16, 24, 30)
    labels = np.zeros(shape, np.uint32)
    labels[:, :, :14] = 1
    labels[:, :, 16:] = 2
    image = np.select([labels == 1, labels == 2], [170, 195], 120).astype(np.uint8)
    pieces = labels.copy()
    pieces[:, 12:, :14][labels[:, 12:, :14] == 1] = 4
    pieces[pieces == 2] = 3
    pieces[pieces == 4] = 2
    return image, pieces, labels


def test_the_features_tell_a_cut_through_one_object_from_a_membrane() -> None:
    image, pieces, labels = _two_objects()
    claims = {(1, 2): 0.9, (1, 3): 0.8, (2, 3): 0.7}
    f = {pair: dict(zip(FEATURES, v, strict=True)) for pair, v in pair_features(image, pieces, claims).items()}
    assert set(f) == set(claims)
    cut, membrane = f[(1, 2)], f[(1, 3)]
    assert cut["claim"] == 0.9 and membrane["claim"] == 0.8
    # the membrane fills the zone between 1 and 3; between 1 and 2 only its end at the cut
    assert cut["gap"] < 0.1 and membrane["gap"] > 0.3
    assert cut["brightness_difference"] == 0.0 and membrane["brightness_difference"] == 25.0
    # across a flat cut, the pairs 1, 2 and 3 apart are 1 : 2 : 3 (so 1/6 are face neighbours); across the membrane
    # only pairs 3 apart
    assert cut["touch"] == pytest.approx(1 / 6) and membrane["touch"] == 0.0
    assert abs(cut["membrane_dip"]) < 1.0 and membrane["membrane_dip"] > 30.0
    assert membrane["log_contact"] > 0 and cut["log_contact"] > 0
    assert same_object(pieces, labels, claims) == {(1, 2): True, (1, 3): False, (2, 3): False}
    # a piece over membrane (label 0) only is nobody's object
    assert same_object(np.where(labels == 0, 5, pieces), labels, [(5, 1)]) == {(5, 1): False}


def test_a_model_fitted_on_labelled_pieces_joins_the_cut_and_not_the_membrane() -> None:
    """Claims that cannot tell the two apart (both 0.9) — as the FFN's near a faint membrane — but the image can:
    a model fitted on labelled pairs like these joins the cut and keeps the membrane."""
    image, pieces, labels = _two_objects()
    claims = {(1, 2): 0.9, (1, 3): 0.9, (2, 3): 0.9}
    x, y, w = training_pairs(image, pieces, labels, claims)
    assert y.tolist() == [1.0, 0.0, 0.0] and w[0] == pytest.approx(np.sqrt((pieces == 1).sum()))
    model = fit_join_model(np.repeat(x, 5, axis=0), np.repeat(y, 5), np.repeat(w, 5))
    scores = join_scores(image, pieces, claims, model)
    assert scores[(1, 2)] > 0.5 > max(scores[(1, 3)], scores[(2, 3)])


def test_a_wrong_join_model_is_refused_naming_the_key(tmp_path: Path) -> None:
    good = fit_join_model(np.random.default_rng(0).normal(size=(20, len(FEATURES))), np.arange(20) % 2).as_dict()
    with pytest.raises(ConfigError, match="needs exactly the keys"):
        JoinModel.from_mapping({k: v for k, v in good.items() if k != "coef"})
    with pytest.raises(ConfigError, match="is over features"):
        JoinModel.from_mapping({**good, "features": ["claim"], "mean": [0], "scale": [1], "coef": [1]})
    with pytest.raises(ConfigError, match="scale must be positive"):
        JoinModel.from_mapping({**good, "scale": [0.0] * len(FEATURES)})
    with pytest.raises(ConfigError, match="join_model"):
        InferenceConfig.from_mapping({"join_model": {**good, "features": list(reversed(FEATURES))}})
    assert InferenceConfig.from_mapping({"join_model": good}).joins.join_model == good
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    job["data"]["eval"]["inference"]["join_model"] = {**good, "intercept": None, "bias": 1.0}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "jobs", "validate", str(tmp_path / "job.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "data.eval.inference.join_model" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


BASE = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=20, seed_policy="grid",
                       seed_args={"step": 6, "offsets": (0, 3)}, max_seed_distance=4, segment_threshold=0.6,
                       move_threshold=0.9, agglomerate_threshold=0.5, watershed_fill=True, split_pieces=True,
                       linkage="average")


def test_joins_fitted_on_one_volume_segment_another() -> None:
    """``fit_joins`` on one labelled volume, then the thresholds tuned and a second volume segmented with the
    fitted model: bounded floods cut the objects into pieces (VOI split > 1 without joins) and the fitted joins
    put them back together as well as the oracle's own claims do."""
    fit_image, fit_labels = painted_volume((32, 48, 48), seed=5)
    image, labels = painted_volume((32, 48, 48), seed=6)
    fitted, record, _ = fit_joins(OracleModel(), fit_image, fit_labels, BASE)
    assert record["pairs"] > record["one_object"] > 0 and set(record["coef"]) == set(FEATURES)
    chosen, rows = tune_inference(OracleModel(), image, labels, BASE.replace(join_model=fitted),
                                  {"agglomerate_threshold": [0.3, 0.5]})
    assert chosen.joins.join_model == fitted and len(rows) == 2
    unjoined = evaluate_segmentation(segment_volume(OracleModel(), image, BASE.replace(agglomerate_threshold=0)),
                                     labels)
    by_claims = evaluate_segmentation(segment_volume(OracleModel(), image, BASE), labels)
    learned = evaluate_segmentation(segment_volume(OracleModel(), image, chosen), labels)
    assert unjoined["voi_split"] > 1.0
    assert learned["voi"] < unjoined["voi"] - 0.8 and learned["voi"] <= by_claims["voi"] + 0.05
    assert min(r["voi"] for r in rows) == pytest.approx(learned["voi"])


class NoCalls(OracleModel):
    """A model that must not be called: tuning on the volume the join model was fitted on reuses the fit's flood."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model was called: the fit's flood was not reused")


@pytest.mark.processes
def test_tuning_on_the_fit_volume_reuses_the_fit_flood() -> None:
    """Choosing the join threshold on the volume the join model was fitted on costs no second flood: the rows are
    those a fresh flood gives, and a candidate with other flood settings (another move threshold) floods anew."""
    image, labels = painted_volume((32, 48, 48), seed=5)
    fitted, _, flood = fit_joins(OracleModel(), image, labels, BASE)
    with_model = BASE.replace(join_model=fitted)
    grid = {"agglomerate_threshold": [0.3, 0.5]}
    reused, reused_rows = tune_inference(NoCalls(), image, labels, with_model, grid, floods=[flood])
    fresh, fresh_rows = tune_inference(OracleModel(), image, labels, with_model, grid)
    assert reused == fresh and all(r["reused_flood"] for r in reused_rows)
    assert [r["voi"] for r in reused_rows] == [r["voi"] for r in fresh_rows]
    assert flood.serves(with_model.replace(agglomerate_threshold=0.3))
    assert not flood.serves(with_model.replace(move_threshold=0.8))
    assert not flood.serves(with_model.replace(agglomerate_threshold=0))  # no join: no claims computed
    with pytest.raises(AssertionError, match="not reused"):
        tune_inference(NoCalls(), image, labels, with_model, {"move_threshold": [0.9, 0.8]}, floods=[flood])


@pytest.mark.processes
def test_the_join_fit_floods_with_its_own_settings_and_the_choice_reuses_that_flood(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.eval.tune.fit_joins.inference`` (the demo: ``self_prediction: 0``): the fit's flood of the training
    volume skips the self-prediction check — fewer model calls —, the join threshold is chosen on that same flood
    (no second flood), and only the choice and the join model come back: the held-out settings keep the check."""
    from hpctrain.ffn.inference.tuning import tune_checkpoint
    from hpctrain.ffn.model import ConvStack3D

    fovs = [0]  # FOVs the model was asked, all calls together
    forward = ConvStack3D.forward

    def counted(self: ConvStack3D, x: torch.Tensor) -> torch.Tensor:
        fovs[0] += int(x.shape[0])
        return forward(self, x)

    monkeypatch.setattr(ConvStack3D, "forward", counted)
    ckpt = everything_model(tmp_path / "m.pt")
    image, labels = painted_volume((24, 32, 32), seed=5)
    with h5py.File(tmp_path / "fit.h5", "w") as f:
        f["image"], f["labels"] = image, labels
    spec = (f"{tmp_path}/fit.h5:image", f"{tmp_path}/fit.h5:labels")
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    settings = {**job["data"]["eval"]["inference"], "max_seed_distance": 4, "min_segment_size": 20,
                "seed_policy": "grid", "seed_args": {"step": 6, "offsets": [0, 3]}, "self_prediction": 0.7,
                "concurrent_floods": 1, "speculative_self_prediction": False}
    asked, moves = {}, {}
    for name, changed in (("checked", None), ("unchecked", {"self_prediction": 0})):
        fovs[0] = 0
        record = tune_checkpoint(str(ckpt), *spec, settings, {"agglomerate_threshold": [0.4, 0.6]}, None,
                                 threads=1, fit_on=(*spec, None), fit_settings=changed)
        assert set(record["chosen"]) == {"agglomerate_threshold", "join_model"}
        assert len(record["rows"]) == 2 and all(row["reused_flood"] for row in record["rows"])
        asked[name], moves[name] = fovs[0], record["rows"][0]["ffn_calls"]
    # every move is checked (this model agrees with itself), so the check doubles the flood's FOVs
    assert moves["checked"] == moves["unchecked"] > 100
    assert asked["unchecked"] < asked["checked"] - 0.9 * moves["checked"]


@pytest.mark.processes
def test_the_join_fit_flood_cannot_change_what_the_checkpoint_or_the_fit_decides(tmp_path: Path) -> None:
    """fit_joins.inference takes flood settings only: the FOV (from the checkpoint) or a join model (the fit makes
    it) there is refused naming the key, as is a misspelt setting; the demo job's own value validates."""
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    assert job["data"]["eval"]["tune"]["fit_joins"] == {"inference": {"self_prediction": 0}}
    run = [sys.executable, "-m", "hpctrain", "jobs", "validate", str(tmp_path / "job.yaml")]
    for bad, expect in (({"fov": [9, 9, 9]}, "fov cannot differ"), ({"self_predictoin": 0}, "self_predictoin")):
        job["data"]["eval"]["tune"]["fit_joins"] = {"inference": bad}
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
        proc = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "data.eval.tune.fit_joins.inference" in out and expect in out, out
        assert "Traceback" not in out


def grid_tune_job(directory: Path) -> dict:
    """The demo's job with a join fit and two thresholds to choose, written to ``directory/job.yaml``. The model
    these tests use floods everything: floods from a grid of seeds, bounded to 2 voxels from them, leave pieces
    to join."""
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    job["data"]["eval"]["tune"] = {"agglomerate_threshold": [0.4, 0.6], "fit_joins": {}}
    job["data"]["eval"]["inference"].update(max_seed_distance=2, min_segment_size=20, seed_policy="grid",
                                            seed_args={"step": 6, "offsets": [0, 3]}, self_prediction=0)
    (directory / "job.yaml").write_text(yaml.safe_dump(job))
    return job


@pytest.mark.processes
def test_ffn_tune_fits_the_join_model_and_prints_it(tmp_path: Path) -> None:
    ckpt = everything_model(tmp_path / "m.pt")
    for name, seed in (("fit", 5), ("vol", 6)):
        image, labels = painted_volume((24, 32, 32), seed=seed)
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["image"], f["labels"] = image, labels
    grid_tune_job(tmp_path)
    run = [sys.executable, "-m", "hpctrain", "ffn", "tune", str(ckpt), f"{tmp_path}/vol.h5:image",
           f"{tmp_path}/vol.h5:labels", "--threads", "1", "--job", str(tmp_path / "job.yaml")]
    proc = subprocess.run([*run, "--fit-joins", f"{tmp_path}/fit.h5:image", f"{tmp_path}/fit.h5:labels", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = json.loads(proc.stdout)["chosen"]
    assert set(chosen) == {"agglomerate_threshold", "join_model"}
    assert JoinModel.from_mapping(chosen["join_model"]).features == FEATURES
    # fit_joins without --fit-joins: the job's training volume is synthetic here, so there are no files to fit on
    proc = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "data.eval.tune.fit_joins" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.processes
def test_a_join_fit_on_far_fewer_pairs_does_not_replace_the_packaged_one(tmp_path: Path) -> None:
    """``ffn tune --fit-joins`` on a small volume must not silently replace a join model fitted on many more pairs:
    it is refused with both counts, the package left as it was, unless --replace-joins. The package here says its
    model was fitted on 709 pairs (as one fitted on a large training volume would)."""
    from hpctrain.ffn.inference.settings import PACKAGE_FILE
    from hpctrain.workflows.ffn import find_trained, tune_trained

    ckpt = everything_model(tmp_path / "m.pt")
    image, labels = painted_volume((24, 32, 32), seed=5)
    with h5py.File(tmp_path / "fit.h5", "w") as f:
        f["image"], f["labels"] = image, labels
    job = grid_tune_job(tmp_path)
    volume = [f"{tmp_path}/fit.h5:image", f"{tmp_path}/fit.h5:labels"]
    first = tune_trained(find_trained(str(ckpt)), job["data"], image=volume[0], labels=volume[1], fit_joins=volume,
                         threads=1)
    pairs = first["join_fit"]["pairs"]
    package = tmp_path / PACKAGE_FILE
    written = json.loads(package.read_text())
    assert 0 < pairs < 709 / 4 and written["chosen"]["join_model"] == first["chosen"]["join_model"]
    written["record"]["join_fit"]["pairs"] = 709
    package.write_text(json.dumps(written))
    before = package.read_bytes()

    run = [sys.executable, "-m", "hpctrain", "ffn", "tune", str(ckpt), *volume, "--threads", "1", "--job",
           str(tmp_path / "job.yaml"), "--fit-joins", *volume]
    proc = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpctrain: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"fitted on 709 pairs of pieces; this fit has {pairs}" in errors[0] and "--replace-joins" in errors[0]
    assert package.read_bytes() == before  # the better fit stays

    replaced = tune_trained(find_trained(str(ckpt)), job["data"], image=volume[0], labels=volume[1],
                            fit_joins=volume, threads=1, replace_joins=True)
    assert json.loads(package.read_text())["record"]["join_fit"]["pairs"] == replaced["join_fit"]["pairs"] == pairs


def test_a_fitted_join_model_in_eight_subvolumes_matches_one_process(tmp_path: Path) -> None:
    """``hpctrain ffn segment --subvolumes`` with a join model: each piece scores its pairs from what its box holds
    of the two pieces (features of truncated pieces), and the assembled result stays within 0.05 VOI of one
    process."""
    from test_ffn_subvolumes import in_pieces

    cfg = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=20, seed_policy="grid",
                          seed_args={"step": 6, "offsets": (0, 3)}, max_seed_distance=4, agglomerate_threshold=0.5,
                          watershed_fill=True, split_pieces=True)
    fit_image, fit_labels = painted_volume((32, 48, 48), seed=6)
    cfg = cfg.replace(join_model=fit_joins(OracleModel(), fit_image, fit_labels, cfg)[0])
    image, labels = painted_volume()
    whole = evaluate_segmentation(segment_volume(OracleModel(), image, cfg), labels)
    assert whole["voi"] < 0.3
    _, _, summary, pieces = in_pieces(tmp_path, image, cfg)
    assert summary["agglomerated_pairs"] > 50
    assert abs(evaluate_segmentation(pieces, labels)["voi"] - whole["voi"]) <= 0.05


@pytest.mark.processes
def test_a_join_fit_volume_is_checked_before_any_work(tmp_path: Path) -> None:
    """data.eval.tune.fit_joins.volume: files checked by ``jobs validate --check-paths`` like the training volume."""
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    job["data"]["eval"]["tune"]["fit_joins"] = {"volume": {"image": f"{tmp_path}/nope.h5:image",
                                                           "labels": f"{tmp_path}/nope.h5:labels"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    run = [sys.executable, "-m", "hpctrain", "jobs", "validate", str(tmp_path / "job.yaml")]
    proc = subprocess.run([*run, "--check-paths"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "data.eval.tune.fit_joins.volume.image" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # For a site whose files are elsewhere the paths are not checked here: the rest of the spec is valid.
    assert subprocess.run([*run, "--site", "ci-slurm"], cwd=REPO, capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL).returncode == 0
