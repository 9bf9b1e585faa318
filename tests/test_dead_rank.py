"""A rank killed with SIGKILL mid-training: the job ends within 60 s, non-zero, the launcher names the rank, the
newest complete checkpoint is intact, and the run continues to the end — under ``mpiexec`` (re-running
``hpctrain run``) and under ``srun`` in a real Slurm job (through ``hpctrain resume``).
"""

from __future__ import annotations

import io
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

from hpctrain.runtime.rank_list import node_file, read_ranks
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry

pytestmark = pytest.mark.timeout(600)  # hang guards: at load 6 on 2 cores a resumed run took > 200 s
REPO = Path(__file__).resolve().parent.parent
# Far more steps than the second checkpoint (step 40) takes: the rank is killed within a poll (0.3 s) of that
# checkpoint appearing, long before the run could finish on its own.
STEPS = 400
SPEC = """name: {name}
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: {steps}, batch_per_rank: 8, lr: 0.05, log_every: 10, seed: 5, collective_timeout_s: 10}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:10:00"}}
checkpoint: {{every_steps: 20, keep: 2, signal_lead_s: 60}}
"""


def newest_checkpoint(run_dir: Path) -> int:
    try:
        manifest = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())
        return max(c["step"] for c in manifest["checkpoints"])
    except (OSError, ValueError, KeyError):
        return 0


def rank_pid(run_dir: Path, rank_variable: str, rank: int) -> int | None:
    """The pid of the process running ``hpctrain run`` for ``run_dir`` with ``rank_variable=rank``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hpctrain" in cmdline and b"run" in cmdline and str(run_dir).encode() in b" ".join(cmdline) \
                and f"{rank_variable}={rank}".encode() in environ:
            return int(proc.name)
    return None


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def assert_intact(run_dir: Path) -> int:
    """Every file of the newest manifest entry has the recorded size and digest, and loads; returns its step."""
    import hashlib

    import torch

    manifest = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())
    newest = max(manifest["checkpoints"], key=lambda c: c["step"])
    from hpctrain.checkpoint.node_file import read_member

    # one file per node (the default layout): both ranks' states in node-00000.pt, named after its first rank,
    # described by the entry (one file of 2 ranks) and checked through its own index
    assert [f["name"] for f in newest["files"]] == ["shared.pt"]
    assert (newest["nodes"]["count"], newest["nodes"]["ranks_per_file"]) == (1, 2)
    for record in newest["files"]:
        data = (run_dir / "checkpoints" / newest["dir"] / record["name"]).read_bytes()
        assert len(data) == record["bytes"]
        assert hashlib.new(newest["checksum"], data).hexdigest() == record["digest"]
    node_file = run_dir / "checkpoints" / newest["dir"] / "node-00000.pt"
    assert all(torch.load(io.BytesIO(read_member(node_file, r)), weights_only=True) for r in (0, 1))
    shared = torch.load(run_dir / "checkpoints" / newest["dir"] / "shared.pt", weights_only=False)
    assert shared["step"] == newest["step"]
    return int(newest["step"])


@pytest.mark.mpi
def test_kill_one_rank_under_mpiexec_then_rerun_finishes(tmp_path: Path, venv_bin: Path) -> None:
    spec = tmp_path / "dead.yaml"
    spec.write_text(SPEC.format(name="dead-mpiexec", steps=STEPS))
    run_dir = tmp_path / "run"
    argv = [str(venv_bin / "mpiexec"), "-n", "2", str(venv_bin / "python"), "-m", "hpctrain", "run", str(spec),
            "--run-dir", str(run_dir), "--backend", "mpi"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_for(lambda: newest_checkpoint(run_dir) >= 40, 120, "the second checkpoint")
        pid = rank_pid(run_dir, "PMI_RANK", 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)  # a hang guard: the surviving rank would train for ever
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # What MPICH's hydra prints when a rank dies: a process by pid (not by rank) and the signal. It names the first
    # process of the node, in rank order, that ended by a signal (pmiserv_cb.c loops over the proxy's exit statuses
    # and stops at the first !WIFEXITED): the killed rank 1, unless the proxy's clean-up SIGKILLed rank 0 before
    # rank 0 could exit on its own — then rank 0's pid (seen once in a full suite run). Either way the pid maps to a
    # rank through the list the ranks write at start (runtime/rank_list.py), named by the node's one start-up line.
    ranks = {int(r["pid"]): int(r["rank"]) for r in read_ranks(node_file(run_dir, 0))}
    assert "hpctrain: node 0 (" in out and str(node_file(run_dir, 0)) in out, out[-3000:]
    assert ranks.get(pid) == 1, out[-3000:]
    named = re.search(r"PID (\d+) RUNNING AT .*\n=   EXIT CODE: 9\n", out)
    assert named and int(named.group(1)) in ranks and "Killed (signal 9)" in out, out[-3000:]
    step = assert_intact(run_dir)
    assert 0 < step < STEPS
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=200,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"(step {step})" in rerun.stderr and f"training finished at step {STEPS}" in rerun.stderr


@pytest.mark.slurm
@pytest.mark.usefixtures("isolated_home")
def test_kill_one_rank_under_srun_then_hpctrain_resume(tmp_path: Path, slurm: Any) -> None:
    spec = tmp_path / "dead.yaml"
    spec.write_text(SPEC.format(name="dead-srun", steps=STEPS))
    with RunRegistry() as reg:
        done = submit_runs(spec, "ci-slurm", registry=reg)
    run, job_id = done.runs[0], done.job_ids[0]
    assert job_id is not None
    run_dir = Path(run.run_dir)
    wait_for(lambda: newest_checkpoint(run_dir) >= 40, 150, "the second checkpoint")
    pid = rank_pid(run_dir, "SLURM_PROCID", 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: slurm.state(job_id) not in ("RUNNING", "COMPLETING", "PENDING"), 60, "the job to end")
    assert time.monotonic() - killed_at < 60
    assert slurm.state(job_id) == "FAILED"
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "task 1: Killed" in log, log[-3000:]  # srun names the task (= rank) that died
    assert "putting the job back in the queue" not in log  # a dead rank is not a walltime
    step = assert_intact(run_dir)

    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", run.run_id], env=environ,
                            capture_output=True, text=True, timeout=60)
    assert "FAILED" in status.stdout and "exit status" in status.stdout, status.stdout + status.stderr
    resumed = subprocess.run([sys.executable, "-m", "hpctrain", "resume", run.run_id], env=environ,
                             capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    new_job = resumed.stdout.split()[1]
    assert new_job != job_id and f"continues from step {step} of {STEPS}" in resumed.stdout
    view = RunHandle(run.run_id).wait(timeout=500, poll_s=1, max_poll_s=3)  # a hang guard
    new_log = (run_dir / f"slurm-{new_job}.out").read_text()
    assert view.state == "completed", new_log[-3000:]
    assert f"(step {step})" in new_log and f"training finished at step {STEPS}" in new_log
    with RunRegistry() as reg:
        chain = reg.chain(run.run_id)
    assert [(s.kind, s.job_id, s.state) for s in chain] == [("submit", job_id, "failed"),
                                                            ("resume", new_job, "completed")]
    again = subprocess.run([sys.executable, "-m", "hpctrain", "resume", run.run_id], env=environ,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and f"already completed all {STEPS} steps" in again.stderr
