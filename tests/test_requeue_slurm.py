"""Walltime signal → checkpoint → ``scontrol requeue`` → resume, on 4 nodes of the cluster of namespace nodes
(ci-cluster site), and what ends a job on the single node (ci-slurm site) without a requeue.

How the walltime test stays deterministic. slurmctld checks time limits every 30 s (PERIODIC_TIMEOUT) and
sends ``--signal=B:USR2@LEAD`` at the first check where the remaining time is at most LEAD + 30 s, so with a
1-minute walltime the signal can come 0–30 s after the start — possibly before the ranks have installed
their handler. So the job is submitted with 10 minutes and its ranks hold after step 100 until a stop signal
comes (the test hook ``HPCTRAIN_HOLD_AT_STEP``); once metrics.jsonl shows step 100 the test shortens the job's
time limit with ``scontrol update TimeLimit=`` (what a user may do to their own job, or an admin before a
maintenance) so that 60–120 s remain: with LEAD = 90 s the next check (≤ 30 s later) signals the job, and the
kill comes ≥ 30 s after that. After the requeue the test gives the pending job its 10 minutes back, and the
ranks vote on a stop only every 50 steps, so the second run finishes its last 50 steps however slowly it
trains. Nothing here depends on how fast this machine is; the uninterrupted reference runs at the same time
under mpiexec.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_support import scontrol, seconds

from hpctrain.checkpoint.session import HOLD_AT_STEP_ENV
from hpctrain.node_lists import expand_slurm_nodelist
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import TransportPool
from tests.cluster_support import SITE, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parent.parent
SPEC = """name: {name}
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: {steps}, batch_per_rank: 8, lr: 0.05, log_every: 50, seed: 3, collective_timeout_s: 60}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:10:00"}}
checkpoint: {{every_steps: 100000, keep: 2, max_requeues: 2, signal_lead_s: 90, stop_check_every: 50}}
{extra}"""
CLUSTER_SPEC = SPEC.replace("nodes: 1, ranks_per_node: 2", "nodes: 4, ranks_per_node: 1")
HELD, STEPS = 100, 150


def last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def final_state(run_dir: Path) -> dict[str, Any]:
    import torch

    manifest = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())
    newest = max(manifest["checkpoints"], key=lambda c: c["step"])
    return torch.load(run_dir / "checkpoints" / newest["dir"] / "shared.pt", weights_only=False)


def assert_same_parameters(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert a["step"] == b["step"]
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"parameter {name} differs"
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for key in sa:
        for field, value in sa[key].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, sb[key][field]), f"optimizer state {key}.{field} differs"


def test_walltime_signal_checkpoints_requeues_on_other_nodes_and_finishes_bit_exact(
        cluster: Cluster, cluster_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 4 real nodes x 1 rank (the cluster of namespace nodes). While the job waits to start again, one node of
    its first allocation is drained, so the requeued job lands on another set of nodes (the spare one among them),
    with node-local storage that holds nothing of the first run. The uninterrupted reference runs on the cluster
    too, as 4 ranks on 4 nodes: the same reduction order, so the final parameters must be equal bit for bit."""
    monkeypatch.setenv("HPCTRAIN_HOME", str(cluster_tmp / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    spec = cluster_tmp / "rq.yaml"
    spec.write_text(CLUSTER_SPEC.format(name="rq-cluster", steps=STEPS,
                                        extra=f"env: {{{HOLD_AT_STEP_ENV}: '{HELD}'}}\n"))
    (cluster_tmp / "ref.yaml").write_text(CLUSTER_SPEC.format(name="rq-reference", steps=STEPS, extra=""))
    runs = str(cluster_tmp / "runs")
    with RunRegistry() as reg:
        done = submit_runs(spec, str(SITE), registry=reg, run_root=runs)
        reference = submit_runs(cluster_tmp / "ref.yaml", str(SITE), registry=reg, run_root=runs)
    run, job_id = done.runs[0], done.job_ids[0]
    assert job_id is not None
    run_dir = Path(run.run_dir)
    try:
        # Hang guards, not speed checks: the job may wait behind other jobs, and each step waits on an event.
        deadline = time.monotonic() + 600
        while last_step(run_dir / "metrics.jsonl") < HELD:
            assert time.monotonic() < deadline, f"training never reached step {HELD}: {scontrol(job_id)}"
            assert scontrol(job_id).get("JobState") in ("PENDING", "RUNNING"), scontrol(job_id)
            time.sleep(0.5)
        first_nodes = expand_slurm_nodelist(scontrol(job_id)["NodeList"])
        assert len(first_nodes) == 4 and set(first_nodes) <= set(cluster.nodes), first_nodes
        # The ranks hold after step HELD now. Shorten the walltime so that 60-120 s remain (see the module docstring).
        elapsed = seconds(scontrol(job_id)["RunTime"])
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={elapsed // 60 + 2}"], check=True,
                       timeout=15)
        pool = TransportPool()
        deadline = time.monotonic() + 300
        with RunRegistry() as reg:
            while int(scontrol(job_id).get("Restarts", "0")) < 1:
                assert time.monotonic() < deadline, f"never requeued: {scontrol(job_id)}"
                assert last_step(run_dir / "metrics.jsonl") < STEPS, "training finished before the signal came"
                poll_runs(reg, [reg.get_run(run.run_id)], pool)
                time.sleep(0.5)
        # Back in the queue (held ~12 s): one of its nodes leaves, and it gets its 10 minutes back.
        cluster.drain(first_nodes[0], "test: the requeued job must land elsewhere")
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], check=True, timeout=15)
        view = RunHandle(run.run_id, pool=pool).wait(timeout=600, poll_s=1, max_poll_s=3)
        ref_view = RunHandle(reference.runs[0].run_id, pool=pool).wait(timeout=600, poll_s=1, max_poll_s=3)
    finally:
        subprocess.run(["scancel", job_id, *(j for j in reference.job_ids if j)], timeout=15)

    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert view.state == "completed", log[-3000:]
    assert ref_view.state == "completed", ref_view
    assert f"holding after step {HELD} until a stop signal" in log
    assert "SIGUSR2 received, forwarding it to the launcher" in log
    assert set(re.findall(r"stopped at step (\d+) after a checkpoint", log)) == {str(HELD)}, log[-3000:]
    assert "launcher exited with status 75" in log
    assert "putting the job back in the queue (restart 1 of 2)" in log
    assert f"(step {HELD})" in log and "resumed from" in log
    assert f"training finished at step {STEPS}" in log
    # The second run's ranks on another set of nodes: the drained one is gone, the spare one came in.
    second_nodes = expand_slurm_nodelist(scontrol(job_id)["NodeList"])
    last_attempt = log.rsplit("hpctrain: job ", 1)[-1]
    assert sorted(set(re.findall(r"hpctrain: node \d+ \((\S+)\)", last_attempt))) == sorted(second_nodes)
    assert first_nodes[0] not in second_nodes and set(second_nodes) - set(first_nodes), (first_nodes, second_nodes)
    # Training that finished is not requeued again; the registry holds the whole chain.
    assert scontrol(job_id)["Restarts"] == "1" and scontrol(job_id)["JobState"] == "COMPLETED"
    with RunRegistry() as reg:
        chain = reg.chain(run.run_id)
    assert [(s.kind, s.job_id) for s in chain] == [("submit", job_id), ("requeue", job_id)]
    assert chain[-1].state == "completed" and chain[-1].restart_count == 1 and chain[-1].exit_code == 0
    assert_same_parameters(final_state(run_dir), final_state(Path(reference.runs[0].run_dir)))


