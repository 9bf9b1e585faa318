"""CheckpointStore and RNG capture against real files, real torch and real failures.

Disk full and read-only use a real tmpfs (``mount -t tmpfs -o size=1m``, ``mount -o remount,ro``): we run as
root, for whom chmod 0555 does not stop writes. Where mount is not allowed those tests skip; a separate test
makes ``os.fsync`` fail with EIO (monkeypatched) to cover an error after all bytes were written.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.checkpoint.manifest import MANIFEST, MARKER, SHARED, file_digest, rank_filename, step_dirname
from hpctrain.checkpoint.rng import capture_rng_state, restore_rng_state
from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.errors import CheckpointError

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


def _model_state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": seed, "lr": 1e-3}


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)  # type: ignore[arg-type]
        for x, y in zip(a, b, strict=True):  # type: ignore[call-overload]
            _assert_same(x, y)
    else:
        assert a == b


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hpctrain.checkpoint" and r.levelno == logging.WARNING]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs not allowed here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# ---------------------------------------------------------------------------------------- round trip


def test_round_trip_and_manifest(tmp_path: Path) -> None:
    s = CheckpointStore(tmp_path, keep=3)
    state = _model_state(7)
    per_rank = {"rng": capture_rng_state(), "data_position": 123, "residues": [torch.randn(5)]}
    path = s.save(1200, state, per_rank=per_rank)
    assert path == tmp_path / "step-00001200"
    assert sorted(p.name for p in path.iterdir()) == sorted([SHARED, rank_filename(0), MARKER])
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]

    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (entry,) = manifest["checkpoints"]
    assert entry["step"] == 1200 and entry["world_size"] == 1 and entry["checksum"] == "sha256"
    for f in entry["files"]:
        size, digest = file_digest(path / f["name"], "sha256")
        assert (size, digest) == (f["bytes"], f["digest"])

    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 1200
    shared, rank_state = s.load(ckpt)
    _assert_same(state, shared)
    assert rank_state is not None
    _assert_same(per_rank["residues"], rank_state["residues"])
    # what trainer code would do by hand: both files load with weights_only=True
    torch.load(path / SHARED, weights_only=True)
    torch.load(path / rank_filename(0), weights_only=True)


def test_keep_prunes_to_last_k(tmp_path: Path) -> None:
    s = CheckpointStore(tmp_path, keep=2)
    for step in (100, 200, 300, 400):
        s.save(step, {"step": step})
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "step-00000300", "step-00000400"]
    assert [c.step for c in s.checkpoints()] == [300, 400]
    shared, rank_state = s.load(s.latest_valid())  # type: ignore[arg-type]
    assert shared == {"step": 400} and rank_state is None


@pytest.mark.parametrize("keep", [3, 4, 7])
def test_keep_k_holds_every_checkpoint_until_there_are_k(tmp_path: Path, keep: int) -> None:
    """Fewer saves than ``keep`` are all kept, then the newest ``keep``. (keep 7 once held only 4 of 6: the
    older ones were cut with a negative slice start once more than half of them were taken.)"""
    s = CheckpointStore(tmp_path, keep=keep)
    for n, step in enumerate(range(10, 100, 10), start=1):
        s.save(step, {"step": step})
        expected = list(range(10, step + 1, 10))[-keep:]
        assert [c.step for c in s.checkpoints()] == expected, (n, keep)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != MANIFEST) == [step_dirname(k) for k in expected]


def test_saving_an_earlier_step_drops_the_abandoned_later_ones(tmp_path: Path) -> None:
    s = CheckpointStore(tmp_path, keep=5)
    for step in (1, 2, 3):
        s.save(step, {"step": step})
    s.save(2, {"step": 22})  # resumed from 1 (say 2 and 3 were bad) and reached step 2 again
    assert [c.step for c in s.checkpoints()] == [1, 2]
    assert not (tmp_path / step_dirname(3)).exists()
    assert s.load(s.latest_valid())[0] == {"step": 22}  # type: ignore[arg-type]


def test_an_abandoned_step_stays_dropped_while_its_directory_is_not_yet_deleted(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader adds the steps whose markers it finds to the manifest's list: the abandoned timeline's markers go
    before the manifest drops it, so a deletion that has not run (a background prune) or failed brings it back."""
    s = CheckpointStore(tmp_path, keep=5)
    for step in (1, 2, 3):
        s.save(step, {"step": step})
    monkeypatch.setattr(CheckpointStore, "_delete", lambda self, stale: None)
    s.save(2, {"step": 22})
    assert (tmp_path / step_dirname(3)).is_dir() and not (tmp_path / step_dirname(3) / MARKER).exists()
    assert [c.step for c in s.checkpoints()] == [1, 2]
    assert s.load(s.latest_valid())[0] == {"step": 22}  # type: ignore[arg-type]


