"""A staged job on the cluster of namespace nodes (fixtures ``cluster``, ``cluster_tmp``): ``hpctrain submit`` packs
this venv, the script sends it with ``sbcast`` to each node's own /local/scratch, unpacks it once per node, copies
the input files there, and 2 nodes x 2 ranks train a few FFN steps importing hpctrain, torch and libpython from
their own node's copy (counted by the audit hook). fanotify counts the opens of the shared files while the job
runs: the archive and each input file once for the whole job (sbcast reads a file on the first node and sends it
to every node's slurmd), and the ranks none. A node that cannot stage ends the job with one message naming it.

The packed environment is this repository's .venv (about 1.7 GB): its archive is kept in a cache on the shared file
system between test runs and reused while the environment and hpctrain's source are unchanged.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpctrain.runtime.counting import counters
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from tests.cluster_support import Cluster, OpenCounter

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parent.parent
ENV_CACHE = Path("/var/tmp/hpctrain-test-env-cache")  # shared: the first node's sbcast reads the archive


@pytest.fixture
def env(cluster_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCTRAIN_HOME", str(cluster_tmp / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    monkeypatch.setenv("HPCTRAIN_RUNS", str(cluster_tmp / "runs"))
    return cluster_tmp


def _site(tmp: Path, node_local: str, **staging: Any) -> Path:
    path = tmp / "staged-cluster.yaml"
    extra = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in staging.items())
    path.write_text(f"name: staged-cluster\nextends: {REPO / 'site_configs' / 'ci-cluster.yaml'}\n"
                    f"staging:\n  node_local_dir: {json.dumps(node_local)}\n{extra}")
    return path


def _ffn_data(shared: Path) -> tuple[Path, Path]:
    """A small training volume and its coordinates, written once on the shared file system."""
    from hpctrain.ffn.training.task import prepare_training_data

    prepared = prepare_training_data({"train": {"synthetic": {"shape": [24, 32, 32], "seed": 3}}}, (9, 9, 9),
                                     (2, 2, 2), shared)
    return Path(prepared["image"].rsplit(":", 1)[0]), Path(prepared["coordinates"])


def _job(tmp: Path, volume: Path, coords: Path, nodes: int, node_check: bool = True) -> Path:
    # /tmp is node-local on these nodes (tempfile's probe goes there): the counter is told so.
    path = tmp / "staged.yaml"
    path.write_text(f"""name: staged
model: ffn
model_args: {{depth: 1, features: 4, fov: [9, 9, 9], deltas: [2, 2, 2]}}
data:
  train: {{image: "{volume}:image", labels: "{volume}:labels"}}
  coordinates: "{coords}"
train: {{steps: 3, batch_per_rank: 1, lr: 0.01, log_every: 1}}
resources: {{nodes: {nodes}, ranks_per_node: 2, walltime: "00:15:00", node_check: {str(node_check).lower()}}}
checkpoint: {{signal_lead_s: 10}}
env: {{HPCTRAIN_COUNTERS: "1", HPCTRAIN_COUNTERS_LOCAL: "/tmp"}}
""")
    return path


def _archive(script: Path) -> Path:
    """The packed environment the job's script sends (its ``hpctrain_archive_link``, resolved)."""
    line = next(ln for ln in script.read_text().splitlines() if ln.startswith("hpctrain_archive_link="))
    (link,) = shlex.split(line.split("=", 1)[1].replace('"$HOME"', str(Path.home())))
    return Path(link).resolve()


@contextlib.contextmanager
def partition_held(cluster: Cluster) -> Iterator[None]:
    """The partition takes jobs but starts none until the block ends (State=DOWN), so that what a test counts
    from the job's start on is not mixed with what ``hpctrain submit`` itself reads."""
    subprocess.run(["scontrol", "update", f"PartitionName={cluster.partition}", "State=DOWN"], check=True, timeout=15)
    try:
        yield
    finally:
        subprocess.run(["scontrol", "update", f"PartitionName={cluster.partition}", "State=UP"], check=True,
                       timeout=15)