@pytest.mark.usefixtures("isolated_home")
def test_code_error_fails_without_requeue(tmp_path: Path, slurm: Any) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    # A model whose forward raises on its third call: a bug, not a walltime.
    (plugin / "boommodel.py").write_text(
        "import torch\n\n\nclass Boom(torch.nn.Linear):\n    calls = 0\n\n    def forward(self, x):\n"
        "        Boom.calls += 1\n        if Boom.calls == 3:\n            raise RuntimeError('a bug in the model "
        "at step 3')\n        return super().forward(x)\n\n\ndef factory():\n    return Boom(16, 1)\n")
    spec = tmp_path / "boom.yaml"
    spec.write_text(SPEC.format(name="boom", steps=50, extra=f"env: {{PYTHONPATH: {plugin}}}\n")
                    .replace("model: resnet", "model: boommodel:factory")
                    .replace("model_args: {channels: 8, blocks: 1}\n", ""))
    with RunRegistry() as reg:
        done = submit_runs(spec, "ci-slurm", registry=reg)
    run, job_id = done.runs[0], done.job_ids[0]
    assert job_id is not None
    view = RunHandle(run.run_id).wait(timeout=120, poll_s=1, max_poll_s=3)
    log = (Path(run.run_dir) / f"slurm-{job_id}.out").read_text()
    assert view.state == "failed", log[-3000:]
    assert "a bug in the model at step 3" in log
    assert "putting the job back in the queue" not in log
    # hpctrain reads the run as failed from its exit record while Slurm may still be COMPLETING the job
    slurm.wait_for_state(job_id, ["FAILED"], timeout=60)
    info = scontrol(job_id)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0"
    # rank 0's exception, then srun's status: 1, or 137 where it killed the peer still running (as the log prints)
    assert re.search(r"; (exit code 1|exit status 137)$", view.reason), view.reason
    out = subprocess.run([str(REPO / ".venv/bin/python"), "-m", "hpctrain", "status", run.run_id], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert "FAILED" in out.stdout and re.search(r"exit code 1|exit status 137", out.stdout), out.stdout + out.stderr


@pytest.mark.usefixtures("isolated_home")
def test_a_stop_reported_as_a_signal_by_srun_is_still_requeued(tmp_path: Path, slurm: Any) -> None:
    """srun --kill-on-bad-exit ends a step when its first task exits non-zero: the ranks of a stop exit 75 a
    moment apart, so srun kills the later ones and reports 143 (seen in CI: the walltime test's job FAILED with
    143, never requeued). Rank 0 writes the requeue marker before any rank exits; the script then requeues.
    Here the ranks are a two-line command on the real Slurm: rank 0 writes the marker and exits 75 at once,
    rank 1 is still busy (one process, so srun's SIGTERM ends it and nothing of it exits by itself); after the
    requeue both exit 0."""
    spec = tmp_path / "late.yaml"
    spec.write_text(SPEC.format(name="late-rank", steps=10, extra=""))
    command = ["bash", "-c", 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then exit 0; fi; '
               'if [ "${SLURM_PROCID}" = 0 ]; then echo "{}" > stopped-for-requeue.json; exit 75; fi; '
               "exec sleep 120"]
    with RunRegistry() as reg:
        done = submit_runs(spec, "ci-slurm", registry=reg, command=command)
    run, job_id = done.runs[0], done.job_ids[0]
    assert job_id is not None
    view = RunHandle(run.run_id).wait(timeout=200, poll_s=1, max_poll_s=3)
    log = (Path(run.run_dir) / f"slurm-{job_id}.out").read_text()
    assert view.state == "completed", log[-3000:]
    assert "treated as 75" in log and "putting the job back in the queue (restart 1 of 2)" in log, log[-3000:]
    assert scontrol(job_id)["Restarts"] == "1"
    records = [json.loads(line) for line in (Path(run.run_dir) / "job-exit.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records if r["event"] == "exit"] == [75, 0]