def test_an_empty_manifest_hides_no_committed_step_from_resume(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """An empty but valid manifest made the store return no checkpoint: training would restart at step 0."""
    s = CheckpointStore(tmp_path, keep=3)
    for step in (10, 20):
        s.save(step, {"step": step})
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "hpctrain-checkpoint", "checkpoints": []}))
    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 20 and s.load(ckpt)[0] == {"step": 20}
    (line,) = _warnings(caplog)
    assert "names 0 checkpoint(s) but not step(s) 10, 20" in line
    s.save(30, {"step": 30})  # the next save writes a manifest naming them again
    assert [c["step"] for c in json.loads((tmp_path / MANIFEST).read_text())["checkpoints"]] == [10, 20, 30]


# -------------------------------------------------------------------------------- damaged checkpoints


def _three(tmp_path: Path) -> CheckpointStore:
    s = CheckpointStore(tmp_path, keep=3)
    for step in (10, 20, 30):
        s.save(step, {"w": torch.full((1000,), float(step))}, per_rank={"r": step})
    return s


def test_truncated_newest_falls_back_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = _three(tmp_path)
    bad = tmp_path / step_dirname(30) / SHARED
    os.truncate(bad, bad.stat().st_size // 2)
    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 20
    (line,) = _warnings(caplog)
    assert str(bad) in line and "truncated" in line and "step 20" in line
    assert s.load(ckpt)[0]["w"][0].item() == 20.0


def test_flipped_byte_is_caught_by_checksum(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = _three(tmp_path)
    bad = tmp_path / step_dirname(30) / rank_filename(0)
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    assert s.latest_valid(verify=False).step == 30  # type: ignore[union-attr]  # same size: only checksum sees it
    caplog.clear()
    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 20
    (line,) = _warnings(caplog)
    assert str(bad) in line and "corrupt" in line


def test_corrupt_or_missing_manifest_is_rebuilt_from_markers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = _three(tmp_path)
    (tmp_path / MANIFEST).write_text('{"format": "hpctrain-checkpoint", "checkpoints": [')  # torn write
    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 30
    (line,) = _warnings(caplog)
    assert "unreadable" in line and "rebuilt" in line

    (tmp_path / MANIFEST).unlink()
    (tmp_path / step_dirname(30) / MARKER).unlink()  # 30 was never committed: must not be used
    caplog.clear()
    assert s.latest_valid().step == 20  # type: ignore[union-attr]
    assert "missing" in _warnings(caplog)[0]

    s.save(40, {"w": torch.zeros(1)})  # the next save writes a good manifest again, keeping 3
    assert [c.step for c in CheckpointStore(tmp_path).checkpoints()] == [10, 20, 40]
    caplog.clear()
    assert s.latest_valid().step == 40 and not _warnings(caplog)  # type: ignore[union-attr]


def test_empty_directory_has_no_checkpoint_and_no_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert CheckpointStore(tmp_path / "none").latest_valid() is None
    assert not _warnings(caplog)


# ------------------------------------------------------------------------------------------ failures

KILLED_WRITER = """
import sys, torch
from hpctrain.checkpoint.store import CheckpointStore
s = CheckpointStore(sys.argv[1])
s.save(1, {"w": torch.ones(10)})
big = {"w%d" % i: torch.full((5_000_000,), float(i)) for i in range(10)}  # 200 MB
print("saving", flush=True)
s.save(2, big)
print("saved", flush=True)
"""


@pytest.mark.processes
def test_kill_9_during_a_large_save_keeps_the_previous(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "saving"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read()
    assert proc.wait() == -signal.SIGKILL
    assert "saved" not in rest, "the 200 MB save finished within 0.2 s: the kill did not interrupt it"

    s = CheckpointStore(tmp_path)
    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 1 and not _warnings(caplog)
    assert s.load(ckpt)[0]["w"].sum().item() == 10.0
    s.save(2, {"w": torch.zeros(3)})  # the same step again: stale temp files of the dead writer go
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert s.latest_valid().step == 2  # type: ignore[union-attr]


def test_disk_full_keeps_previous_and_removes_temp(tmpfs: Path) -> None:
    s = CheckpointStore(tmpfs)
    s.save(1100, {"w": torch.zeros(100)})
    with pytest.raises(CheckpointError) as info:
        s.save(1200, {"w": torch.zeros(1_000_000)})  # 4 MB on a 1 MB file system
    msg = str(info.value)
    assert msg.startswith(f"cannot write checkpoint step 1200 to {tmpfs}: No space left on device;")
    assert "the previous checkpoint (step 1100) is intact" in msg
    assert sorted(p.name for p in tmpfs.iterdir()) == [MANIFEST, step_dirname(1100)]
    assert not [p for p in tmpfs.rglob("*") if ".tmp-" in p.name]
    assert s.latest_valid().step == 1100  # type: ignore[union-attr]


def test_read_only_directory(tmpfs: Path) -> None:
    s = CheckpointStore(tmpfs)
    s.save(5, {"w": torch.zeros(10)})
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with pytest.raises(CheckpointError, match=r"step 6 .*Read-only file system; the previous checkpoint \(step 5\)"):
        s.save(6, {"w": torch.zeros(10)})
    assert s.latest_valid().step == 5  # type: ignore[union-attr]


def test_failure_at_fsync_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated (monkeypatched os.fsync raising EIO): every byte written, then the flush to disk fails."""
    s = CheckpointStore(tmp_path)
    s.save(1, {"w": torch.zeros(10)})

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(CheckpointError, match="Input/output error; the previous checkpoint .step 1. is intact"):
        s.save(2, {"w": torch.zeros(10)})
    monkeypatch.undo()
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert not (tmp_path / step_dirname(2)).exists()
    assert s.latest_valid().step == 1  # type: ignore[union-attr]


# -------------------------------------------------------------------------------------- two ranks

RANK_WORKER = """
import json, os, sys, torch
import torch.distributed as dist
from hpctrain.checkpoint.manifest import rank_filename, step_dirname
from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.checkpoint.signals import StopFlag
torch.set_num_threads(1)
rank, root, init = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)

def gather(obj):
    out = [None, None]
    dist.all_gather_object(out, obj)
    return out

s = CheckpointStore(root, keep=3, rank=rank, world_size=2, gather=gather)
shared = {"w": torch.arange(6.0)} if rank == 0 else {}
for step in (1, 2):
    s.save(step, shared, per_rank={"rank": rank, "x": torch.full((4,), float(10 * step + rank))})
result = {"after_save": s.latest_valid().step}
if rank == 1:  # damage only rank 1's newest file: both ranks must fall back together
    p = os.path.join(root, step_dirname(2), rank_filename(1))
    data = bytearray(open(p, "rb").read()); data[-30] ^= 0xFF; open(p, "wb").write(bytes(data))
dist.barrier()
ckpt = s.latest_valid()
sh, mine = s.load(ckpt)
result.update(chosen=ckpt.step, rank_field=mine["rank"], x=mine["x"].tolist(), w=sh["w"].tolist())
flag = StopFlag()
if rank == 1:
    flag.set()
def allreduce_max(v):
    t = torch.tensor([v]); dist.all_reduce(t, op=dist.ReduceOp.MAX); return int(t.item())
result["agree"] = flag.agree(allreduce_max)
json.dump(result, open(os.path.join(root, f"result-{rank}.json"), "w"))
dist.destroy_process_group()
"""


@pytest.mark.processes
def test_two_ranks_record_every_file_and_fall_back_together(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    init = f"file://{tmp_path / 'pg'}"
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK_WORKER, str(r), str(root), init], env=env,
                         stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs

    entries = json.loads((root / MANIFEST).read_text())["checkpoints"]
    assert [e["step"] for e in entries] == [1, 2]
    for e in entries:
        assert e["world_size"] == 2
        names = {f["name"]: f for f in e["files"]}
        assert set(names) == {SHARED, rank_filename(0), rank_filename(1)}
        assert names[rank_filename(1)]["rank"] == 1
    r0, r1 = (json.loads((root / f"result-{r}.json").read_text()) for r in (0, 1))
    assert r0["after_save"] == r1["after_save"] == 2
    assert r0["chosen"] == r1["chosen"] == 1  # rank 0's own files for step 2 are fine, it still falls back
    assert (r0["rank_field"], r0["x"]) == (0, [10.0] * 4)
    assert (r1["rank_field"], r1["x"]) == (1, [11.0] * 4)
    assert r0["w"] == r1["w"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert r0["agree"] is True and r1["agree"] is True

    # elastic restart on one rank: only shared.pt matters (rank 1's damaged file is not read), so step 2
    # is usable; the shared state loads, the per-rank state does not, with a warning
    single = CheckpointStore(root)
    ckpt = single.latest_valid()
    assert ckpt is not None and ckpt.step == 2 and ckpt.world_size == 2
    caplog.clear()
    shared, rank_state = single.load(ckpt)
    assert rank_state is None and shared["w"].tolist() == r0["w"]
    assert "written by 2 ranks, this run has 1" in _warnings(caplog)[0]


# -------------------------------------------------------------------------------------------- RNG


def test_rng_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    gen = np.random.default_rng(3)
    random.random(), np.random.rand(), gen.random(), torch.rand(1)

    def draw() -> list[float]:
        return [random.random(), random.gauss(0, 1), float(np.random.rand()), float(gen.random()),
                *torch.rand(3).tolist()]

    s = CheckpointStore(tmp_path)
    s.save(1, {}, per_rank={"rng": capture_rng_state([gen])})
    first = draw()
    _, rank_state = s.load(s.latest_valid())  # type: ignore[arg-type]
    assert rank_state is not None
    restore_rng_state(rank_state["rng"], [gen])
    assert draw() == first
    with pytest.raises(ValueError, match="1 NumPy generator states were saved but 0"):
        restore_rng_state(rank_state["rng"])


def test_a_manifest_entry_pointing_outside_is_never_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 11: ``"dir": "../outside/step-x"`` once loaded another run's step as step 30, silently."""
    root = tmp_path / "ckpt"
    s = _three(root)
    other = CheckpointStore(tmp_path / "outside", keep=1)
    other.save(99, {"w": torch.full((1000,), -1.0)})
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["checkpoints"][-1]["dir"] = f"../outside/{step_dirname(99)}"
    (root / MANIFEST).write_text(json.dumps(manifest))
    ckpt = s.latest_valid()
    assert ckpt is not None and ckpt.step == 30 and ckpt.path == root / step_dirname(30)
    assert s.load(ckpt)[0]["w"][0].item() == 30.0  # its own data, from the rebuilt list
    (line,) = _warnings(caplog)
    assert "not its own" in line and "rebuilt" in line
