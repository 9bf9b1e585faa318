"""A bad node costs one restart, not the run — on the cluster of namespace nodes (real slurmd per node, own /tmp and
link). The node check runs in every job of more than one node: a node whose /tmp is full is named by it and,
with a spare node, left out before training starts; without one the job ends at once naming it, before any rank
started. A node killed under a running job is named (the scheduler lost it), the requeued job runs without it
and resumes from the last checkpoint, and its final weights equal those of a run that was never interrupted.

The allocation is pinned with ``nodelist`` so that the bad node is in it whatever Slurm would pick.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_support import scontrol

from hpctrain.node_lists import expand_slurm_nodelist
from hpctrain.nodes.blame import read_blames
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import TransportPool
from hpctrain.submission.views import RunView
from tests.cluster_support import SITE, Cluster
from tests.test_requeue_slurm import assert_same_parameters, final_state

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]
SPEC = """name: {name}
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: {steps}, batch_per_rank: 8, lr: 0.05, log_every: 10, seed: 3, collective_timeout_s: 120}}
resources: {{nodes: 2, ranks_per_node: 1, walltime: "00:10:00", spare_nodes: {spares}{pin}}}
checkpoint: {{every_steps: 20, keep: 2, max_requeues: 2}}
"""


def spec_text(name: str, *, steps: int, spares: int = 0, nodes: tuple[str, ...] = ()) -> str:
    pin = f", directives: {{nodelist: '{','.join(nodes)}'}}" if nodes else ""
    return SPEC.format(name=name, steps=steps, spares=spares, pin=pin)


@pytest.fixture
def home(cluster_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCTRAIN_HOME", str(cluster_tmp / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    return cluster_tmp


def submit(home: Path, name: str, text: str) -> tuple[Path, str, str]:
    spec = home / f"{name}.yaml"
    spec.write_text(text)
    with RunRegistry() as reg:
        done = submit_runs(spec, str(SITE), registry=reg, run_root=str(home / "runs"))
    job_id = done.job_ids[0]
    assert job_id is not None
    return Path(done.runs[0].run_dir), done.runs[0].run_id, job_id


def run_to_end(run_dir: Path, run_id: str, job_id: str) -> tuple[RunView, str]:
    """The run's state once it ended (a hang guard of 600 s) and its job's log."""
    try:
        view = RunHandle(run_id).wait(timeout=600, poll_s=1, max_poll_s=3)
    finally:
        subprocess.run(["scancel", job_id], timeout=15)
    return view, (run_dir / f"slurm-{job_id}.out").read_text()


def wait_for_a_checkpoint(run_dir: Path, job_id: str) -> None:
    """Until the run's first checkpoint is committed: a hang guard (the job may wait behind others)."""
    deadline = time.monotonic() + 600
    while not (run_dir / "checkpoints" / "manifest.json").exists():
        assert time.monotonic() < deadline and scontrol(job_id).get("JobState") in ("PENDING", "RUNNING")
        time.sleep(0.5)


def kill_after_a_checkpoint(cluster: Cluster, run_dir: Path, run: tuple[str, str], reference: tuple[str, str],
                            nodes: Callable[[], list[str]]) -> tuple[list[str], str, str]:
    """Once the run's first checkpoint is committed, kill the last of its ``nodes()``; wait for the run and its
    reference to complete. (the nodes, the one killed, the run's log)."""
    (run_id, job_id), (ref_id, ref_job) = run, reference
    pool = TransportPool()
    try:
        wait_for_a_checkpoint(run_dir, job_id)
        chosen = nodes()
        cluster.kill(chosen[-1])
        view = RunHandle(run_id, pool=pool).wait(timeout=900, poll_s=1, max_poll_s=3)
        ref_view = RunHandle(ref_id, pool=pool).wait(timeout=900, poll_s=1, max_poll_s=3)
    finally:
        subprocess.run(["scancel", job_id, ref_job], timeout=15)
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert view.state == "completed" and ref_view.state == "completed", log[-3000:]
    return chosen, chosen[-1], log


def trained_on(log: str) -> set[str]:
    """The nodes the last attempt's ranks ran on (each node's local rank 0 says so)."""
    last = log.rsplit("hpctrain: job ", 1)[-1]
    return set(re.findall(r"hpctrain: node \d+ \((\S+)\)", last))


