"""End-to-end tests of ``hpctrain run``: real ranks under the MPICH wheel's mpiexec and the local launcher (gloo).

The model is ``tests.mp_helpers.trainer_models:logged``, a tiny MLP (or conv + linear) on synthetic regression
whose task logs a SHA-256 of every rank's parameters after each step: an independent record beside the
trainer's own ``--check-sync``. The single-process reference runs in this process with the same spec and
``batch_per_rank`` times the world size; ShardedIndexStream deals a global permutation round-robin, so step s
of W ranks x b covers exactly the positions [s*W*b, (s+1)*W*b) a single process takes at batch W*b.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hpctrain.models.task import ShardedIndexStream
from tests.mp_helpers.trainer_models import tiny

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
MPIEXEC = VENV_BIN / "mpiexec"
FALLBACK_PREFIX = "intel-extension-for-pytorch not in use: "
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                    "PALS_RANKID", "ALPS_APP_PE", "OMPI_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID", "HPCTRAIN_LAUNCHER")

BATCH = 4
STEPS = 6
LR = 0.01


# ------------------------------------------------------------------------------------------------ helpers


def make_spec(path: Path, log_dir: Path, *, batch: int = BATCH, steps: int = STEPS, conv: bool = False,
              **train: Any) -> Path:
    """A job spec for the logging tiny model; ``train`` entries override the train section."""
    spec = {
        "name": path.stem,
        "model": "tests.mp_helpers.trainer_models:logged",
        "model_args": {"log_dir": str(log_dir), "conv": conv, "batch_per_rank": batch, "seed": 0},
        "train": {"steps": steps, "batch_per_rank": batch, "lr": LR, "optimizer": {"name": "sgd"},
                  "lr_scaling": "none", "log_every": 2, "collective_timeout_s": 20, "seed": 0, **train},
        "checkpoint": {"every_steps": 1000},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def rank_command(launcher: str, nprocs: int, spec: Path, run_dir: Path, *extra: str) -> list[str]:
    run = [sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(run_dir), *extra]
    if launcher == "mpi":
        return [str(MPIEXEC), "-n", str(nprocs), *run, "--backend", "mpi"]
    return [sys.executable, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", str(nprocs), "--",
            *run, "--backend", "gloo"]


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("HPCTRAIN_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **(extra or {}))
    return env


def launch(launcher: str, nprocs: int, spec: Path, run_dir: Path, *extra: str,
           env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``hpctrain run`` on ``nprocs`` ranks; stdout and stderr together in ``.stdout``."""
    return subprocess.run(rank_command(launcher, nprocs, spec, run_dir, *extra), cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=rank_environment(env), timeout=timeout)


def digests(log_dir: Path, nprocs: int) -> list[list[str]]:
    """Per rank, the parameter digest after each step."""
    out = []
    for r in range(nprocs):
        records = [json.loads(line) for line in (log_dir / f"rank-{r}.jsonl").read_text().splitlines()]
        assert [rec["step"] for rec in records] == list(range(1, len(records) + 1))
        out.append([rec["digest"] for rec in records])
    return out


def checkpoint(run_dir: Path, step: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(shared.pt, [rank-0000N.pt ...]) of the checkpoint at ``step``, checked against its manifest (rank states
    come out of their node's file under the per-node layout)."""
    from hpctrain.checkpoint.store import CheckpointStore
    from tests.checkpoint_support import load_files

    entry = next(c for c in CheckpointStore(run_dir / "checkpoints").checkpoints() if c.step == step)
    files = load_files(entry)
    return files["shared.pt"], [files[name] for name in sorted(files) if name.startswith("rank-")]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_close_models(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float,
                        atol: float) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


_REFERENCES: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}


def single_process(tmp_path: Path, world: int, *, lr: float = LR, conv: bool = False,
                   **train: Any) -> dict[str, torch.Tensor]:
    """Final parameters of a 1-rank run (in this process) at batch ``BATCH * world``, otherwise the same spec."""
    key = (world, lr, conv, json.dumps(train, sort_keys=True))
    if key not in _REFERENCES:
        from hpctrain.config.job import load_job
        from hpctrain.runtime.trainer import train as run_training

        base = tmp_path / f"reference-{world}"
        base.mkdir()
        spec = make_spec(base / "spec.yaml", base / "log", batch=BATCH * world, conv=conv, lr=lr, **train)
        saved = {k: os.environ.pop(k) for k in LAUNCH_VARIABLES if k in os.environ}
        threads = torch.get_num_threads()
        try:
            outcome = run_training(load_job(spec), base / "run", backend="none", environ={})
        finally:
            os.environ.update(saved)
            torch.set_num_threads(threads)
        assert outcome.end_step == STEPS
        shared, _ = checkpoint(base / "run", STEPS)
        _REFERENCES[key] = shared["model"]
    return _REFERENCES[key]


def full_data_loss(state: dict[str, torch.Tensor]) -> float:
    """MSE of the tiny MLP with ``state`` over the whole synthetic training set (seed 0, 512 samples)."""
    from hpctrain.models.registry import SyntheticRegressionTask
    from hpctrain.models.task import TaskContext

    model = tiny()
    model.load_state_dict(state)
    ctx = TaskContext(model_args={}, data={"synthetic": {"input_shape": [6], "outputs": 2, "samples": 512}},
                      batch_per_rank=BATCH, seed=0, rank=0, world_size=1, run_dir=Path("."),
                      device=torch.device("cpu"))
    task = SyntheticRegressionTask(model, ctx)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(task.inputs), task.targets))


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "parameter checksum" in proc.stdout, proc.stdout[-4000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-4000:]


