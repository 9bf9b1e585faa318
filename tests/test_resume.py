"""Exact and elastic resume through ``hpctrain run``, checkpoint failures at the training level, async saves.

Ranks are real processes (the local launcher with gloo, the MPICH wheel's mpiexec). A run is interrupted the
way a walltime signal does it, through the test hook ``HPCTRAIN_STOP_AT_STEP`` (the session raises its stop
flag after that step), so the spec (and its cosine decay length) is the same for both runs. Exactness is
checked on every tensor of the final checkpoint: shared model and optimizer, and each rank's file (its model
and optimizer where ranks differ, AdaComp residues, DaSGD state), with ``torch.equal``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.checkpoint.store_write import snapshot
from hpctrain.errors import CheckpointError
from hpctrain.exit_codes import REQUEUE_MARKER
from hpctrain.models.task import ShardedIndexStream
from hpctrain.runtime.combine import DelayedAverager
from tests.checkpoint_support import load_files

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
STEPS = 8
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                    "OMPI_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID")

COMBINERS: dict[str, dict[str, Any]] = {
    "mean": {"name": "mean"},
    "adasum-gradient": {"name": "adasum", "adasum_on": "gradient"},
    "adasum-delta": {"name": "adasum", "adasum_on": "delta"},
    "adacomp": {"name": "adacomp", "bin_len": {"conv": 4, "linear": 4, "other": 4}},
    "dasgd": {"name": "dasgd", "period": 3, "delay": 2},  # sent after step 3, merged after step 5
}

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ helpers


def make_spec(path: Path, combiner: dict[str, Any], *, ckpt_dir: str = "checkpoints") -> Path:
    spec = {
        "name": "resume",
        "model": "tests.mp_helpers.trainer_models:tiny",
        "model_args": {"seed": 0},
        "data": {"synthetic": {"input_shape": [6], "outputs": 2, "samples": 40}},  # 40 samples: epochs turn over
        "train": {"steps": STEPS, "batch_per_rank": 4, "lr": 0.05, "lr_scaling": "sqrt",
                  "optimizer": {"name": "sgd", "momentum": 0.9}, "decay": {"kind": "cosine"},
                  "combiner": combiner, "log_every": 4, "collective_timeout_s": 30, "seed": 3},
        "checkpoint": {"every_steps": 2, "keep": 3, "dir": ckpt_dir},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


# A guard against a hung run, not a speed check: a run takes ~10 s here, but during a load spike on this
# shared 2-core machine (load average 66) one took longer than the 150 s this used to be.
RUN_TIMEOUT_S = 400
# Tests that start up to three runs (the reference once per combiner, the stopped run, the resumed run).
THREE_RUNS = pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)


def launch(spec: Path, run_dir: Path, *, nprocs: int = 2, launcher: str = "gloo", stop_at: int | None = None,
           timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(run_dir)]
    if launcher == "mpi":
        argv = [str(VENV_BIN / "mpiexec"), "-n", str(nprocs), *run, "--backend", "mpi"]
    else:
        argv = [sys.executable, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", str(nprocs), "--",
                *run, "--backend", "gloo"]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("HPCTRAIN_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if stop_at is not None:
        env["HPCTRAIN_STOP_AT_STEP"] = str(stop_at)
    return subprocess.run(argv, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env, timeout=timeout)


def finished(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"training finished at step {STEPS}" in proc.stdout, proc.stdout[-4000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-4000:]
    return proc.stdout


def stopped(proc: subprocess.CompletedProcess[str], step: int) -> None:
    assert proc.returncode == 75, proc.stdout[-4000:]
    assert f"stopped at step {step} after a checkpoint" in proc.stdout, proc.stdout[-4000:]


def final_state(run_dir: Path, step: int = STEPS, ckpt: str = "checkpoints") -> dict[str, Any]:
    """Every file of checkpoint ``step`` (loaded), keyed by name, after checking it is in the manifest."""
    store = CheckpointStore(run_dir / ckpt if not Path(ckpt).is_absolute() else Path(ckpt))
    entry = next(c for c in store.checkpoints() if c.step == step)
    return load_files(entry)  # a node file's rank states under their rank-RRRRR.pt names


def assert_bit_identical(got: Any, want: Any, where: str = "") -> int:
    """Recursively compare two loaded states; tensors with torch.equal (bitwise for floats). Returns #tensors."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), where
        return 1
    if isinstance(want, dict):
        assert set(got) == set(want), f"{where}: keys {sorted(map(str, got))} != {sorted(map(str, want))}"
        return sum(assert_bit_identical(got[k], want[k], f"{where}.{k}") for k in want)
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        return sum(assert_bit_identical(g, w, f"{where}[{i}]") for i, (g, w) in enumerate(zip(got, want, strict=True)))
    assert got == want, f"{where}: {got!r} != {want!r}"
    return 0


