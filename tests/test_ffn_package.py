"""A trained FFN is a model package: after ``hpctrain demo`` (training, then the join model and thresholds chosen
for the trained model), ``hpctrain ffn segment RUN VOLUME`` segments a new volume exactly as the demo's own
inference path does, with no job spec; ``hpctrain ffn tune RUN`` chooses again and writes the same package; a
package of another schema is refused naming the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def _hpctrain(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _labels(path: Path) -> np.ndarray:
    with h5py.File(path) as f:
        return f["segmentation"][()]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_segment_run_uses_the_package_the_demo_wrote(tmp_path: Path) -> None:
    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.ffn.inference.settings import PACKAGE_SCHEMA
    from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5
    from hpctrain.workflows.demo import segment_and_score
    from hpctrain.workflows.ffn import inference_settings

    env = {**os.environ, "HPCTRAIN_HOME": str(tmp_path / "home"), "HPCTRAIN_REGISTRY": str(tmp_path / "reg.db"),
           "HPCTRAIN_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = tmp_path / "demo"
    _hpctrain(["demo", "--out", str(out), "--steps", "8", "--volume-shape", "24", "40", "40", "--threads", "1"], env,
              timeout=880)
    run_dir = next((out / "runs").iterdir())
    package_path = run_dir / "checkpoints" / "inference.json"
    package = json.loads(package_path.read_text())
    scores = json.loads((out / "scores.json").read_text())
    chosen = scores["inference_tuning"]["chosen"]
    assert package["schema"] == PACKAGE_SCHEMA and package["chosen"] == chosen
    assert scores["inference_tuning"]["package"] == str(package_path)
    assert (run_dir / "checkpoints" / package["checkpoint"]).is_file()
    settings = InferenceConfig.from_mapping(package["settings"])
    assert settings.flood.fov == (15, 15, 15) and settings.joins.agglomerate_threshold == chosen[
        "agglomerate_threshold"]

    # The held-out volume by run id: the same labels as the demo's own segmentation of it.
    run_id = run_dir.name
    proc = _hpctrain(["ffn", "segment", run_id, f"{out}/data/eval.h5:image", "-o", str(tmp_path / "eval.h5"),
                      "--threads", "1"], env)
    assert f"settings: {package_path}" in proc.stdout
    assert np.array_equal(_labels(tmp_path / "eval.h5"), _labels(out / "heldout_segmentation.h5"))

    # A new volume by run directory, against the demo's own inference path on it (the job's settings and the
    # choice the demo printed, as the demo segments its held-out volumes).
    image, labels = make_synthetic_volume((24, 40, 40), 9)
    new = write_hdf5(tmp_path / "new.h5", image, labels)
    _hpctrain(["ffn", "segment", str(run_dir), f"{new}:image", "-o", str(tmp_path / "cli.h5"), "--threads", "1"],
              env)
    import yaml

    job = yaml.safe_load((REPO / "jobs" / "ffn-local.yaml").read_text())
    demo_settings = {**inference_settings(job["data"]), **chosen}
    checkpoint = str(run_dir / "checkpoints" / package["checkpoint"])
    segment_and_score(checkpoint, str(new), tmp_path / "demo_path.h5", demo_settings, threads=1)
    cli, demo = _labels(tmp_path / "cli.h5"), _labels(tmp_path / "demo_path.h5")
    assert cli.max() > 0 and np.array_equal(cli, demo)
    with h5py.File(tmp_path / "cli.h5") as f:  # the segmentation records what ran and where it came from
        attrs = dict(f["segmentation"].attrs)
    assert attrs["settings_from"] == str(package_path)
    assert json.loads(attrs["config"]) == {**package["settings"], "precision": "float32"}

    # An option still overrides the package.
    proc = _hpctrain(["ffn", "segment", str(run_dir), f"{new}:image", "-o", str(tmp_path / "no_joins.h5"),
                      "--threads", "1", "--agglomerate-threshold", "0"], env)
    with h5py.File(tmp_path / "no_joins.h5") as f:
        assert json.loads(f["segmentation"].attrs["config"])["agglomerate_threshold"] == 0

    # Choosing again on the volume the demo chose on (the run's own job: its training volume) writes the same.
    before = package_path.read_text()
    package_path.unlink()
    proc = _hpctrain(["ffn", "tune", run_id, "--threads", "1"], env)
    assert f"model package: {package_path}" in proc.stdout
    again = json.loads(package_path.read_text())
    assert again["settings"] == json.loads(before)["settings"] and again["chosen"] == chosen


def test_a_package_of_another_schema_is_refused_naming_the_fix(tmp_path: Path) -> None:
    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.errors import CheckpointError
    from hpctrain.ffn.inference.settings import find_package, read_package, write_package

    step = tmp_path / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (step / "shared.pt").write_bytes(b"")
    written = write_package(step / "shared.pt", InferenceConfig(move_threshold=0.7), model_name="ffn",
                            chosen={"move_threshold": 0.7})
    assert find_package(step / "shared.pt") == find_package(tmp_path / "checkpoints") == written
    package = read_package(written)
    assert package["checkpoint"] == str((step / "shared.pt").resolve())
    assert InferenceConfig.from_mapping(package["settings"]).flood.move_threshold == 0.7
    data = json.loads(written.read_text())
    written.write_text(json.dumps({**data, "schema": "hpctrain.ffn.inference/0"}))
    with pytest.raises(CheckpointError, match="hpctrain ffn tune RUN"):
        read_package(written)
    written.write_text(json.dumps({**data, "settings": {"move_treshold": 0.7}}))
    with pytest.raises(Exception, match="valid keys"):
        read_package(written)


def test_which_settings_segment_runs_with(tmp_path: Path) -> None:
    """``--job`` first, then the model package, then the run's own job, then the defaults; options override."""
    import yaml

    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.ffn.inference.settings import write_package
    from hpctrain.workflows.ffn import find_trained, segment_settings

    job = yaml.safe_load((REPO / "jobs" / "ffn-local.yaml").read_text())
    job["data"]["train"] = {"image": "t.h5:image", "labels": "t.h5:labels"}
    run_dir = tmp_path / "run"
    step = run_dir / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job))
    (step / "shared.pt").write_bytes(b"")
    write_package(step / "shared.pt", InferenceConfig(move_threshold=0.75), model_name="ffn")

    trained = find_trained(str(run_dir))
    assert trained.checkpoint == str((step / "shared.pt").resolve()) and trained.run_dir == run_dir
    settings, provenance = segment_settings(trained, None, {"segment_threshold": 0.8, "move_threshold": None})
    assert settings["move_threshold"] == 0.75 and settings["segment_threshold"] == 0.8
    assert provenance == {"settings_from": str(run_dir / "checkpoints" / "inference.json"),
                          "options": {"segment_threshold": 0.8}}
    assert find_trained(str(step / "shared.pt")).package == trained.package  # the file finds its run's package

    (tmp_path / "other.yaml").write_text(yaml.safe_dump({**job, "data": {**job["data"], "eval": {
        **job["data"]["eval"], "inference": {"move_threshold": 0.6}}}}))
    settings, provenance = segment_settings(trained, str(tmp_path / "other.yaml"), {})
    assert settings == {"move_threshold": 0.6} and provenance["settings_from"] == f"job {tmp_path / 'other.yaml'}"

    (run_dir / "checkpoints" / "inference.json").unlink()  # no package: the run's job, and a hint to choose
    trained = find_trained(str(step / "shared.pt"))
    settings, provenance = segment_settings(trained, None, {})
    assert settings == job["data"]["eval"]["inference"] and provenance["settings_from"] == f"job of run {run_dir}"
    assert any("hpctrain ffn tune RUN" in w for w in trained.warnings)