# ------------------------------------------------------------------------------------------------ tests


def test_round_robin_dealing_matches_one_rank_at_the_concatenated_batch() -> None:
    """The premise of the single-process comparison, over several epochs: the same samples per step."""
    world, b, count = 3, 4, 50
    one = ShardedIndexStream(count, world * b, 0, 1, seed=7)
    ranks = [ShardedIndexStream(count, b, r, world, seed=7) for r in range(world)]
    for _ in range(13):  # 50 // 12 = 4 steps per epoch: crosses three epoch boundaries
        together = torch.cat([s.next() for s in ranks])
        assert len(set(together.tolist())) == world * b
        assert sorted(together.tolist()) == sorted(one.next().tolist())


MEAN_CASES = [
    pytest.param("mpi", 2, {}, id="mpi-2", marks=pytest.mark.mpi),
    pytest.param("mpi", 4, {"lr_scaling": "sqrt", "warmup": {"kind": "linear", "steps": 2}}, id="mpi-4-sqrt",
                 marks=[pytest.mark.mpi, pytest.mark.slow]),
    pytest.param("gloo", 3, {}, id="gloo-3-intel"),
]


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("launcher", "nprocs", "train"), MEAN_CASES)
def test_mean_keeps_ranks_identical_and_equals_one_rank_on_the_concatenated_batch(
    tmp_path: Path, launcher: str, nprocs: int, train: dict[str, Any]
) -> None:
    intel = launcher == "gloo"  # the IPEX fallback rides along: it must not change training
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", **train)
    proc = launch(launcher, nprocs, spec, tmp_path / "run", "--check-sync", "1",
                  env={"HPCTRAIN_INTEL_EXTENSION": "1"} if intel else None)
    assert_ok(proc)

    per_rank = digests(tmp_path / "log", nprocs)
    assert all(len(d) == STEPS for d in per_rank)
    assert all(d == per_rank[0] for d in per_rank), "ranks' parameters differ after some step"
    assert len(set(per_rank[0])) == STEPS, "parameters did not change every step"

    shared, rank_files = checkpoint(tmp_path / "run", STEPS)
    assert len(rank_files) == nprocs and shared["world_size"] == nprocs
    # The same (no-momentum SGD, lr_scaling none) step on the concatenated batch; sqrt scaling on 4 ranks
    # is the single rank at twice the base LR.
    ref_train = dict(train)
    lr = LR
    if train.get("lr_scaling") == "sqrt":
        ref_train["lr_scaling"], lr = "none", LR * 2
        records = [r for r in metrics(tmp_path / "run") if "lr" in r]
        after_warmup = [r["lr"] for r in records if r["step"] > 2]
        assert after_warmup and all(v == pytest.approx(2 * LR, rel=1e-12) for v in after_warmup)
    reference = single_process(tmp_path, nprocs, lr=lr, **ref_train)
    assert_close_models(shared["model"], reference, rtol=1e-5, atol=1e-6)
    assert not torch.equal(shared["model"]["0.weight"], single_process(tmp_path, 1)["0.weight"])

    fallback_lines = [line for line in proc.stdout.splitlines() if FALLBACK_PREFIX in line]
    if intel:
        assert len(fallback_lines) == 1, proc.stdout[-3000:]
        assert fallback_lines[0].startswith("[rank 0] ")  # local launcher's prefix: rank 0 speaks for the job
        assert fallback_lines[0].endswith("; training continues with stock PyTorch")
    else:
        assert fallback_lines == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("launcher", "nprocs", "wire", "tol"), [
    pytest.param("mpi", 2, "fp16", 2e-3, id="mpi-2-fp16", marks=pytest.mark.mpi),
    pytest.param("gloo", 2, "bf16", 2e-2, id="gloo-2-bf16", marks=pytest.mark.slow),
])
def test_mean_with_half_precision_wire_stays_in_sync_and_near_full_precision(
    tmp_path: Path, launcher: str, nprocs: int, wire: str, tol: float
) -> None:
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", combiner={"name": "mean", "compression": wire})
    proc = launch(launcher, nprocs, spec, tmp_path / "run", "--check-sync", "1")
    assert_ok(proc)
    per_rank = digests(tmp_path / "log", nprocs)
    assert all(d == per_rank[0] for d in per_rank)
    shared, _ = checkpoint(tmp_path / "run", STEPS)
    reference = single_process(tmp_path, nprocs)
    assert_close_models(shared["model"], reference, rtol=tol, atol=tol)
    exact = all(torch.equal(shared["model"][k], reference[k]) for k in reference)
    assert not exact, f"{wire} on the wire left no trace at all: is compression applied?"


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_bfloat16_forward_keeps_ranks_identical_float32_weights_and_stays_near_float32(tmp_path: Path) -> None:
    """``train.precision: bfloat16``: the forward under autocast (the conv and linear layers in bfloat16), the
    weights, gradients and the reduction in float32; 2 MPI ranks stay identical after every step."""
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", conv=True, precision="bfloat16")
    proc = launch("mpi", 2, spec, tmp_path / "run", "--check-sync", "1")
    assert_ok(proc)
    assert "precision bfloat16: the forward runs in bfloat16 on cpu" in proc.stdout
    per_rank = digests(tmp_path / "log", 2)
    assert len(per_rank[0]) == STEPS and per_rank[0] == per_rank[1]
    shared, _ = checkpoint(tmp_path / "run", STEPS)
    assert all(t.dtype == torch.float32 for t in shared["model"].values())
    reference = single_process(tmp_path, 2, conv=True)
    assert_close_models(shared["model"], reference, rtol=2e-2, atol=2e-3)
    assert not all(torch.equal(shared["model"][k], reference[k]) for k in reference), \
        "bfloat16 left no trace: is the forward under autocast?"
    assert json.loads((tmp_path / "run" / "profile.json").read_text())["precision"] == "bfloat16"


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("launcher", "nprocs", "mode"), [
    pytest.param("mpi", 3, "gradient", id="mpi-3-gradient", marks=pytest.mark.mpi),
    pytest.param("gloo", 2, "delta", id="gloo-2-delta"),
])
def test_adasum_trains_and_keeps_ranks_identical(tmp_path: Path, launcher: str, nprocs: int, mode: str) -> None:
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", steps=STEPS,
                     optimizer={"name": "sgd", "momentum": 0.9}, combiner={"name": "adasum", "adasum_on": mode})
    proc = launch(launcher, nprocs, spec, tmp_path / "run", "--check-sync", "1")
    assert_ok(proc)
    per_rank = digests(tmp_path / "log", nprocs)
    assert all(d == per_rank[0] for d in per_rank), f"adasum ({mode}) ranks diverged"
    assert len(set(per_rank[0])) == STEPS
    shared, rank_files = checkpoint(tmp_path / "run", STEPS)
    if mode == "delta":  # per-rank optimizer state (momentum of the local gradients) is saved per rank
        models = [f["model"] for f in rank_files]
        for m in models[1:]:
            assert all(torch.equal(m[k], models[0][k]) for k in m)
        buffers = [f["optimizer"]["state"][0]["momentum_buffer"] for f in rank_files]
        assert not torch.equal(buffers[0], buffers[1]), "local momentum should differ between ranks"
    start = full_data_loss(tiny().state_dict())
    assert full_data_loss(shared["model"]) < 0.9 * start, "adasum did not train"


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_adacomp_keeps_ranks_identical_and_reports_compression_per_layer_kind(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", conv=True, combiner={"name": "adacomp"})
    proc = launch("mpi", 2, spec, tmp_path / "run", "--check-sync", "1")
    assert_ok(proc)
    per_rank = digests(tmp_path / "log", 2)
    assert per_rank[0] == per_rank[1]
    records = [r for r in metrics(tmp_path / "run") if "loss" in r]
    assert len(records) == STEPS // 2
    for r in records:
        # conv.weight (36 values, bins of 50) and the linear head (256x2, bins of 500) each send a few
        # elements at 4 bytes (one signed int32 position) plus an 8-byte scale per layer, for 4 bytes each dense.
        assert 1.0 < r["adacomp_ratio_conv"] <= 36 * 4 / (4 + 8), r
        assert 4.0 < r["adacomp_ratio_linear"] <= 514 * 4 / (4 + 8), r
    shared, rank_files = checkpoint(tmp_path / "run", STEPS)
    residues = [f["exchange"]["residues"] for f in rank_files]
    assert any(not torch.equal(a, b) for a, b in zip(residues[0][0], residues[1][0], strict=True)), \
        "each rank keeps its own AdaComp residue"


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_dasgd_ranks_differ_between_averages_and_agree_at_the_end(tmp_path: Path) -> None:
    steps = 7  # not a multiple of the period: the last merged average leaves local progress on each rank
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", steps=steps,
                     combiner={"name": "dasgd", "period": 2, "delay": 1})
    proc = launch("gloo", 2, spec, tmp_path / "run", "--check-sync", "1")
    assert_ok(proc)
    per_rank = digests(tmp_path / "log", 2)
    differing = [s + 1 for s in range(steps) if per_rank[0][s] != per_rank[1][s]]
    assert 1 in differing and 3 in differing, differing  # local steps, no average merged yet / since
    shared, rank_files = checkpoint(tmp_path / "run", steps)
    models = [f["model"] for f in rank_files]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0]), "ranks differ after the final flush"
    checksums = re.findall(r"parameter checksum (\S+)", proc.stdout)
    assert len(checksums) == 1
    assert float(checksums[0]) == pytest.approx(float(sum(t.double().sum() for t in models[0].values())),
                                                rel=1e-9)