def comparable(files: dict[str, Any]) -> dict[str, Any]:
    """What must match bit for bit: everything in every file, torch's RNG state included. Python's and
    NumPy's global generators are left out: nothing seeds them, so they start from OS entropy in every process
    (the uninterrupted run's too); training draws nothing from them, and resume restores them all the same."""
    out: dict[str, Any] = {}
    for name, state in files.items():
        out[name] = dict(state)
        if "rng" in state:
            out[name]["rng"] = {k: v for k, v in state["rng"].items() if k not in ("python", "numpy")}
    return out


_REFERENCE: dict[str, dict[str, Any]] = {}


def reference(tmp_path_factory: pytest.TempPathFactory, combiner: str) -> dict[str, Any]:
    """Final checkpoint of an uninterrupted 2-rank gloo run (once per combiner per session)."""
    if combiner not in _REFERENCE:
        base = tmp_path_factory.mktemp(f"ref-{combiner}")
        finished(launch(make_spec(base / "spec.yaml", COMBINERS[combiner]), base / "run"))
        _REFERENCE[combiner] = comparable(final_state(base / "run"))
    return _REFERENCE[combiner]


# ------------------------------------------------------------------------------------ exact resume (2 ranks)


@pytest.mark.slow
@THREE_RUNS
@pytest.mark.parametrize("combiner,stop_at", [("mean", 5), ("adasum-gradient", 3), ("adasum-delta", 5),
                                              ("adacomp", 4), ("dasgd", 4)])
def test_stopped_and_resumed_run_is_bit_identical(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                  combiner: str, stop_at: int) -> None:
    spec = make_spec(tmp_path / "spec.yaml", COMBINERS[combiner])
    stopped(launch(spec, tmp_path / "run", stop_at=stop_at), stop_at)
    store = CheckpointStore(tmp_path / "run" / "checkpoints")
    assert store.checkpoints()[-1].step == stop_at  # the stop committed its checkpoint before exiting
    marker = tmp_path / "run" / REQUEUE_MARKER  # for the batch script when the launcher reports a signal
    assert json.loads(marker.read_text())["step"] == stop_at
    out = finished(launch(spec, tmp_path / "run"))
    assert not marker.exists()  # an attempt that finishes leaves no requeue request behind
    assert f"(step {stop_at})" in out and "resumed from" in out
    got, want = comparable(final_state(tmp_path / "run")), reference(tmp_path_factory, combiner)
    assert got.keys() == want.keys() and len(got) == 3  # shared.pt and both ranks' files
    assert assert_bit_identical(got, want) > 0
    if combiner == "adacomp":  # the residues are really state: non-zero and restored per rank
        residues = [t for r in ("rank-00000.pt", "rank-00001.pt") for b in got[r]["exchange"]["residues"] for t in b]
        assert any(bool(t.abs().sum() > 0) for t in residues)
    if combiner == "dasgd":
        stored = final_state(tmp_path / "run", step=4)["rank-00001.pt"]
        assert stored["exchange"]["dasgd"]["in_flight"]["sent_at"] == 3  # saved in flight, not merged early


