"""The run's reason is the root cause: the first rank's own error, or the launcher's "rank N killed by SIGKILL",
never the collective error a peer sees because of it (gloo's "Connection closed by peer", an MPI error, a watchdog
timeout).

Real 2-rank FFN runs on the ``local`` site whose training data is wrong only for the ranks (``--set`` on the rank
command, as test_failure.py does: the laptop checks the data the spec names, which is right): a dataset name the
file lacks, a file that is not HDF5, labels of another shape than the image. Rank 0 prepares the data; its error
reaches rank 1 through the runtime's agreement, so both ranks exit with the same error and the status reason is
that error. Then a rank killed with SIGKILL, on the local site and under srun on the real Slurm: the reason names
the killed rank. The note's levels (peer < own < signal) are tested by racing writers.
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

from hpctrain.nodes.blame import read_blames
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.failure import FAILURE_FILE, NOTE_FILES, OWN, PEER, SIGNAL, record_failure
from hpctrain.submission.registry import RunRegistry

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parent.parent
PEER_WORDS = ("gloo", "Connection closed", "Connection reset", "peer", "MPI", "did not arrive", "did not complete")

FFN_JOB = """name: {name}
model: ffn
model_args: {{depth: 1, features: 4, fov: [9, 9, 9], deltas: [2, 2, 2]}}
data:
  train: {{image: "{good}:image", labels: "{good}:labels"}}
