"""The laptop refuses what the ranks would refuse at start: model plug-in schemas, the LR schedule, batch vs
dataset, checkpoint interval and data paths (hpctrain/config/preflight.py), through the CLI and the Python API.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.config.catalog import MODELS, find_schema
from hpctrain.config.fit import check_fit
from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.plugins.digits import DIGITS_IMAGES
from hpctrain.config.plugins.ffn import FFNData, FFNModelArgs, SyntheticVolume, training_margin
from hpctrain.config.preflight import PreflightWarning, check_job, steps_per_epoch, warn
from hpctrain.config.site import load_site
from hpctrain.errors import ConfigError, FitError

REPO = Path(__file__).resolve().parents[1]
FFN_LOCAL = REPO / "jobs" / "ffn-local.yaml"


def cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, cwd=cwd,
                          env=environ, timeout=120, stdin=subprocess.DEVNULL)


def spec(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def write_volume(path: Path, shape: tuple[int, int, int], labels_shape: tuple[int, int, int] | None = None,
                 names: tuple[str, str] = ("image", "labels")) -> Path:
    """An HDF5 file holding a uint8 image and uint64 labels (of ``labels_shape``, default the same)."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as f:
        f[names[0]] = np.zeros(shape, np.uint8)
        f[names[1]] = np.ones(labels_shape or shape, np.uint64)
    return path


def tiny(model: str = "resnet", **sections: object) -> JobSpec:
    doc = {"name": "tiny", "model": model, "train": {"steps": 20, "batch_per_rank": 4, "lr": 0.1},
           "resources": {"nodes": 1, "ranks_per_node": 2, "walltime": "00:10:00"}}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value  # type: ignore[dict-item]
    return JobSpec.model_validate(doc)


# ---------------------------------------------------------------------------- the issue's cases, through the CLI

ISSUE_CASES = [
    ("model_args.depth=-3", "model_args.depth: Input should be greater than or equal to 1 (got -3)"),
    ("model_args.fov_policy=bogus", "model_args.fov_policy: Input should be 'fixed' or 'max_pred_moves'"),
    ("data.train.synthetic.shape=[4,4,4]", "data.train.synthetic.shape: a training volume of [4, 4, 4] cannot "
                                           "hold one training box"),
    ("train.steps=2", "train.steps: the cosine decay runs from the end of the 50-step warm-up to train.steps = 2"),
    ("model=resent", "model: unknown model 'resent'; did you mean 'resnet'?"),
    # A movement step wider than half the FOV: the ranks' face_max_offsets (and the inference Canvas) refuse it.
    ("model_args.deltas=[9,9,9]", "model_args.deltas: deltas [9, 9, 9] must lie within 0..(fov - 1) // 2 = "
                                  "[7, 7, 7] for fov [15, 15, 15]"),
    ("data.eval.inference.deltas=[8,8,8]", "data.eval.inference.deltas: inference deltas [8, 8, 8] must lie "
                                           "within 0..(fov - 1) // 2 = [7, 7, 7]"),
    # The thresholds are chosen by segmenting a crop: the inference Canvas refuses one smaller than the FOV.
    ("data.eval.tune.crop=[9,40,40]", "data.eval.tune.crop: a volume of [9, 40, 40] to segment is smaller than "
                                      "the FOV [15, 15, 15]"),
]


@pytest.mark.parametrize("assignment,message", ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_jobs_validate_refuses_what_the_ranks_would_refuse(assignment: str, message: str) -> None:
    done = cli("jobs", "validate", "jobs/ffn-local.yaml", "--site", "local", "--set", assignment)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"hpctrain: error: --set {assignment}: {message}"), done.stderr
    assert "Traceback" not in done.stderr and "ok" not in done.stdout