@pytest.mark.slow
@pytest.mark.mpi
@THREE_RUNS
def test_dasgd_resume_is_bit_identical_under_mpiexec(tmp_path: Path,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """DaSGD (the combiner with an average in flight at the stop) on MPI: same bits as the gloo reference."""
    spec = make_spec(tmp_path / "spec.yaml", COMBINERS["dasgd"])
    ref = tmp_path / "ref"
    finished(launch(spec, ref, launcher="mpi"))
    stopped(launch(spec, tmp_path / "run", launcher="mpi", stop_at=4), 4)
    finished(launch(spec, tmp_path / "run", launcher="mpi"))
    assert assert_bit_identical(comparable(final_state(tmp_path / "run")), comparable(final_state(ref))) > 0


# ---------------------------------------------------------------------------------------- elastic restart


@pytest.mark.slow
def test_elastic_restart_from_two_ranks_on_one_warns_and_finishes(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "spec.yaml", COMBINERS["mean"])
    stopped(launch(spec, tmp_path / "run", stop_at=3), 3)
    out = finished(launch(spec, tmp_path / "run", nprocs=1))
    warnings = [line for line in out.splitlines() if "not be bit-identical" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and "on 1 ranks from a checkpoint of 2" in warnings[0]
    files = final_state(tmp_path / "run")
    assert set(files) == {"shared.pt", "rank-00000.pt"}
    # 3 steps x 2 ranks x 4 = 24 of the 40-sample epoch were consumed; the one rank took the other 16 in
    # steps 4-7 and began epoch 1 at step 8
    assert files["shared.pt"]["task"]["stream"] == {"epoch": 1, "offset": 4, "skip": 0, "world": 1}
    assert files["shared.pt"]["schedule"]["world_size"] == 1


def test_stream_reshards_the_rest_of_the_epoch_without_repeats() -> None:
    two = [ShardedIndexStream(50, 4, r, 2, seed=1) for r in range(2)]
    seen = [int(i) for _ in range(3) for s in two for i in s.next()]
    three = [ShardedIndexStream(50, 4, r, 3, seed=1) for r in range(3)]
    for s in three:
        s.load_state_dict(two[0].state_dict())
    assert three[0].position == 24 and three[0].epoch == 0
    while three[0].epoch == 0:
        batches = [s.next() for s in three]
        if three[0].epoch == 0:
            seen += [int(i) for b in batches for i in b]
    assert len(seen) == len(set(seen)) == 24 + 24  # 26 left, cut to whole steps of 12
    same = ShardedIndexStream(50, 4, 1, 2, seed=1)
    same.load_state_dict(two[1].state_dict())
    assert torch.equal(same.next(), two[1].next())  # same world: exactly where it was


def test_ffn_position_keeps_epoch_and_fraction_on_another_world_size() -> None:
    from hpctrain.ffn.training.task import resharded_start

    assert resharded_start(consumed=150, count=400, old_world=2, new_world=4) == 75  # epoch 0, 3/4 done
    assert resharded_start(consumed=250, count=400, old_world=2, new_world=1) == 400 + 100  # epoch 1, 1/4 done


# ------------------------------------------------------------------------------- failures at the run level


@pytest.mark.slow
def test_corrupt_or_truncated_newest_checkpoint_falls_back_with_one_warning(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = make_spec(tmp_path / "spec.yaml", COMBINERS["mean"])
    stopped(launch(spec, tmp_path / "first", stop_at=4), 4)
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    shared = tmp_path / "first" / "checkpoints" / "step-00000004" / "shared.pt"
    data = bytearray(shared.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one byte
    shared.write_bytes(bytes(data))
    ranks = tmp_path / "second" / "checkpoints" / "step-00000004" / "node-00000.pt"  # both ranks' states
    ranks.write_bytes(ranks.read_bytes()[:-100])
    for name, why in (("first", "is corrupt"), ("second", "truncated")):
        out = finished(launch(spec, tmp_path / name))
        warnings = [line for line in out.splitlines() if "skipped" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], out[-3000:]
        assert why in warnings[0] and "step 4 skipped" in warnings[0] and "resuming from step 2" in warnings[0]
        # resumed from step 2 of the same timeline: still bit-identical to the uninterrupted run
        assert assert_bit_identical(comparable(final_state(tmp_path / name)), reference(tmp_path_factory, "mean"))


@pytest.fixture
def readonly_mount(tmp_path: Path) -> Any:
    """A real tmpfs, made read-only on request (needs root and mount)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a read-only tmpfs")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")

    def make_read_only() -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)

    yield mnt, make_read_only
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_read_only_checkpoint_directory_fails_on_every_rank_and_keeps_the_previous(
        tmp_path: Path, readonly_mount: Any) -> None:
    mnt, make_read_only = readonly_mount
    spec = make_spec(tmp_path / "spec.yaml", COMBINERS["mean"], ckpt_dir=str(mnt / "ckpt"))
    stopped(launch(spec, tmp_path / "run", stop_at=3), 3)
    make_read_only()
    proc = launch(spec, tmp_path / "run", timeout=90)
    assert proc.returncode not in (0, 75), proc.stdout[-4000:]
    errors = [line for line in proc.stdout.splitlines() if "hpctrain: error:" in line]
    assert errors, proc.stdout[-4000:]
    assert all(str(mnt / "ckpt") in line and "Read-only file system" in line for line in errors), errors
    assert any("previous checkpoint (step 3) is intact" in line for line in errors), errors
    assert "Traceback" not in proc.stdout
    kept = CheckpointStore(mnt / "ckpt", world_size=1).latest_valid(verify=True)
    assert kept is not None and kept.step == 3


# -------------------------------------------------------------------------- asynchronous saves (in process)


def test_save_async_snapshots_now_and_commits_only_on_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "c", keep=2)
    weight = torch.arange(1000, dtype=torch.float32)
    state = {"model": {"w": weight}, "step": 5}
    pending = store.save_async(5, state, per_rank={"rng": torch.tensor([1, 2, 3])})
    weight.add_(1.0)  # training goes on while the file is written
    pending.wait()
    assert store.latest_valid() is None  # written but not committed: it does not count yet
    store.commit(pending)
    ckpt = store.latest_valid()
    assert ckpt is not None and ckpt.step == 5
    shared, mine = store.load(ckpt)
    assert torch.equal(shared["model"]["w"], torch.arange(1000, dtype=torch.float32))
    assert torch.equal(mine["rng"], torch.tensor([1, 2, 3]))


def test_save_async_failure_is_raised_at_commit_and_keeps_the_previous(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "c", keep=2)
    store.save(1, {"model": {"w": torch.ones(3)}})
    (tmp_path / "c" / "step-00000002").write_text("a file where the step directory goes")
    pending = store.save_async(2, {"model": {"w": torch.zeros(3)}})
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint step 2 .*previous checkpoint \(step 1\)"):
        store.commit(pending)
    ckpt = store.latest_valid()
    assert ckpt is not None and ckpt.step == 1


def test_snapshot_copies_tensors_keeps_sharing_and_state_dict_metadata() -> None:
    model = torch.nn.Linear(3, 2)
    sd = model.state_dict()
    tied = torch.ones(4)
    copy = snapshot({"model": sd, "a": tied, "b": [tied, 7, "x"], "c": None})
    assert copy["a"] is copy["b"][0] and copy["a"] is not tied
    assert copy["model"]._metadata == sd._metadata and type(copy["model"]) is type(sd)
    with torch.no_grad():
        model.weight.zero_()
    assert not torch.equal(copy["model"]["weight"], model.weight)


class _Handle:
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors, self.waits = tensors, 0

    def wait(self) -> list[torch.Tensor]:
        self.waits += 1
        return [t * 0.5 for t in self.tensors]  # a stand-in average


def _dasgd_run(steps: int, save_at: int | None) -> torch.Tensor:
    p = torch.zeros(3)
    av = DelayedAverager(lambda ts: _Handle(ts), period=3, delay=2)
    for s in range(1, steps + 1):
        p.add_(float(s))
        av.after_step([p])
        if s == save_at:
            state = av.state_dict(include_in_flight=True)
            av = DelayedAverager(lambda ts: _Handle(ts), period=3, delay=2)  # a new process after resume
            av.load_state_dict(state)
    av.flush([p])
    return p


def test_delayed_averager_in_flight_state_resumes_the_same_trajectory() -> None:
    straight = _dasgd_run(10, None)
    for save_at in range(1, 10):
        assert torch.equal(_dasgd_run(10, save_at), straight), save_at
    av = DelayedAverager(lambda ts: _Handle(ts), period=1, delay=1)
    av.after_step([torch.ones(2)])
    with pytest.raises(Exception, match="flush"):
        av.state_dict()  # without include_in_flight an average in flight is still refused


def test_background_prune_never_deletes_a_later_save(tmp_path: Path) -> None:
    """The commit of an async save prunes in the writer thread; a save made meanwhile must survive it."""
    import threading

    from hpctrain.checkpoint.hashed_write import writer_pool

    store = CheckpointStore(tmp_path / "c", keep=1)
    store.save(1, {"model": {"w": torch.ones(2)}})
    pending = store.save_async(2, {"model": {"w": torch.full((2,), 2.0)}})
    pending.wait()
    gate = threading.Event()
    writer_pool().submit(gate.wait, 30)  # hold the writer so the prune queued by this commit runs late
    store.commit(pending)
    store.save(3, {"model": {"w": torch.full((2,), 3.0)}})  # synchronous, written while the prune waits
    gate.set()
    writer_pool().submit(lambda: None).result()  # the queued prune has run
    assert sorted(p.name for p in (tmp_path / "c").glob("step-*")) == ["step-00000003"]
    ckpt = store.latest_valid()
    assert ckpt is not None and ckpt.step == 3