def test_a_full_tmp_is_named_by_the_check_and_a_spare_node_takes_its_place(home: Path, cluster: Cluster) -> None:
    good, bad, spare = cluster.nodes[0], cluster.nodes[1], cluster.nodes[2]
    cluster.fill_tmp(bad)
    run_dir, run_id, job_id = submit(home, "spare", spec_text("spare", steps=30, spares=1, nodes=(good, bad, spare)))
    view, log = run_to_end(run_dir, run_id, job_id)
    assert view.state == "completed", log[-3000:]
    assert set(expand_slurm_nodelist(scontrol(job_id)["NodeList"])) == {good, bad, spare}
    assert trained_on(log) == {good, spare}, log[-3000:]
    assert re.search(rf"node check: {bad} left out: /tmp: cannot write .*No space left on device", log), log[-3000:]
    results = json.loads((run_dir / "node-check.json").read_text())
    assert results["training"] == [good, spare] and list(results["failed"]) == [bad], results
    assert set(results["reports"]) == {good, bad, spare}  # one report per node, gathered in one file
    assert results["reports"][good]["problems"] == [] and results["reports"][good]["import_s"] > 0
    (blame,) = read_blames(run_dir)
    assert blame.node == bad and blame.source == "check" and "/tmp" in blame.cause and blame.job == job_id
    assert "training finished at step 30" in log


def test_without_a_spare_a_failed_check_ends_the_job_before_training_naming_the_node(
        home: Path, cluster: Cluster) -> None:
    good, bad = cluster.nodes[0], cluster.nodes[1]
    cluster.fill_tmp(bad)
    run_dir, run_id, job_id = submit(home, "nospare", spec_text("nospare", steps=30, nodes=(good, bad)))
    view, log = run_to_end(run_dir, run_id, job_id)
    assert view.state == "failed", log[-3000:]
    assert view.reason.startswith(f"node check: {bad}: /tmp: cannot write"), view.reason
    assert "1 healthy node for 2 needed, no training started" in view.reason, view.reason
    assert scontrol(job_id)["ExitCode"].startswith("5:"), scontrol(job_id)
    # Nothing started, nothing half-written: no rank line, no metrics, no checkpoint directory.
    assert "hpctrain: node 0 (" not in log and not (run_dir / "metrics.jsonl").exists(), log[-3000:]
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "training-nodes").exists()
    assert [b.node for b in read_blames(run_dir)] == [bad]


def test_a_node_killed_mid_run_is_named_left_out_and_the_run_ends_as_if_uninterrupted(
        home: Path, cluster: Cluster) -> None:
    steps = 160  # the node dies once the first checkpoint (step 20) is written: the surviving rank waits there
    run_dir, run_id, job_id = submit(home, "killed", spec_text("killed", steps=steps))
    ref_dir, ref_id, ref_job = submit(home, "reference", spec_text("reference", steps=steps))
    # Not the batch host: the job's script outlives the node and Slurm requeues the job.
    first, lost, log = kill_after_a_checkpoint(cluster, run_dir, (run_id, job_id), (ref_id, ref_job),
                                               lambda: expand_slurm_nodelist(scontrol(job_id)["NodeList"]))
    assert int(scontrol(job_id)["Restarts"]) >= 1
    second = trained_on(log)
    assert lost not in second and len(second) == 2, (first, second)
    blames = [b for b in read_blames(run_dir) if b.node == lost]
    assert blames and blames[0].source == "scheduler" and "lost it" in blames[0].cause, read_blames(run_dir)
    assert "resumed from" in log and f"training finished at step {steps}" in log, log[-3000:]
    assert_same_parameters(final_state(run_dir), final_state(ref_dir))