@pytest.mark.parametrize("assignment,message", ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
@pytest.mark.usefixtures("isolated_home")
def test_python_api_refuses_the_same_cases(assignment: str, message: str, tmp_path: Path) -> None:
    from hpctrain.submission.api import submit_runs
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.render import render_script

    job = load_job(FFN_LOCAL, sets=[assignment])
    with pytest.raises(ConfigError) as err:
        check_job(job, load_site("local"), local_paths=True)
    assert str(err.value).startswith(f"--set {assignment}: {message}")
    with pytest.raises(ConfigError, match=message.split(":")[0]):
        render_script(job, load_site("ci-slurm"), run_dir="/RUN", spec_path="/RUN/job.yaml")
    with RunRegistry() as registry, pytest.raises(ConfigError, match=message.split(":")[0]):
        submit_runs(FFN_LOCAL, "local", sets=[assignment], run_root=str(tmp_path / "runs"), dry_run=True,
                    registry=registry)
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_errors_from_the_file_name_its_line(tmp_path: Path) -> None:
    path = spec(tmp_path, """\
        name: typo
        # a comment line
        model: resent
        train: {steps: 10, batch_per_rank: 2, lr: 0.1}
        """)
    done = cli("jobs", "validate", str(path))
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"hpctrain: error: {path}:3: model: unknown model 'resent'; did you mean "
                                          "'resnet'? use one of ffn, lstm, resnet or package.module:factory")
    path = spec(tmp_path, """\
        name: deep
        model: ffn
        model_args:
          depth: 0
          fov_polcy: fixed
        data: {train: {synthetic: {shape: [32, 32, 32]}}}
        train: {steps: 10, batch_per_rank: 2, lr: 0.1}
        """)
    with pytest.raises(ConfigError) as err:
        check_job(load_job(path), local_paths=False)
    assert str(err.value).splitlines() == [
        f"{path}:4: model_args.depth: Input should be greater than or equal to 1 (got 0)",
        f"{path}:5: model_args.fov_polcy: unknown key; did you mean 'fov_policy'?"]


def test_a_spec_built_in_python_names_the_key_only() -> None:
    with pytest.raises(ConfigError) as err:
        check_job(tiny(model_args={"channels": 0}), local_paths=False)
    assert str(err.value) == "model_args.channels: Input should be greater than or equal to 1 (got 0)"