train: {{steps: 3, batch_per_rank: 1, lr: 0.01, log_every: 1}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:10:00"}}
checkpoint: {{signal_lead_s: 10}}
"""

LONG_JOB = """name: {name}
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: 100000, batch_per_rank: 8, lr: 0.05, log_every: 5, seed: 5, collective_timeout_s: 30}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:10:00"}}
checkpoint: {{every_steps: 1000, keep: 1, signal_lead_s: 60}}
"""


def _volumes(tmp: Path) -> dict[str, Path]:
    """A good training volume and three wrong ones (each beside the good one)."""
    import h5py

    from hpctrain.ffn.synthetic import make_synthetic_volume

    image, labels = make_synthetic_volume((24, 32, 32), 3)
    files = {"good": tmp / "good.h5", "renamed": tmp / "renamed.h5", "mismatch": tmp / "mismatch.h5",
             "text": tmp / "text.h5"}
    with h5py.File(files["good"], "w") as f:
        f["image"], f["labels"] = image, labels
    with h5py.File(files["renamed"], "w") as f:
        f["raw"], f["seg"] = image, labels
    with h5py.File(files["mismatch"], "w") as f:
        f["image"], f["labels"] = image, labels[:, :30, :]
    files["text"].write_text("this is not an HDF5 file\n" * 40)
    return files


def _status(run_id: str) -> dict[str, Any]:
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "hpctrain", "status", run_id, "--json"], env=environ,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    return dict(row)


# (which file, what the rank command sets, what the reason must say)
MISTAKES = {
    "dataset-name": ("renamed", "{f}:image", "{f}:labels", ["no dataset 'image'", "'raw'", "'seg'"]),
    "not-hdf5": ("text", "{f}:image", "{f}:labels", ["text.h5", "HDF5"]),
    "shape-mismatch": ("mismatch", "{f}:image", "{f}:labels", ["(24, 32, 32)", "(24, 30, 32)"]),
}


@pytest.mark.processes
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
@pytest.mark.usefixtures("isolated_home")
def test_a_data_mistake_is_the_reason_on_every_rank(tmp_path: Path, mistake: str) -> None:
    files = _volumes(tmp_path)
    which, image, labels, words = MISTAKES[mistake]
    bad = files[which]
    job = tmp_path / "job.yaml"
    job.write_text(FFN_JOB.format(name=f"data-{mistake}", good=files["good"]))
    rank = [sys.executable, "-m", "hpctrain", "run", "job.yaml", "--run-dir", ".",
            "--set", f"data.train.image={image.format(f=bad)}", "--set", f"data.train.labels={labels.format(f=bad)}"]
    with RunRegistry() as reg:
        run = submit_runs(job, "local", command=rank, registry=reg).runs[0]
    view = RunHandle(run.run_id).wait(timeout=240, poll_s=0.5)
    log = Path(run.run_dir, "job.out").read_text()
    assert view.state == "failed", log[-4000:]
    reason = _status(run.run_id)["reason"]
    assert reason.startswith("rank 0: ") and all(w in reason for w in words), reason + "\n" + log[-4000:]
    assert not any(w in reason for w in PEER_WORDS), reason
    # Rank 1 stops with rank 0's error, not with a broken collective of its own.
    errors = [ln for ln in log.splitlines() if "hpctrain: error:" in ln]
    assert any(ln.startswith("[rank 0] hpctrain: error: rank 0: ") for ln in errors), log[-4000:]
    assert any(ln.startswith("[rank 1] hpctrain: error: rank 1: stopped with rank 0: ") for ln in errors), log[-4000:]
    assert all(words[0] in ln for ln in errors), errors
    assert "Connection closed by peer" not in log and "RuntimeError" not in log, log[-4000:]
    # Both ranks exit with the data error's code: the launcher names whichever it saw first with that code.
    assert re.search(r"hpctrain local launcher: rank [01] exited with code 2;", log), log[-2000:]


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of the ``hpctrain run`` process of ``run_dir`` with RANK=rank (the local launcher's variable)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if b"hpctrain" in cmdline and b"run" in cmdline and cwd == str(run_dir) and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _metrics(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and '"step"' in path.read_text()


@pytest.mark.processes
@pytest.mark.usefixtures("isolated_home")
def test_a_killed_rank_is_the_reason_on_the_local_site(tmp_path: Path) -> None:
    """kill -9 of rank 1 while the ranks train: rank 0's broken all-reduce is not the reason, rank 1's death is."""
    job = tmp_path / "job.yaml"
    job.write_text(LONG_JOB.format(name="killed-local"))
    with RunRegistry() as reg:
        run = submit_runs(job, "local", registry=reg).runs[0]
    run_dir = Path(run.run_dir).resolve()
    handle = RunHandle(run.run_id)
    try:
        _wait_for(lambda: _metrics(run_dir), 150, "the first metrics record")
        pid = _rank_pid(run_dir, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        view = handle.wait(timeout=120, poll_s=0.5)
    finally:
        if handle.status().state in ("pending", "running"):
            handle.cancel()
    log = (run_dir / "job.out").read_text()
    assert view.state == "failed", log[-3000:]
    assert "hpctrain local launcher: rank 1 killed by SIGKILL" in log, log[-3000:]
    reason = _status(run.run_id)["reason"]
    assert reason.startswith("rank 1 killed by SIGKILL"), reason + "\n" + log[-3000:]
    assert (run_dir / FAILURE_FILE).read_text() == "rank 1 killed by SIGKILL\n"


def test_note_levels_peer_then_own_then_signal(tmp_path: Path) -> None:
    """A peer's error is replaced by a rank's own error, which a signal line replaces; never the other way, and
    within a level the first line stays."""
    note = tmp_path / FAILURE_FILE
    assert record_failure(tmp_path, "rank 0 failed: RuntimeError: Connection closed by peer", PEER)
    assert note.read_text() == "rank 0 failed: RuntimeError: Connection closed by peer\n"
    assert record_failure(tmp_path, "rank 1: no dataset 'image'", OWN)
    assert not record_failure(tmp_path, "rank 0 failed: RuntimeError: broken pipe", PEER)
    assert not record_failure(tmp_path, "rank 2: a later error", OWN)
    assert note.read_text() == "rank 1: no dataset 'image'\n"
    assert record_failure(tmp_path, "rank 3 killed by SIGKILL", SIGNAL)
    assert not record_failure(tmp_path, "rank 0: a late error", OWN)
    assert note.read_text() == "rank 3 killed by SIGKILL\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NOTE_FILES)  # no temporary left
    with pytest.raises(ValueError):
        record_failure(tmp_path, "x", 7)


@pytest.mark.processes
def test_racing_writers_of_every_level_end_with_the_highest(tmp_path: Path) -> None:
    """Twelve processes, four per level, write at once, ten times over: the note is always one whole line of the
    highest level."""
    code = ("import sys; from hpctrain.submission.failure import record_failure; "
            "record_failure(sys.argv[1], 'level ' + sys.argv[2] + ' ' + 'why ' * 60, int(sys.argv[2]))")
    for attempt in range(10):
        directory = tmp_path / str(attempt)
        procs = [subprocess.Popen([sys.executable, "-c", code, str(directory), str(i % 3)],
                                  env={**os.environ, "PYTHONPATH": str(REPO)}) for i in range(12)]
        assert all(p.wait(timeout=120) == 0 for p in procs)
        assert (directory / FAILURE_FILE).read_text() == f"level {SIGNAL} " + ("why " * 60).strip() + "\n"


def _rank_pid_by(run_dir: Path, variable: str, rank: int) -> int | None:
    """The pid of the ``hpctrain run`` process of ``run_dir`` whose launcher set ``variable=rank``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hpctrain" in cmdline and b"run" in cmdline and str(run_dir).encode() in b" ".join(cmdline) \
                and f"{variable}={rank}".encode() in environ:
            return int(proc.name)
    return None


