"""What goes wrong with nodes, on the cluster of namespace nodes: each ends with one message naming the node and
what happened, never a hang. A job larger than the cluster is refused before it is queued (the profile's limit);
a job larger than the nodes that are up is refused at submission, naming the down node and its reason; a link cut
under a running job makes Slurm give the node up, and the run says which node it lost and goes on elsewhere
from its checkpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import TransportPool
from tests.cluster_support import SITE, Cluster
from tests.slurm_support import scontrol

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]
STEPS = 160  # the link is cut once the first checkpoint (step 20) is written: the ranks stop there at once
SPEC = """name: {name}
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: {steps}, batch_per_rank: 8, lr: 0.05, log_every: 10, seed: 3, collective_timeout_s: 120}}
resources: {{nodes: {nodes}, ranks_per_node: 1, walltime: "00:10:00"}}
checkpoint: {{every_steps: 20, keep: 2, max_requeues: 2}}
"""


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("hpctrain: warning")]
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert len([ln for ln in lines if ln.startswith("hpctrain: error")]) == 1, out.stderr
    return out.stderr


@pytest.fixture
def home(cluster_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCTRAIN_HOME", str(cluster_tmp / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    return cluster_tmp


def queued(name: str) -> str:
    return subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=15).stdout


def test_more_nodes_than_the_cluster_has_is_refused_before_the_queue(home: Path, cluster: Cluster) -> None:
    (home / "big.yaml").write_text(SPEC.format(name="too-big", steps=5, nodes=len(cluster.nodes) + 1))
    for args in (["jobs", "validate", "big.yaml"], ["submit", "big.yaml", "--run-root", str(home / "runs")]):
        err = one_line_error(cli(home, *args, "--site", str(SITE)))
        assert f"{len(cluster.nodes) + 1} nodes" in err and f"{len(cluster.nodes)}" in err and "cluster" in err, err
    assert queued("too-big") == "" and not (home / "runs").exists()


def test_a_job_larger_than_the_nodes_that_are_up_is_refused_naming_the_down_one(home: Path,
                                                                                cluster: Cluster) -> None:
    down = cluster.nodes[-1]
    # The node dies first: a DOWN node whose slurmd still answers is back in service at its next registration
    # (ReturnToService=2, slurmctld asks DOWN nodes to register every ping interval), maybe before the submit.
    cluster.kill(down)
    cluster.drain(down, "bad DIMM", state="DOWN")
    cluster.wait_for_node(down, ["down"], timeout=60)
    size = len(cluster.nodes)
    (home / "all.yaml").write_text(SPEC.format(name="all-nodes", steps=5, nodes=size))
    err = one_line_error(cli(home, "submit", "all.yaml", "--site", str(SITE), "--run-root", str(home / "runs")))
    assert f"asks for {size} nodes" in err and f"{size - 1} of {size} nodes usable" in err, err
    assert re.search(rf"{down} down\*? \(bad DIMM\)", err) and f"--nodes {size - 1}" in err, err
    assert queued("all-nodes") == ""
    # One node fewer fits the nodes that are up: accepted, and Slurm starts it without the down node.
    out = cli(home, "submit", "all.yaml", "--site", str(SITE), "--run-root", str(home / "runs"), "--nodes",
              str(size - 1), "--command", "true")
    assert out.returncode == 0, out.stderr
    run_id, job_id = out.stdout.split()[:2]
    assert RunHandle(run_id).wait(timeout=600, poll_s=2, max_poll_s=5).state == "completed"
    assert down not in expand(scontrol(job_id)["NodeList"])


def test_a_link_cut_under_a_running_job_names_the_node_and_the_run_goes_on(home: Path, cluster: Cluster) -> None:
    spec = home / "cut.yaml"
    spec.write_text(SPEC.format(name="cut-link", steps=STEPS, nodes=2))
    with RunRegistry() as reg:
        done = submit_runs(spec, str(SITE), registry=reg, run_root=str(home / "runs"))
    run, job_id = done.runs[0], done.job_ids[0]
    assert job_id is not None
    checkpoints = Path(run.run_dir) / "checkpoints" / "manifest.json"
    pool = TransportPool()
    try:
        deadline = time.monotonic() + 600
        while not checkpoints.exists():  # a hang guard: the job may wait behind others
            assert time.monotonic() < deadline and scontrol(job_id).get("JobState") in ("PENDING", "RUNNING")
            time.sleep(0.5)
        first = scontrol(job_id)["NodeList"]
        lost = expand(first)[-1]
        cluster.link(lost, "cut")
        # Slurm gives the node up after SlurmdTimeout (30 s), ends the run and starts the job again without it.
        words = f"a node failure ({lost} stopped answering the scheduler)"
        seen: list[str] = []
        deadline = time.monotonic() + 300
        with RunRegistry() as reg:
            while not any(words in s for s in seen):
                assert time.monotonic() < deadline, seen
                (view,) = poll_runs(reg, [reg.get_run(run.run_id)], pool)
                seen.append(f"{view.state}: {view.reason}")
                time.sleep(1)
        view = RunHandle(run.run_id, pool=pool).wait(timeout=600, poll_s=1, max_poll_s=3)
    finally:
        subprocess.run(["scancel", job_id], timeout=15)
    assert view.state == "completed", (view, seen)
    assert any(s.startswith(("pending: requeued after " + words, "running: restart 1 of 2, after " + words))
               for s in seen), seen
    assert lost not in expand(scontrol(job_id)["NodeList"])  # the second run went on without it
    log = (Path(run.run_dir) / f"slurm-{job_id}.out").read_text()
    assert "resumed from" in log and f"training finished at step {STEPS}" in log, log[-3000:]
    listed = json.loads(cli(home, "runs", "--json").stdout)
    (chain,) = [r["chain"] for r in listed if r["run_id"] == run.run_id]
    assert chain[0]["state"] == "requeued" and words in chain[0]["state_reason"], chain
    out = cli(home, "status", run.run_id)
    assert out.returncode == 0 and "COMPLETED" in out.stdout, out.stdout + out.stderr


def expand(nodelist: str) -> list[str]:
    from hpctrain.node_lists import expand_slurm_nodelist

    return expand_slurm_nodelist(nodelist)