def _wait_for_pid(log: Path, timeout: float = 300) -> int:  # a hang guard
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists():
            lines = log.read_text().splitlines()
            if len(lines) >= 2:
                return int(json.loads(lines[0])["pid"])
        time.sleep(0.2)
    raise AssertionError(f"{log} shows no training steps after {timeout} s")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_a_killed_rank_ends_the_job_non_zero_naming_it(tmp_path: Path, launcher: str) -> None:
    spec = make_spec(tmp_path / "spec.yaml", tmp_path / "log", steps=10**6, log_every=10**5,
                     collective_timeout_s=20)
    proc = subprocess.Popen(rank_command(launcher, 2, spec, tmp_path / "run"), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=rank_environment(), start_new_session=True)
    try:
        victim = _wait_for_pid(tmp_path / "log" / "rank-1.jsonl")
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)  # a hang guard: the surviving rank would train for ever
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, out[-3000:]
    if launcher == "gloo":
        assert "hpctrain local launcher: rank 1 killed by SIGKILL" in out, out[-3000:]
    else:
        # MPICH's hydra names a process by PID and the signal, and hpctrain's start-up line maps PIDs to ranks.
        # Hydra names the first abnormal exit it reaps: the killed rank, or, when both have exited by the time
        # it looks (a loaded machine), the survivor it has just killed itself, also with signal 9.
        named = re.search(r"PID (\d+) RUNNING AT", out)
        assert "BAD TERMINATION" in out and named, out[-3000:]
        assert int(named.group(1)) in (victim, _wait_for_pid(tmp_path / "log" / "rank-0.jsonl")), out[-3000:]
        assert "Killed (signal 9)" in out, out[-3000:]


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_an_unknown_model_is_one_readable_error_on_every_rank(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "bad", "model": "no_such_model",
                                    "train": {"steps": 2, "batch_per_rank": 2, "lr": 0.1,
                                              "collective_timeout_s": 20}}))
    proc = launch("mpi", 2, spec, tmp_path / "run", timeout=90)
    assert proc.returncode != 0
    errors = [line for line in proc.stdout.splitlines() if line.startswith("hpctrain: error:")]
    assert errors, proc.stdout
    for line in errors:
        # the ranks check the spec before anything else, naming the spec's line
        assert re.fullmatch(rf"hpctrain: error: rank [01]: {re.escape(str(spec))}:\d+: model: unknown model "
                            r"'no_such_model'; use one of .*", line), line
    assert "Traceback" not in proc.stdout


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_missing_ffn_volume_is_a_data_error_without_a_hang(tmp_path: Path) -> None:
    from hpctrain.errors import DataError

    missing = tmp_path / "absent" / "volume.h5"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "ffn-missing", "model": "ffn",
        "model_args": {"depth": 1, "features": 4, "fov": [9, 9, 9], "deltas": [2, 2, 2]},
        "data": {"train": {"image": f"{missing}:image", "labels": f"{missing}:labels"}},
        "train": {"steps": 2, "batch_per_rank": 2, "lr": 0.1, "collective_timeout_s": 20}}))
    proc = launch("mpi", 2, spec, tmp_path / "run", timeout=90)
    assert proc.returncode == DataError.exit_code, proc.stdout
    assert f"data.train.image: {missing} does not exist" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout


# ------------------------------------------------------------------------------------------------ IPEX, in process


def test_intel_extension_is_wanted_only_when_the_site_says_so() -> None:
    from hpctrain.runtime.intel import wanted_from_env

    assert wanted_from_env({"HPCTRAIN_INTEL_EXTENSION": "1"}) and wanted_from_env({"HPCTRAIN_INTEL_EXTENSION": "yes"})
    assert not wanted_from_env({}) and not wanted_from_env({"HPCTRAIN_INTEL_EXTENSION": "0"})


def test_intel_extension_fallback_logs_one_line_and_keeps_the_objects(caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.runtime.intel import maybe_optimize

    # As on an Intel CPU with a matching IPEX recorded as installed: the import is what fails here.
    monkeypatch.setattr("hpctrain.runtime.intel.ipex_refusal", lambda device: None)

    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("INFO", logger="hpctrain.intel"):
        got = maybe_optimize(model, optimizer, wanted=False, device=torch.device("cpu"))
        assert got == (model, optimizer, False) and caplog.records == []
        got = maybe_optimize(model, optimizer, wanted=True, device=torch.device("cpu"), announce=False)
        assert got == (model, optimizer, False) and caplog.records == []
        got = maybe_optimize(model, optimizer, wanted=True, device=torch.device("cpu"))
    assert got == (model, optimizer, False)
    assert [r.getMessage() for r in caplog.records] == [
        "intel-extension-for-pytorch not in use: cannot import it (ModuleNotFoundError: No module named "
        "'intel_extension_for_pytorch'); training continues with stock PyTorch"]


def test_intel_extension_optimize_is_called_in_place_when_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """IPEX cannot import beside torch 2.13, so a stand-in module checks only the call we make."""
    import types

    from hpctrain.runtime.intel import maybe_optimize

    calls: list[dict[str, Any]] = []

    def optimize(model: torch.nn.Module, **kwargs: Any) -> tuple[torch.nn.Module, Any]:
        calls.append(kwargs)
        return model, kwargs["optimizer"]

    monkeypatch.setattr("hpctrain.runtime.intel.ipex_refusal", lambda device: None)  # as on an Intel CPU
    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch",
                        types.SimpleNamespace(optimize=optimize, __version__="stand-in"))
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert maybe_optimize(model, optimizer, wanted=True, device=torch.device("cpu")) == (model, optimizer, True)
    assert calls == [{"optimizer": optimizer, "inplace": True}]

    def broken(model: torch.nn.Module, **kwargs: Any) -> None:
        raise RuntimeError("unsupported layer\nmore")

    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch", types.SimpleNamespace(optimize=broken))
    assert maybe_optimize(model, optimizer, wanted=True, device=torch.device("cpu")) == (model, optimizer, False)


