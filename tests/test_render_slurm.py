"""Rendered Slurm scripts against the real single-node Slurm: accepted by sbatch, refused before it, and run.

One script is submitted for real (its rank command replaced by a tiny Python that prints its rank) and must
reach COMPLETED with srun starting both ranks; another shows the batch shell forwarding the checkpoint signal.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.site import load_site_file
from hpctrain.errors import FitError
from hpctrain.submission.render import render_script
from hpctrain.submission.schedulers.state import JobState

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slurm


@pytest.fixture
def slurm_up(slurm: object) -> None:
    """The shared ``slurm`` fixture (tests/conftest.py): fails, never skips, when Slurm cannot start."""


def _site():
    return load_site_file(ROOT / "site_configs" / "ci-slurm.yaml")


def _job(**resources: object) -> JobSpec:
    base = {"nodes": 1, "ranks_per_node": 2, "threads_per_rank": 1, "walltime": "00:05:00"}
    return JobSpec.model_validate({"name": "render-slurm-test", "model": "resnet",
                                   "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1},
                                   "resources": {**base, **resources}, "checkpoint": {"signal_lead_s": 30}})


def _jobs_for_ci() -> list[tuple[str, JobSpec]]:
    jobs = [(p.stem, load_job(p)) for p in sorted((ROOT / "jobs").glob("*.yaml"))]
    jobs += [("rpn4", _job(ranks_per_node=4)), ("threads2", _job(threads_per_rank=2)),
             ("mem", _job(memory_gb=1)), ("one-rank", _job(ranks_per_node=1))]
    return jobs


def test_every_fitting_script_is_accepted_by_sbatch_test_only(slurm_up: None, tmp_path: Path) -> None:
    accepted = 0
    for name, job in _jobs_for_ci():
        try:
            rendered = render_script(job, _site(), run_dir=str(tmp_path), spec_path=f"{tmp_path}/job.yaml",
                                     python=sys.executable)
        except FitError:
            continue
        script = tmp_path / f"{name}.sh"
        script.write_text(rendered.text)
        argv = rendered.scheduler.test_only_argv(str(script))
        assert argv is not None
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{name}: {out.stderr}"
        assert "to start at" in out.stderr, f"{name}: {out.stderr}"
        accepted += 1
    assert accepted >= 5


@pytest.mark.parametrize(("resources", "limit"), [
    ({"nodes": 5}, "queue 'debug' of site 'ci-slurm' allows at most 1"),
    ({"walltime": "2-00:00:00"}, "over the limit of queue 'debug'"),
    ({"ranks_per_node": 4, "threads_per_rank": 2}, "4 cores x 1 threads = 4"),
    ({"gpus_per_rank": 1}, "has no GPUs"),
])
def test_impossible_specs_are_refused_before_sbatch(resources: dict[str, object], limit: str) -> None:
    with pytest.raises(FitError, match=limit.replace("(", r"\(")):
        render_script(_job(**resources), _site(), run_dir="/tmp/x", spec_path="/tmp/x/job.yaml")


def _wait_for(job_id: str, states: set[JobState], timeout_s: float) -> JobState:
    from hpctrain.submission.schedulers.base import get_scheduler

    slurm = get_scheduler("slurm")
    probe = slurm.status_probes({job_id: "/tmp"})[1][1]  # scontrol: works without accounting
    assert probe.name == "scontrol"
    deadline = time.monotonic() + timeout_s
    state = JobState.MISSING
    while time.monotonic() < deadline:
        out = subprocess.run(probe.argv, capture_output=True, text=True, timeout=20)
        status = probe.parse(out.stdout).get(job_id)
        state = status.state if status else JobState.MISSING
        if state in states:
            return state
        time.sleep(1)
    return state


def _submit(tmp_path: Path, command: list[str], name: str) -> tuple[str, Path]:
    rendered = render_script(_job(), _site(), run_dir=str(tmp_path), spec_path=f"{tmp_path}/job.yaml",
                             python=sys.executable, command=command)
    script = tmp_path / f"{name}.sh"
    script.write_text(rendered.text)
    out = subprocess.run(rendered.scheduler.submit_argv(str(script)), capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job_id = rendered.scheduler.parse_job_id(out.stdout)
    return job_id, tmp_path / f"slurm-{job_id}.out"


def test_submitted_script_runs_two_ranks_to_completed(slurm_up: None, tmp_path: Path) -> None:
    code = "import os; print('rank', os.environ['SLURM_PROCID'], 'of', os.environ['SLURM_NTASKS'], flush=True)"
    job_id, log = _submit(tmp_path, [sys.executable, "-c", code], "run")
    try:
        state = _wait_for(job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}, 120)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=20)
    text = log.read_text() if log.exists() else "(no output file)"
    assert state is JobState.COMPLETED, text
    assert sorted(line for line in text.splitlines() if line.startswith("rank ")) == ["rank 0 of 2", "rank 1 of 2"]
    assert "hpctrain: MPI library:" in text
    assert "launcher exited with status 0" in text


def test_batch_shell_forwards_the_checkpoint_signal_to_the_ranks(slurm_up: None, tmp_path: Path) -> None:
    code = ("import os, signal, sys, time\n"
            "def got(sig, frame):\n"
            "    print('rank', os.environ['SLURM_PROCID'], 'checkpointing', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGUSR2, got)\n"
            "print('ready', flush=True)\n"
            "time.sleep(90)\n")
    job_id, log = _submit(tmp_path, [sys.executable, "-c", code], "signal")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if log.exists() and log.read_text().count("ready") == 2:
                break
            time.sleep(1)
        # What Slurm does at --signal=B:USR2@lead: the signal goes to the batch shell only.
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=20)
        state = _wait_for(job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}, 60)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=20)
    text = log.read_text() if log.exists() else "(no output file)"
    assert "SIGUSR2 received, forwarding it to the launcher" in text, text
    assert sorted(line for line in text.splitlines() if "checkpointing" in line) == [
        "rank 0 checkpointing", "rank 1 checkpointing"], text
    assert state is JobState.COMPLETED, text