def test_a_node_on_a_slow_link_is_named_a_straggler_and_the_next_restart_leaves_it_out(
        home: Path, cluster: Cluster) -> None:
    """3 nodes train and 1 is spare; one training node's link runs at a tenth of the others' rate. The straggler
    watch names it within 200 steps (metrics, log, status); the checkpoint signal then stops the job, Slurm
    requeues it with the node excluded (a spare exists), and the run finishes without it."""
    first, second, slow, spare, out = cluster.nodes[:5]
    cluster.drain(out, "test: the first allocation is the four others")
    for node in (first, second, spare):
        cluster.link(node, "rate", "500mbit")
    cluster.link(slow, "rate", "50mbit")
    text = spec_text("straggler", steps=600, spares=1).replace("nodes: 2,", "nodes: 3,")
    run_dir, run_id, job_id = submit(home, "straggler", text)
    pool = TransportPool()
    seen: list[str] = []
    try:
        named: dict[str, object] | None = None
        deadline = time.monotonic() + 900
        while named is None:  # a hang guard; the step count below is the check
            assert time.monotonic() < deadline and scontrol(job_id).get("JobState") in ("PENDING", "RUNNING"), seen
            records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()
                       if ln.strip()] if (run_dir / "metrics.jsonl").exists() else []
            named = next((r for r in records if r.get("stragglers")), None)
            with RunRegistry() as reg:
                (view,) = poll_runs(reg, [reg.get_run(run_id)], pool)
            seen.append(view.reason)
            time.sleep(1)
        assert [s["node"] for s in named["stragglers"]] == [slow], named  # type: ignore[index]
        assert named["step"] <= 200 and named["stragglers"][0]["what"] == "link", named  # type: ignore[index]
        with RunRegistry() as reg:
            (view,) = poll_runs(reg, [reg.get_run(run_id)], pool)
        assert f"straggler {slow}" in view.reason, view.reason
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=15)
        deadline = time.monotonic() + 300
        while int(scontrol(job_id).get("Restarts", "0")) < 1:
            assert time.monotonic() < deadline, f"never requeued: {scontrol(job_id)}"
            time.sleep(0.5)
        subprocess.run(["scontrol", "update", f"NodeName={out}", "State=RESUME"], check=True, timeout=15)
        view = RunHandle(run_id, pool=pool).wait(timeout=900, poll_s=1, max_poll_s=3)
    finally:
        subprocess.run(["scancel", job_id], timeout=15)
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert view.state == "completed", log[-3000:]
    # The script hands Slurm the excluded nodes with the requeue (a pending job takes them, a running one does not).
    # The requeue also ends the script, which may win that race on a loaded machine: the next attempt's node check
    # then leaves the straggler out in its turn (a spare takes its place). Either is the product's doing.
    excluded = scontrol(job_id).get("ExcNodeList", "(null)").replace("(null)", "")
    excluded_by_slurm = slow in expand_slurm_nodelist(excluded)
    assert re.search(rf"straggler at step \d+: node {slow}", log), log[-3000:]
    assert slow not in trained_on(log) and len(trained_on(log)) == 3, log[-3000:]
    last = log.rsplit("hpctrain: job ", 1)[-1]
    assert excluded_by_slurm or f"node check: {slow} left out: blamed earlier in this run (straggler:" in last, last
    slow_blames = [b for b in read_blames(run_dir) if b.node == slow]
    assert slow_blames and slow_blames[0].kind == "slow" and slow_blames[0].source == "straggler"
    assert "resumed from" in log and "training finished at step 600" in log


def test_with_a_spare_a_node_killed_mid_run_is_replaced_inside_the_allocation(home: Path, cluster: Cluster) -> None:
    """2 nodes train and 1 is spare (Slurm --no-kill: a lost node ends the step, not the allocation). One training
    node is killed after the first checkpoint: the script blames it, starts the ranks again on the spare from the
    checkpoint without going back to the queue, and the final weights equal an uninterrupted run's."""
    steps = 160
    first, second, spare = cluster.nodes[:3]
    run_dir, run_id, job_id = submit(home, "relaunch",
                                     spec_text("relaunch", steps=steps, spares=1, nodes=(first, second, spare)))
    ref_dir, ref_id, ref_job = submit(home, "reference", spec_text("reference", steps=steps))
    training, killed, log = kill_after_a_checkpoint(cluster, run_dir, (run_id, job_id), (ref_id, ref_job),
                                                    lambda: (run_dir / "training-nodes").read_text().split())
    assert training == [first, second] and killed == second, training
    assert scontrol(job_id)["Restarts"] == "0", scontrol(job_id)  # never back in the queue
    assert "starting the ranks again from the last checkpoint (relaunch 1 of 1)" in log, log[-3000:]
    after = log.split("(relaunch 1 of 1)", 1)[1]
    assert set(re.findall(r"hpctrain: node \d+ \((\S+)\)", after)) == {first, spare}, log[-3000:]
    blames = [b for b in read_blames(run_dir) if b.node == second]
    assert blames and blames[0].kind == "failed", read_blames(run_dir)
    assert first not in {b.node for b in read_blames(run_dir)}  # the survivor srun ended is not blamed
    assert "resumed from" in after and f"training finished at step {steps}" in after, log[-3000:]
    assert_same_parameters(final_state(run_dir), final_state(ref_dir))