def test_a_finished_run_s_last_metrics_record_keeps_its_training_loss(tmp_path: Path) -> None:
    """The final record (held-out scores) is the last line status reads: it carries the last training loss and
    rate, so a completed run's progress shows them (not loss None)."""
    from hpctrain.config.job import load_job
    from hpctrain.runtime.trainer import train as run_training
    from hpctrain.submission.views import progress_from_record

    job = load_job(REPO / "jobs/resnet-local.yaml", sets=["train.steps=4", "train.log_every=2", "train.warmup.steps=1",
                                                          "model_args.channels=4", "model_args.blocks=1"])
    saved = {k: os.environ.pop(k) for k in LAUNCH_VARIABLES if k in os.environ}
    threads = torch.get_num_threads()
    try:
        outcome = run_training(job, tmp_path / "run", backend="none", environ={})
    finally:
        os.environ.update(saved)
        torch.set_num_threads(threads)
    records = metrics(tmp_path / "run")
    last, logged = records[-1], records[-2]
    assert last.get("final") is True and outcome.final and "test_accuracy" in last
    assert last["loss"] == logged["loss"] and last["per_rank_rate"] == logged["per_rank_rate"]
    progress = progress_from_record(last, job.train.steps)
    assert progress is not None and progress.loss == logged["loss"] and progress.step == 4
    assert "loss " in progress.text()
