"""The FFN on 4 real nodes x 1 rank (the cluster of namespace nodes), then resumed on 2: one start-up line per
node naming its host, a checkpoint of one file per node, ``hpctrain report`` with a row per node's rank and its
host, and ``hpctrain resume RUN --nodes 2`` continuing from that checkpoint on two nodes (an elastic restart:
correct, not bit-exact), its next checkpoint written as two node files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.checkpoint.session import STOP_AT_STEP_ENV
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from tests.cluster_support import SITE, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parent.parent
STOP, STEPS = 150, 250
SPEC = f"""name: ffn-cluster
model: ffn
model_args: {{depth: 1, features: 4, fov: [9, 9, 9], deltas: [2, 2, 2]}}
data:
  train: {{synthetic: {{shape: [24, 48, 48], seed: 1}}}}
train: {{steps: {STEPS}, batch_per_rank: 2, lr: 0.01, log_every: 25, seed: 2}}
resources: {{nodes: 4, ranks_per_node: 1, walltime: "00:20:00"}}
checkpoint: {{every_steps: 50, keep: 2, max_requeues: 0}}
env: {{{STOP_AT_STEP_ENV}: "{STOP}"}}
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def newest_checkpoint(run_dir: Path) -> tuple[dict, list[str]]:
    manifest = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())
    entry = max(manifest["checkpoints"], key=lambda c: c["step"])
    return entry, sorted(p.name for p in (run_dir / "checkpoints" / entry["dir"]).iterdir())


def startup_hosts(log: str) -> dict[int, str]:
    """node index -> host, from the start-up lines of the log's last attempt."""
    last = log.rsplit("hpctrain: job ", 1)[-1]
    return {int(n): host for n, host in re.findall(r"hpctrain: node (\d+) \((\S+)\): 1 ranks", last)}


def test_ffn_on_four_nodes_reports_per_node_and_resumes_on_two(cluster: Cluster, cluster_tmp: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCTRAIN_HOME", str(cluster_tmp / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    spec = cluster_tmp / "ffn.yaml"
    spec.write_text(SPEC)
    with RunRegistry() as reg:
        run = submit_runs(spec, str(SITE), run_root=str(cluster_tmp / "runs"), registry=reg).runs[0]
    handle = RunHandle(run.run_id)
    view = handle.wait(timeout=900, poll_s=2.0, max_poll_s=5.0)
    run_dir = Path(run.run_dir)
    log = handle.logs()
    # Stopped at its checkpoint (as a walltime warning would stop it) and, with no requeue allowed, waits there.
    assert f"stopped at step {STOP} after a checkpoint" in log, log[-3000:]
    assert view.state != "completed", view

    first = startup_hosts(log)
    assert sorted(first) == [0, 1, 2, 3] and len(set(first.values())) == 4, log[-3000:]
    assert set(first.values()) <= set(cluster.nodes)
    entry, files = newest_checkpoint(run_dir)
    assert entry["step"] == STOP and entry["world_size"] == 4
    assert entry["nodes"] == {**entry["nodes"], "count": 4, "ranks_per_file": 1}
    assert len([f for f in files if f.startswith("node-")]) == 4 and "shared.pt" in files, files

    page = cluster_tmp / "report.html"
    out = cli("report", run.run_id, "-o", str(page), cwd=cluster_tmp)
    assert out.returncode == 0, out.stderr
    html = page.read_text()
    for rank, host in first.items():  # each node's rank by its own host in the busy-time rows
        assert f"rank {rank} ({host})" in html, (rank, host)

    out = cli("resume", run.run_id, "--nodes", "2", "--wait", cwd=cluster_tmp)
    assert out.returncode == 0, out.stdout + out.stderr
    log = handle.logs()
    assert f"(step {STOP})" in log and "resumed from" in log, log[-3000:]
    assert f"training finished at step {STEPS}" in log
    second = startup_hosts(log)
    assert sorted(second) == [0, 1] and len(set(second.values())) == 2 and set(second.values()) <= set(cluster.nodes)
    entry, files = newest_checkpoint(run_dir)
    assert entry["step"] == STEPS and entry["world_size"] == 2 and entry["nodes"]["count"] == 2
    assert len([f for f in files if f.startswith("node-")]) == 2, files
    assert handle.status().state == "completed"