def test_validation_path_imports_no_torch_or_numpy() -> None:
    code = ("import sys\nfrom hpctrain.cli import main\n"
            "assert main(['jobs', 'validate', 'jobs/ffn-local.yaml', '--site', 'local']) == 0\n"
            "assert main(['jobs', 'validate', 'jobs/ffn-theta.yaml', '--site', 'theta']) == 0\n"
            "print(sorted(m for m in ('torch', 'numpy', 'mpi4py', 'h5py', 'sklearn') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_shipped_jobs_pass_the_preflight_on_every_site_they_fit() -> None:
    sites = sorted(p.stem for p in (REPO / "site_configs").glob("*.yaml"))
    for path in sorted((REPO / "jobs").glob("*.yaml")):
        fits = 0
        for name in sites:
            job, site = load_job(path), load_site(name)
            try:
                check_fit(job, site)
            except FitError:
                continue
            fits += 1
            warnings = check_job(job, site, local_paths=False)
            # ffn-local trains on a synthetic volume; the cluster jobs read files that only the cluster holds
            assert warnings == ([] if path.stem == "ffn-local" else [
                w for w in warnings if w.startswith("data.train.image, data.train.labels")]), (path, name)
        assert fits, f"{path.name} fits no shipped site"


# ------------------------------------------------------------------------------------------- the LR schedule


def test_schedule_problems_name_the_key_the_user_changed() -> None:
    with pytest.raises(ConfigError) as err:
        check_job(tiny(train={"steps": 10, "warmup": {"kind": "linear", "steps": 10}, "decay": "cosine"}),
                  local_paths=False)
    assert err.value.key == "train.steps" and "leaves it 0 steps" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_job(tiny(train={"decay": {"kind": "step"}}), local_paths=False)
    assert err.value.key == "train.decay.every"
    long_warmup = check_job(tiny(train={"steps": 10, "warmup": {"kind": "linear", "steps": 40}}), local_paths=False)
    assert long_warmup == ["train.warmup lasts 40 steps, longer than train.steps (10): the learning rate never "
                           "reaches its peak"]


def test_legw_counts_epochs_where_the_dataset_size_is_known() -> None:
    legw = {"lr_scaling": "sqrt", "warmup": {"kind": "legw", "epochs": 1}, "steps": 2000}
    digits = tiny(train=legw)
    assert check_job(digits, local_paths=False) == []
    # the trainer builds its schedule with the same count (runtime/trainer.py)
    assert steps_per_epoch(digits, 2) == (DIGITS_IMAGES - 297) // (4 * 2)
    # the LSTM's epoch is its training text cut into seq_len windows (config/plugins/charlm.py)
    lstm = tiny("lstm", model_args={"seq_len": 50}, data={"max_chars": 20_000}, train=legw)
    assert check_job(lstm, local_paths=False) == []
    assert steps_per_epoch(lstm, 2) == (20_000 - 20_000 // 20) // 50 // (4 * 2)


def test_checkpoint_interval_beyond_the_run_is_a_warning_only_when_chosen() -> None:
    assert check_job(tiny(), local_paths=False) == []  # the default interval (100) on a 20-step job
    warned = check_job(tiny(checkpoint={"every_steps": 50}), local_paths=False)
    assert warned == ["checkpoint.every_steps (50) is more than train.steps (20): no checkpoint before the end; "
                      "a crash loses the whole run (the walltime signal still writes one)"]


def test_bfloat16_on_nodes_without_amx_is_a_warning_naming_the_site_and_the_fix() -> None:
    """``train.precision: bfloat16`` on CPU nodes that emulate it (a site's node.cpu names AMD, Xeon Phi, ...) is
    slower than float32: the laptop says so; auto, float32, AMX nodes, GPU ranks and unknown CPUs say nothing."""
    from hpctrain.config.preflight import cpu_has_amx

    half = {"precision": "bfloat16"}
    warned = check_job(tiny(train=half), load_site("theta"), local_paths=False)
    assert [w for w in warned if "AMX" in w] == [
        "train.precision is bfloat16 but the nodes of site 'theta' (Intel Xeon Phi 7230 (KNL), 1.3 GHz) have no AMX: "
        "bfloat16 convolutions are emulated there, slower than float32; use precision: auto (bfloat16 only where "
        "the hardware has it) or float32"]
    assert not [w for w in check_job(tiny(train={"precision": "auto"}), load_site("theta"), local_paths=False)
                if "AMX" in w]
    on_cpu = [w for w in check_job(tiny(train=half), load_site("polaris"), local_paths=False) if "AMX" in w]
    assert len(on_cpu) == 1 and "(AMD EPYC Milan 7543P, 2.8 GHz)" in on_cpu[0]  # ranks on the host CPUs
    gpu = tiny(train=half, resources={"gpus_per_rank": 1})
    assert not [w for w in check_job(gpu, load_site("polaris"), local_paths=False) if "AMX" in w]
    assert cpu_has_amx("2x Intel Xeon CPU Max 9470C (Sapphire Rapids + HBM)") is None  # not judged: no warning
    assert cpu_has_amx("AMD EPYC 7763, 2.45 GHz") is False
    assert cpu_has_amx(None) is None


def test_the_local_sites_amx_is_read_from_cpuinfo(tmp_path: Path) -> None:
    from hpctrain.config.preflight import cpu_has_amx

    with_amx, without = tmp_path / "amx", tmp_path / "plain"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n")
    assert cpu_has_amx("AMD EPYC", with_amx) is True  # the machine itself outranks a name
    assert cpu_has_amx(None, without) is False
    assert cpu_has_amx("AMD EPYC", tmp_path / "missing") is False  # unreadable: back to the name


# ------------------------------------------------------------------------------------ the built-in plug-ins


def test_resnet_batch_must_fit_the_digits() -> None:
    with pytest.raises(ConfigError) as err:
        check_job(tiny(train={"batch_per_rank": 800}), local_paths=False)
    assert err.value.key == "train.batch_per_rank"
    assert str(err.value).startswith("train.batch_per_rank: 1500 training images cannot fill one step of 2 ranks "
                                     "x 800")
    assert check_job(tiny(train={"batch_per_rank": 750}), local_paths=False) == []
    assert check_job(tiny(train={"batch_per_rank": 800}), local_paths=False, world_size=1) == []
    with pytest.raises(ConfigError, match="data.holdout"):
        check_job(tiny(data={"holdout": DIGITS_IMAGES}), local_paths=False)


def test_lstm_text_must_hold_a_validation_window() -> None:
    with pytest.raises(ConfigError) as err:
        check_job(tiny("lstm", data={"max_chars": 500}, model_args={"seq_len": 64}), local_paths=False)
    assert err.value.key == "data.max_chars" and "use max_chars >= 1320" in str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'hidden'"):
        check_job(tiny("lstm", model_args={"hiden": 64}), local_paths=False)
    assert check_job(tiny("lstm", model_args={"seq_len": 32, "hidden": 64}), local_paths=False) == []


def test_ffn_margin_and_policy_boxes() -> None:
    args = FFNModelArgs.model_validate({"fov": 9, "deltas": 2, "fov_policy": "max_pred_moves", "fov_moves": 2})
    data = FFNData.model_validate({"train": {"synthetic": {"shape": [40, 40, 40]}}})
    # max_pred_moves loads fov + 2 x deltas x (moves + 1): centres need half of that to the border
    assert args.training_box() == (21, 21, 21) and training_margin(args, data) == (10, 10, 10)
    ffn = {"data": {"train": {"synthetic": {"shape": [40, 40, 40]}}, "margin": 4}}
    with pytest.raises(ConfigError) as err:
        check_job(tiny("ffn", model_args={"fov": 9, "deltas": 2, "fov_policy": "max_pred_moves"}, **ffn),
                  local_paths=False)
    assert err.value.key == "data.margin" and "use at least [8, 8, 8]" in str(err.value)
    for bad, key in [({"fov": [8, 9, 9]}, "model_args.fov"),
                     ({"permutable_axes": [0, 1], "fov": [9, 15, 15], "deltas": 2}, "model_args"),
                     ({"faces_only": "yes"}, "model_args.faces_only"), ({"fov": [9, 9]}, "model_args.fov")]:
        with pytest.raises(ConfigError) as err:
            check_job(tiny("ffn", model_args=bad, data={"train": {"synthetic": {}}}), local_paths=False)
        assert err.value.key == key, (bad, str(err.value))
    with pytest.raises(ConfigError, match="data.train: .*synthetic or image"):
        check_job(tiny("ffn", data={"train": {"synthetic": {"shape": 64}, "image": "/v.h5:image"}}),
                  local_paths=False)
    with pytest.raises(ConfigError, match="data.train: required key is missing"):
        check_job(tiny("ffn"), local_paths=False)
    warned = check_job(tiny("ffn", model_args={"fov": 9, "deltas": 2, "single_fov_steps": 50},
                            data={"train": {"synthetic": {"shape": 32}}}), local_paths=False)
    assert warned and "FOV movement is never trained" in warned[0]


@pytest.mark.processes
def test_schemas_match_what_the_ranks_build() -> None:
    """The torch-free schemas repeat a few facts of the allocation side; these must not drift apart."""
    from sklearn.datasets import load_digits

    from hpctrain.ffn.synthetic import make_synthetic_volume
    from hpctrain.ffn.training.stream import StreamConfig
    from hpctrain.ffn.training.task import STREAM_FIELDS

    assert len(load_digits().images) == DIGITS_IMAGES
    assert set(SyntheticVolume.model_fields) == set(inspect.signature(make_synthetic_volume).parameters)
    defaults = StreamConfig()
    for key, field in STREAM_FIELDS.items():
        assert FFNModelArgs.model_fields[key].default == getattr(defaults, field), key
    assert list(MODELS) == ["ffn", "lstm", "resnet"]
    for name, builtin in MODELS.items():
        module, _, attr = builtin.task.partition(":")
        assert hasattr(__import__(module, fromlist=[attr]), attr), name
        assert find_schema(name) == (builtin.schema, None)


# ---------------------------------------------------------------------------------------------- data paths


def test_missing_local_data_names_the_key(tmp_path: Path) -> None:
    volume = tmp_path / "train.h5"
    data = {"train": {"image": f"{volume}:image", "labels": f"{volume}:labels"}}
    job = tiny("ffn", data=data)
    with pytest.raises(ConfigError) as err:
        check_job(job, load_site("local"), local_paths=False)  # the local site runs here: paths are checked
    assert str(err.value).splitlines() == [
        f"data.train.image: {volume} does not exist; check the path: the ranks read it when they start",
        f"data.train.labels: {volume} does not exist; check the path: the ranks read it when they start"]
    remote = check_job(job, load_site("ci-slurm"), local_paths=False)
    assert remote == ["data.train.image, data.train.labels: not checked on this machine; the ranks read them where "
                      "the job runs (submit without --remote and jobs validate --check-paths check them here)"]
    write_volume(volume, (20, 20, 20))
    small = tiny("ffn", model_args={"fov": 9, "deltas": 2}, data=data)
    assert check_job(small, load_site("ci-slurm"), local_paths=True) == []
    with pytest.raises(ConfigError) as err:
        check_job(tiny("ffn", data={"train": {"image": "train.h5:image", "labels": "train.h5:labels"}}),
                  load_site("ci-slurm"), local_paths=False)
    assert "relative path" in str(err.value) and err.value.key == "data.train.image"


@pytest.mark.processes
def test_jobs_validate_check_paths_from_the_command_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.h5"
    path = spec(tmp_path, f"""\
        name: files
        model: ffn
        model_args: {{fov: 9, deltas: 2}}
        data:
          train: {{image: "{missing}:image", labels: "{missing}:labels"}}
        train: {{steps: 10, batch_per_rank: 2, lr: 0.1}}
        """)
    unchecked = cli("jobs", "validate", str(path), "--site", "ci-slurm")
    assert unchecked.returncode == 0 and "not checked on this machine" in unchecked.stderr
    checked = cli("jobs", "validate", str(path), "--site", "ci-slurm", "--check-paths", "--json")
    assert checked.returncode == 2
    assert f"hpctrain: error: {path}:5: data.train.image: {missing} does not exist" in checked.stderr


FILES_JOB = """\
    name: files
    model: ffn
    model_args: {{fov: 9, deltas: 2}}
    data:
      train: {{image: "{image}", labels: "{labels}"}}
    train: {{steps: 10, batch_per_rank: 2, lr: 0.1}}
    """


@pytest.mark.processes
@pytest.mark.usefixtures("isolated_home")
def test_jobs_validate_reads_the_data_files_as_the_ranks_do(tmp_path: Path) -> None:
    """A wrong dataset name, a file that is not HDF5, image and labels of different shapes, a volume too small for
    one training box: each refused by ``jobs validate`` without --site (local, the default site, reads its files
    here) and by ``submit --site local --dry-run``, naming the key's line and the ranks' own message."""
    good = write_volume(tmp_path / "good.h5", (20, 20, 20), names=("raw", "seg"))
    odd = write_volume(tmp_path / "odd.h5", (20, 20, 20), labels_shape=(20, 20, 16))
    small = write_volume(tmp_path / "small.h5", (10, 20, 20))
    text = tmp_path / "text.h5"
    text.write_text("not an HDF5 file\n")
    cases = [
        (f"{good}:image", f"{good}:seg", "data.train.image",
         f"{good}: no dataset 'image'; datasets in the file: ['raw', 'seg']"),
        (f"{text}:image", f"{good}:seg", "data.train.image", f"{text} is not a readable HDF5 file"),
        (f"{odd}:image", f"{odd}:labels", "data.train.labels",
         f"image {odd}:image has shape (20, 20, 20) but labels {odd}:labels have shape (20, 20, 16)"),
        (f"{small}:image", f"{small}:labels", "data.train.image",
         "the file's volume of [10, 20, 20] cannot hold one training box"),
    ]
    for image, labels, key, message in cases:
        path = spec(tmp_path, FILES_JOB.format(image=image, labels=labels))
        for args in (("jobs", "validate", str(path)), ("submit", str(path), "--site", "local", "--dry-run")):
            done = cli(*args, cwd=tmp_path)
            assert done.returncode == 2, (args, done.stdout + done.stderr)
            assert done.stderr.startswith(f"hpctrain: error: {path}:5: {key}: "), done.stderr
            assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    path = spec(tmp_path, FILES_JOB.format(image=f"{good}:raw", labels=f"{good}:seg"))
    done = cli("jobs", "validate", str(path), "--json", cwd=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["warnings"] == [], done.stderr


def test_without_h5py_the_files_are_not_read_and_a_note_says_so(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "h5py" else find_spec(name, *a))
    text = tmp_path / "text.h5"
    text.write_text("not an HDF5 file\n")
    job = tiny("ffn", model_args={"fov": 9, "deltas": 2},
               data={"train": {"image": f"{text}:image", "labels": f"{text}:labels"}})
    assert check_job(job, load_site("local"), local_paths=True) == [
        "data.train: h5py is not installed here, so the files' datasets and shapes were not checked (the ranks "
        "check them when they start)"]


def test_the_ranks_move_fovs_by_the_rule_the_laptop_checks() -> None:
    """face_max_offsets (training's max_pred_moves, inference) refuses deltas by ``deltas_problem``, the function
    the schema's model_args check calls."""
    import numpy as np

    from hpctrain.config.plugins.ffn_fields import deltas_problem
    from hpctrain.ffn.movement import face_max_offsets

    problem = deltas_problem((15, 15, 15), (9, 9, 9))
    assert problem is not None and deltas_problem((15, 15, 15), (7, 7, 7)) is None
    with pytest.raises(ValueError) as err:
        face_max_offsets(np.zeros((15, 15, 15), np.float32), (9, 9, 9), 0.5)
    assert str(err.value) == f"face_max_offsets: deltas do not fit inside a map of shape (15, 15, 15): {problem}"
    assert face_max_offsets(np.ones((15, 15, 15), np.float32), (7, 7, 7), 0.5)  # the widest step is allowed


@pytest.mark.processes
def test_a_walltime_barely_above_the_signal_lead_is_warned() -> None:
    """Each run then spends most of its time starting; under load a restart advanced one step and the requeues
    ran out. The warning says how much time is left and the fix."""
    done = cli("jobs", "validate", "jobs/ffn-local.yaml", "--walltime", "00:02:10", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["warnings"] == [
        "resources.walltime 00:02:10 leaves 10 s per run before the stop signal (checkpoint.signal_lead_s 120 s "
        "before the end), and start-up takes 20-60 s of it, more under load: a run may checkpoint after a few "
        "steps, and each of the 3 requeues (checkpoint.max_requeues) advances as little; lengthen the walltime to "
        "00:05:00 or more, or lower checkpoint.signal_lead_s"]
    done = cli("jobs", "validate", "jobs/ffn-local.yaml", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["warnings"] == [], done.stderr


# ------------------------------------------------------------------------------------------ user plug-ins


PLUGIN_SCHEMA = '''
from pydantic import Field

from hpctrain.config.common import Strict
from hpctrain.config.plugin import ModelSchema


class WidthArgs(Strict):
    width: int = Field(8, ge=1)


SCHEMA = ModelSchema(model_args=WidthArgs)
'''


def test_user_plugin_without_schema_is_checked_only_at_start(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "noschema_pkg").mkdir()
    (tmp_path / "noschema_pkg" / "__init__.py").write_text("")
    (tmp_path / "noschema_pkg" / "net.py").write_text("import torch\n\ndef build(width=8):\n    return None\n")
    warned = check_job(tiny("noschema_pkg.net:build", model_args={"anything": 1}), local_paths=False)
    assert warned == ["model noschema_pkg.net:build: no module noschema_pkg.net_schema declares its schema, so its "
                      "model_args and data are checked only when the ranks start; declare SCHEMA in "
                      "noschema_pkg.net_schema to check them here"]
    assert "noschema_pkg.net" not in sys.modules  # the factory module (it imports torch) was not imported
    elsewhere = check_job(tiny("not_installed_here.net:build"), local_paths=False)
    assert "not_installed_here cannot be imported here" in elsewhere[0]
    assert check_job(tiny("not_installed_here.net:build"), local_paths=True, at_start=True) == []


def test_user_plugin_schema_is_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "widthnet.py").write_text("def build(width=8):\n    raise AssertionError('not imported here')\n")
    (tmp_path / "widthnet_schema.py").write_text(PLUGIN_SCHEMA)
    assert check_job(tiny("widthnet:build", model_args={"width": 4}), local_paths=False) == []
    with pytest.raises(ConfigError) as err:
        check_job(tiny("widthnet:build", model_args={"width": 0}), local_paths=False)
    assert err.value.key == "model_args.width"
    with pytest.raises(ConfigError, match="data.extra: unknown key"):
        check_job(tiny("widthnet:build", data={"extra": 1}), local_paths=False)
    (tmp_path / "badschema_schema.py").write_text("SCHEMA = {'model_args': None}\n")
    with pytest.raises(ConfigError, match="badschema_schema.SCHEMA must be a hpctrain.config.plugin.ModelSchema"):
        check_job(tiny("badschema:build"), local_paths=False)
    (tmp_path / "broken_schema.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="importing broken_schema failed: RuntimeError: boom"):
        find_schema("broken:build")


# Two warnings: a model plug-in without a schema, and no checkpoint before the end.
WARNED = """\
    name: warned
    model: somewhere_else.net:build
    train: {steps: 10, batch_per_rank: 2, lr: 0.1}
    checkpoint: {every_steps: 50}
    resources: {walltime: "00:05:00"}
    """


@pytest.mark.processes
@pytest.mark.usefixtures("isolated_home")
def test_submit_shows_preflight_warnings_once(tmp_path: Path) -> None:
    path = spec(tmp_path, WARNED)
    done = cli("submit", str(path), "--site", "local", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("hpctrain: warning:")]
    assert len(warnings) == 2, done.stderr  # once each, although the submission and its render both check
    assert "checked only when the ranks start" in warnings[0] and "checkpoint.every_steps (50)" in warnings[1]
    with pytest.warns(PreflightWarning, match="checked only"):
        warn(["model x: checked only when the ranks start"])


@pytest.mark.processes
@pytest.mark.usefixtures("isolated_home")
def test_a_python_api_warning_names_the_callers_line(tmp_path: Path) -> None:
    """``hpctrain.submit(...)`` in a script or notebook: its warnings point at that call, not at hpctrain's file."""
    import warnings

    import hpctrain

    path = spec(tmp_path, WARNED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        hpctrain.submit(path, "local", command=["true"], run_root=str(tmp_path / "runs"))
    found = [w for w in caught if issubclass(w.category, PreflightWarning)]
    assert len(found) == 2, [str(w.message) for w in caught]
    assert {(w.filename, w.lineno) for w in found} == {(__file__, line)}


@pytest.mark.processes
def test_ranks_refuse_at_start_with_the_same_message(tmp_path: Path) -> None:
    path = spec(tmp_path, """\
        name: deep
        model: resnet
        model_args: {channels: 0}
        train: {steps: 10, batch_per_rank: 2, lr: 0.1}
        """)
    done = cli("run", str(path), "--run-dir", str(tmp_path / "run"), "--backend", "none")
    assert done.returncode == 2, done.stderr
    assert (f"hpctrain: error: rank 0: {path}:3: model_args.channels: Input should be greater than or equal to 1"
            in done.stderr), done.stderr
    assert "Traceback" not in done.stderr


def test_json_output_lists_warnings(tmp_path: Path) -> None:
    path = spec(tmp_path, """\
        name: long-warmup
        model: resnet
        train: {steps: 10, batch_per_rank: 2, lr: 0.1, warmup: {kind: linear, steps: 20}}
        """)
    done = cli("jobs", "validate", str(path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["warnings"] == ["train.warmup lasts 20 steps, longer than train.steps (10): "
                                                   "the learning rate never reaches its peak"]


@pytest.mark.processes
def test_ffn_prepare_keeps_centres_a_whole_training_box_from_the_border(tmp_path: Path) -> None:
    """max_pred_moves loads fov + 2 x deltas x (moves + 1) per example: with the old default margin (fov // 2 +
    deltas) centres near the border made the ranks fail with "training box ... leaves the volume"."""
    import numpy as np

    path = spec(tmp_path, """\
        name: moves
        model: ffn
        model_args: {fov: 9, deltas: 2, fov_policy: max_pred_moves, fov_moves: 2}
        data:
          train: {synthetic: {shape: [26, 40, 40], seed: 1}}
          partitions: {min_size: 10}
        train: {steps: 10, batch_per_rank: 2, lr: 0.1}
        """)
    done = cli("ffn", "prepare", str(path), "--out", str(tmp_path / "prepared"))
    assert done.returncode == 0, done.stderr
    coords = np.load(tmp_path / "prepared" / "coordinates.npz")["coords"]
    assert len(coords) > 0
    assert coords.min() >= 10 and (coords <= np.array([26, 40, 40]) - 11).all()  # box 21: half 10 each side
