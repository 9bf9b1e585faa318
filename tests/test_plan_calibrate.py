"""``hpctrain plan --calibrate`` end to end on the real components of this machine (the ``local`` site and the
real single-node Slurm of ``ci-slurm``), and ``--from RUN`` of a run registered on a remote login node (the
loopback sshd): one command over the run's ssh connection reads its profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.site import load_site
from hpctrain.planning.calibrate import calibration_overrides, smallest_queue
from hpctrain.planning.runs import read_run
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.run_record import META_FILE, record_dir
from hpctrain.submission.transport import Completed, SSHTransport, TransportPool
from tests.conftest import TinyJob
from tests.transport_record import as_recorded

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path: Path, tiny_job: TinyJob) -> dict[str, str]:
    tiny_job(steps=500)
    return {**os.environ, "HPCTRAIN_HOME": str(tmp_path / "home"), "HPCTRAIN_RUNS": str(tmp_path / "runs")}


def plan(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", "plan", *args], capture_output=True, text=True,
                          cwd=REPO, env={k: v for k, v in env.items() if k != "HPCTRAIN_REGISTRY"}, timeout=900)


def test_smallest_queue_and_overrides() -> None:
    theta = load_site("theta")
    assert smallest_queue(theta) == "debug-cache-quad"  # 8 nodes, 1 h (tied with debug-flat-quad: by name)
    sets = calibration_overrides(theta, 20)
    assert "resources.queue=debug-cache-quad" in sets and "resources.walltime=00:15:00" in sets
    assert "resources.nodes=1" in sets and "train.steps=20" in sets
    assert smallest_queue(load_site("local")) is None and not any("queue" in s for s in
                                                                    calibration_overrides(load_site("local"), 9))


def test_overrides_make_a_valid_job_of_one_with_a_long_warm_up() -> None:
    """The demo job warms up for 50 steps with a cosine decay after: 8 calibration steps must still validate."""
    from hpctrain.config.job import load_job
    from hpctrain.config.preflight import check_job

    job = load_job(REPO / "jobs" / "ffn-local.yaml", sets=calibration_overrides(load_site("local"), 8))
    assert job.train.steps == 8 and job.train.warmup.kind == "none" and job.train.decay.kind == "none"
    check_job(job, load_site("local"), local_paths=True)


def _check_calibrated(out: subprocess.CompletedProcess[str], site: str) -> None:
    assert out.returncode == 0, out.stderr[-3000:]
    assert "calibration run: tiny-" in out.stderr
    data = json.loads(out.stdout)
    compute = data["parameters"]["compute_s"]
    assert compute["source"] == "measured" and compute["value"] > 0 and "run tiny-" in compute["detail"]
    assert data["site"] == site and data["predictions"][0]["nodes"] == 1
    assert data["parameters"]["grad_bytes"]["value"] > 0


@pytest.mark.processes
def test_calibrate_on_the_local_site(home: dict[str, str], tmp_path: Path) -> None:
    out = plan(home, str(tmp_path / "tiny.yaml"), "--site", "local", "--calibrate", "--calibration-steps", "8",
               "--json")
    _check_calibrated(out, "local")


@pytest.mark.processes
@pytest.mark.parametrize("args,words", [
    (("--nodes", "1,8"), ("--nodes 8", "site 'local' has 1 nodes")),
    (("--set", "latency_us=-1"), ("latency_us",)),
    (("--set", "latency_usx=2"), ("latency_usx", "not a planner parameter")),
    (("--plot", "scaling.pdf"), ("--plot scaling.pdf", ".png")),
])
def test_calibrate_refuses_what_needs_no_measurement_before_it_submits(home: dict[str, str], tmp_path: Path,
                                                                       args: tuple[str, ...],
                                                                       words: tuple[str, ...]) -> None:
    """A plan that cannot be made is refused with one message before the calibration run is submitted: on a
    real site that run would wait in a queue and take an allocation for nothing."""
    out = plan(home, str(tmp_path / "tiny.yaml"), "--site", "local", "--calibrate", "--calibration-steps", "8",
               *args)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: error: "), out.stderr[-3000:]
    assert all(word in lines[0] for word in words), lines[0]
    registry = Path(home["HPCTRAIN_HOME"]) / "registry.db"
    if registry.exists():
        with RunRegistry(registry) as reg:
            assert reg.list_runs() == []  # nothing registered, so nothing submitted
    assert not Path(home["HPCTRAIN_RUNS"]).exists()


@pytest.mark.slurm
def test_calibrate_on_the_real_slurm(home: dict[str, str], tmp_path: Path, slurm: Any) -> None:
    out = plan(home, str(tmp_path / "tiny.yaml"), "--site", "ci-slurm", "--calibrate", "--calibration-steps", "8",
               "--json")
    _check_calibrated(out, "ci-slurm")
    assert json.loads(out.stdout)["parameters"]["backend"]["value"] == "mpi"



class CountingSSH(SSHTransport):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **kw: Any) -> Completed:
        self.calls.append(as_recorded(argv, kw))
        return super().run(argv, **kw)


def test_from_a_remote_run_reads_over_one_ssh_command(tmp_path: Path, sshd: Any, short_dir: Path) -> None:
    run_dir = tmp_path / "remote-run"  # the loopback login node sees this machine's files
    run_dir.mkdir()
    profile = {"version": 1, "ranks": 1, "ranks_per_node": 1, "threads_per_rank": 1, "backend": "mpi",
               "combiner": "mean", "samples_per_step": 2, "sample_unit": "samples",
               "compute_s": {"mean": 0.2, "std": 0.01, "count": 9}, "input_s": {"mean": 0.0, "std": 0.0, "count": 9},
               "reduction_wait_s": {"mean": 0.0, "std": 0.0, "count": 9},
               "step_s": {"mean": 0.2, "std": 0.01, "count": 9}, "overlap_window_s": 0.0,
               "buckets": [{"bytes": 1000, "lead_s": 0.0}]}
    (run_dir / "profile.json").write_text(json.dumps(profile))
    made: list[CountingSSH] = []

    def factory(remote: str | None, cfg: str | None) -> CountingSSH:
        made.append(CountingSSH(remote, ssh_config=cfg, control_dir=str(short_dir), connect_timeout=5))
        return made[-1]

    with RunRegistry(tmp_path / "registry.db") as reg:
        run = reg.create_run("tiny", "ci-slurm", "0" * 16, str(run_dir), remote=sshd.host)
        record_dir(reg, run.run_id).mkdir(parents=True)
        (record_dir(reg, run.run_id) / META_FILE).write_text(
            json.dumps({"scheduler": "slurm", "ssh_config": str(sshd.config)}))
        pool = TransportPool(factory)
        try:
            m = read_run(run.run_id, reg, pool)
            assert m.compute.mean == 0.2 and m.where == f"run {run.run_id}: {sshd.host}:{run_dir}/profile.json"
            assert len(made) == 1 and len(made[0].calls) == 1
            (run_dir / "profile.json").unlink()
            with pytest.raises(Exception, match="has no step profile"):
                read_run(run.run_id, reg, pool)
        finally:
            pool.close(stop_masters=True)