@pytest.mark.slurm
@pytest.mark.usefixtures("isolated_home")
def test_a_killed_rank_is_the_reason_under_srun(tmp_path: Path, slurm: Any) -> None:
    """kill -9 of rank 1 in a real Slurm job (srun, MPI): the reason names rank 1 and its signal."""
    job = tmp_path / "job.yaml"
    job.write_text(LONG_JOB.format(name="killed-srun"))
    with RunRegistry() as reg:
        done = submit_runs(job, "ci-slurm", registry=reg)
    run, job_id = done.runs[0], done.job_ids[0]
    run_dir = Path(run.run_dir)
    handle = RunHandle(run.run_id)
    try:
        _wait_for(lambda: _metrics(run_dir), 200, "the first metrics record")
        pid = _rank_pid_by(run_dir, "SLURM_PROCID", 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        view = handle.wait(timeout=150, poll_s=1, max_poll_s=3)
    finally:
        if handle.status().state in ("pending", "running"):
            handle.cancel()
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert view.state == "failed", log[-3000:]
    reason = _status(run.run_id)["reason"]
    assert re.match(r"rank 1 on \S+ killed by SIGKILL", reason), reason + "\n" + log[-3000:]
    (blame,) = read_blames(run_dir)  # the node is blamed with the ranks srun reports on it (both: one node)
    assert blame.ranks == (0, 1) and blame.source == "launcher" and "killed by SIGKILL" in blame.cause, blame


def test_srun_report_names_the_first_rank_killed_in_the_last_attempt() -> None:
    from hpctrain.submission.launchers.exit_note import first_killed_rank

    earlier = ["hpctrain: job 7 starts on n1 at Mon", "srun: error: n1: task 0: Segmentation fault"]
    attempt = ["hpctrain: job 7 starts on n1 at Tue", "step 5/100  loss 2.3",
               "srun: error: n1: task 3: Killed", "srun: launch/slurm: _step_signal: Terminating StepId=7.0",
               "srun: error: n1: tasks 0-2: Killed"]
    killed = first_killed_rank(earlier + attempt)
    assert killed is not None and (killed.rank, killed.signal, killed.node) == (3, signal.SIGKILL, "n1")
    assert killed.ranks_on_node == (0, 1, 2, 3) and killed.cause == "killed by SIGKILL"
    killed = first_killed_rank(earlier)
    assert killed is not None and (killed.rank, killed.signal) == (0, signal.SIGSEGV)
    killed = first_killed_rank(["srun: error: n2: tasks 1,3: Aborted", "srun: error: n1: task 0: Killed"])
    assert killed is not None and (killed.rank, killed.signal, killed.node, killed.ranks_on_node) == (
        1, signal.SIGABRT, "n2", (1, 3))
    oom = first_killed_rank(["slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks "
                             "have been OOM Killed.", "srun: error: n4: task 6: Killed"])
    assert oom is not None and oom.node == "n4" and oom.cause.startswith("out of memory"), oom
    # The first rank to end exited by itself (it wrote its own note), or the scheduler stopped the job: no line.
    assert first_killed_rank(["srun: error: n1: task 1: Exited with exit code 2",
                              "srun: error: n1: task 0: Killed"]) is None
    assert first_killed_rank(["srun: error: n1: task 0: Terminated"]) is None
    assert first_killed_rank(["srun: error: Node failure on n2", "srun: error: n1: task 0: Killed"]) is None
    # Started again on a spare node inside the allocation: the new launch's report is the one that counts.
    again = first_killed_rank(["srun: error: n2: task 1: Killed",
                               "hpctrain: starting the ranks again from the last checkpoint (relaunch 1 of 2)",
                               "srun: error: n3: task 1: Killed"])
    assert again is not None and again.node == "n3", again
    assert first_killed_rank(earlier[:1] + attempt[:2]) is None


def test_srun_report_does_not_replace_a_ranks_own_error(tmp_path: Path) -> None:
    """srun kills the other tasks when one exits with its own error, and may list them first: the rank's own
    note stands. Without one, the killed rank becomes the note."""
    from hpctrain.submission.launchers.exit_note import main

    log = tmp_path / "slurm-7.out"
    log.write_text("hpctrain: job 7 starts on n1 at Tue\nsrun: error: n1: task 1: Killed\n"
                   "srun: error: n1: task 0: Exited with exit code 2\n")
    own = tmp_path / "own"
    record_failure(own, "rank 0: /data/vol.h5: no dataset 'image'", OWN)
    assert main(["--run-dir", str(own), "--log", str(log)]) == 0
    assert (own / FAILURE_FILE).read_text() == "rank 0: /data/vol.h5: no dataset 'image'\n"
    peer = tmp_path / "peer"
    record_failure(peer, "rank 0 failed: mpi4py.MPI.Exception: Other MPI error", PEER)
    assert main(["--run-dir", str(peer), "--log", str(log)]) == 0
    assert (peer / FAILURE_FILE).read_text() == "rank 1 on n1 killed by SIGKILL\n"


@pytest.mark.processes
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_agree_gives_every_rank_the_failing_ranks_error(backend: str, venv_bin: Path) -> None:
    """Three real ranks; rank 1 fails: ranks 0 and 2 raise RankFailure with rank 1's line and exit code, rank 1
    its own DataError, and the group still works afterwards (no collective was left half-done)."""
    worker = str(REPO / "tests" / "mp_helpers" / "agree_worker.py")
    python = str(venv_bin / "python")
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if backend == "gloo":
        argv = [python, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", "3", "--no-prefix", "--",
                python, worker, "gloo", "1"]
    else:
        argv = [str(venv_bin / "mpiexec"), "-n", "3", python, worker, "mpi", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    line = "rank 1: /data/vol.h5: no dataset 'image' (datasets in the file: ['raw'])"
    for r in (0, 2):
        assert f"rank {r}: RankFailure from rank 1, exit 2: {line}" in out.stdout, out.stdout
    assert "rank 1: own DataError: /data/vol.h5: no dataset 'image'" in out.stdout, out.stdout
    assert all(f"rank {r}: sum after 3" in out.stdout for r in range(3)), out.stdout


def test_a_task_context_without_a_collective_still_waits_at_its_barrier(tmp_path: Path) -> None:
    """A context built without ``agree`` (a plug-in's own harness): the ranks that did not take rank 0's step
    still wait at the barrier for it, as before agree existed, instead of reading half-written data."""
    import torch

    from hpctrain.models.task import TaskContext

    waited: list[int] = []
    ctx = TaskContext({}, {}, 1, 0, 1, 2, tmp_path, torch.device("cpu"), barrier=lambda: waited.append(1))
    ctx.agree(None)
    assert waited == [1]
    with pytest.raises(ValueError, match="bad data"):
        ctx.agree(ValueError("bad data"))
    assert waited == [1]