def test_each_node_stages_its_own_copy_and_reads_the_shared_files_once(env: Path, cluster: Cluster) -> None:
    volume, coords = _ffn_data(env / "shared")
    site = _site(env, cluster.scratch, environment="archive", data=True, archive_cache=str(ENV_CACHE))
    with contextlib.ExitStack() as counting:
        with RunRegistry() as reg, partition_held(cluster):
            run = submit_runs(_job(env, volume, coords, nodes=2), str(site), registry=reg).runs[0]
            archive = _archive(Path(run.run_dir) / "job.sh")
            counter = counting.enter_context(OpenCounter([archive, volume, coords]))
        handle = RunHandle(run.run_id)
        view = handle.wait(timeout=900, poll_s=2.0, max_poll_s=5.0)
    log = handle.logs()
    assert view.state == "completed", f"{view.state} {view.reason}\n{log[-4000:]}"
    assert "hpctrain: staged on every node in" in log

    records = counters.read_records(run.run_dir)
    hosts = {r["host"]: sorted(q["rank"] for q in records if q["host"] == r["host"]) for r in records}
    assert sorted(hosts.values()) == [[0, 1], [2, 3]] and set(hosts) <= set(cluster.nodes), hosts
    # One start-up line per node, named by the host its ranks really ran on.
    lines = dict(re.findall(r"hpctrain: node \d+ \((\S+)\): 2 ranks (\d+-\d+),", log))
    assert lines == {host: f"{ranks[0]}-{ranks[1]}" for host, ranks in hosts.items()}, log[-3000:]
    job_id = handle.job_id
    root = f"{cluster.scratch}/hpctrain-{job_id}"  # $HPCTRAIN_NODE_LOCAL: one path, a directory on each node
    for node in cluster.nodes:
        local = cluster.local_path(node, root)
        if node not in hosts:
            assert not local.exists(), f"{node} ran no rank but holds {local}"
            continue
        assert (local / "env" / "venv" / "bin" / "python").exists(), node
        assert not (local / "env.tar").exists(), "the sbcast copy of the archive is removed once unpacked"
        copies = {p.name: p.stat().st_size for p in (local / "data").iterdir()}
        assert copies == {f"0-{volume.name}": volume.stat().st_size, f"1-{coords.name}": coords.stat().st_size}
    assert not Path(root).exists()  # nothing landed on the host's (or a shared) /local/scratch

    for record in records:
        where = record["interpreter"]
        assert where["modules"]["hpctrain"].startswith(f"{root}/env/venv/lib/"), where
        assert where["modules"]["torch"].startswith(f"{root}/env/venv/lib/"), where
        assert where["executable"] == f"{root}/env/venv/bin/python"
        assert where["libpython"] is None or where["libpython"].startswith(f"{root}/env/libpython/"), where
        startup = record["marks"]["startup"]
        # Thousands of imports, all from the node's own disk: not one Python file from the shared file system.
        assert startup["opens"]["node_local"] > 500, startup
        assert startup["shared_code_opens"] == 0, record["shared_examples"]
        assert record["shared_opens_outside_run_dir"] == 0, record["shared_examples"]

    # The shared file system: the archive and each input file read once for the whole job (sbcast), and the ranks
    # read none of them (they read their node's copies).
    assert counter.counts == {archive: 1, volume: 1, coords: 1}, counter.counts
    [prepared] = list(Path(run.run_dir).rglob("prepared.json"))
    manifest = json.loads(prepared.read_text())
    assert manifest["image"] == f"{root}/data/0-{volume.name}:image"
    assert manifest["coordinates"] == f"{root}/data/1-{coords.name}"


def test_a_node_that_cannot_stage_ends_the_job_with_its_name(env: Path, cluster: Cluster) -> None:
    volume, coords = _ffn_data(env / "shared")
    blocked = f"{cluster.scratch}/blocked-{env.name}"
    # Every node but the first has a file where the node-local directory should be: whichever two nodes the job
    # gets, one of them cannot stage.
    for node in cluster.nodes[1:]:
        assert cluster.run(node, "sh", "-c", f"echo not a directory > {blocked}").returncode == 0
    try:
        with RunRegistry() as reg:
            # Staging's own refusal (the node check, on by default, would name the node before staging runs).
            run = submit_runs(_job(env, volume, coords, nodes=2, node_check=False), str(_site(env, blocked, data=True)),
                              registry=reg).runs[0]
        handle = RunHandle(run.run_id)
        view = handle.wait(timeout=600, poll_s=2.0, max_poll_s=5.0)
    finally:
        for node in cluster.nodes[1:]:
            cluster.run(node, "rm", "-f", blocked)
    log = handle.logs()
    assert view.state == "failed"
    prefix = "staging failed on "
    named = view.reason.removeprefix(prefix).split(":")[0]
    assert view.reason.startswith(prefix) and named in cluster.nodes[1:], view.reason
    assert f"cannot create {blocked}/hpctrain-{handle.job_id}" in view.reason, view.reason
    assert f"hpctrain: {prefix}{named}: cannot create {blocked}/hpctrain-" in log
    assert "the job ends before its ranks start" in log
    assert "hpctrain run" not in log and "[rank 0]" not in log
    exits = [json.loads(line) for line in (Path(run.run_dir) / "job-exit.jsonl").read_text().splitlines()]
    assert exits[-1]["status"] == 5
