"""A staged job on the real single-node Slurm (fixture ``slurm``): ``hpctrain submit`` packs this venv, the script
sends it with ``sbcast``, unpacks it once per node into the node-local directory, copies the input files there, and
the two ranks train a few FFN steps importing hpctrain, torch and libpython from that copy, counted by the audit
hook. A node that cannot stage ends the job with one message naming it.

The packed environment is this repository's .venv (about 1.7 GB): its archive is kept in a cache under /tmp between
test runs and reused while the environment and hpctrain's source are unchanged.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from hpctrain.runtime import counters
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import Registry

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parent.parent
ENV_CACHE = Path("/tmp/hpctrain-test-env-cache")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    monkeypatch.setenv("HPCTRAIN_RUNS", str(tmp_path / "runs"))
    return tmp_path


def _site(tmp: Path, node_local: str, **staging: Any) -> Path:
    path = tmp / "staged-slurm.yaml"
    extra = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in staging.items())
    path.write_text(f"name: staged-slurm\nextends: {REPO / 'site_configs' / 'ci-slurm.yaml'}\n"
                    f"staging:\n  node_local_dir: {json.dumps(node_local)}\n{extra}")
    return path


def _ffn_data(shared: Path) -> tuple[Path, Path]:
    """A small training volume and its coordinates, written once on the 'shared file system'."""
    from hpctrain.ffn.task import prepare_training_data

    prepared = prepare_training_data({"train": {"synthetic": {"shape": [24, 32, 32], "seed": 3}}}, (9, 9, 9),
                                     (2, 2, 2), shared)
    return Path(prepared["image"].rsplit(":", 1)[0]), Path(prepared["coordinates"])


def _job(tmp: Path, volume: Path, coords: Path, node_local: Path) -> Path:
    # TMPDIR: tempfile probes its directory with a file of a random name; /tmp is node-local on a cluster, but here
    # everything (this test's "shared" directories too) is under /tmp, so the probe goes to the node-local directory,
    # which the counter is told is node-local as a whole (not only the job's own directory in it).
    path = tmp / "staged.yaml"
    path.write_text(f"""name: staged
model: ffn
model_args: {{depth: 1, features: 4, fov: [9, 9, 9], deltas: [2, 2, 2]}}
data:
  train: {{image: "{volume}:image", labels: "{volume}:labels"}}
  coordinates: "{coords}"
train: {{steps: 3, batch_per_rank: 1, lr: 0.01, log_every: 1}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:15:00"}}
checkpoint: {{signal_lead_s: 10}}
env: {{HPCTRAIN_COUNTERS: "1", TMPDIR: "{node_local}", HPCTRAIN_COUNTERS_LOCAL: "{node_local}"}}
""")
    return path


def _submit_and_wait(job: Path, site: Path) -> tuple[Any, Any, str]:
    with Registry() as reg:
        submitted = submit_runs(job, str(site), registry=reg)
    handle = RunHandle(submitted.runs[0].run_id)
    view = handle.wait(timeout=900, poll_s=2.0, max_poll_s=5.0)
    return submitted.runs[0], view, handle.logs()


def test_staged_job_imports_from_the_node_local_copy_and_trains(env: Path, slurm: Any) -> None:
    shared = env / "shared"
    volume, coords = _ffn_data(shared)
    node_local = env / "node-local"
    site = _site(env, str(node_local), environment="archive", data=True, archive_cache=str(ENV_CACHE))
    run, view, log = _submit_and_wait(_job(env, volume, coords, node_local), site)
    assert view.state == "completed", f"{view.state} {view.reason}\n{log[-4000:]}"
    assert "hpctrain: staged on every node in" in log

    [root] = list(node_local.glob("hpctrain-*"))  # $HPCTRAIN_NODE_LOCAL of the job (one node)
    assert not (root / "env.tar").exists(), "the sbcast copy of the archive is removed once unpacked"
    assert (root / "env" / "venv" / "bin" / "python").exists()
    assert sorted(p.name for p in (root / "data").iterdir()) == sorted([f"0-{volume.name}", f"1-{coords.name}"])

    records = counters.read_records(run.run_dir)
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        where = record["interpreter"]
        assert where["modules"]["hpctrain"].startswith(f"{root}/env/venv/lib/"), where
        assert where["modules"]["torch"].startswith(f"{root}/env/venv/lib/"), where
        assert where["executable"] == f"{root}/env/venv/bin/python"
        assert where["base_prefix"] == f"{root}/env/base"
        assert where["libpython"] is None or where["libpython"].startswith(f"{root}/env/libpython/"), where
        startup = record["marks"]["startup"]
        # Thousands of imports, all node-local: not one Python file from the shared file system.
        assert startup["opens"]["node_local"] > 500, startup
        assert startup["shared_code_opens"] == 0, record["shared_examples"]
        # The only shared files a rank opens are its run directory's (spec, metrics, checkpoints).
        assert record["shared_opens_outside_run_dir"] == 0, record["shared_examples"]

    # The ranks read the node-local copies of the input files; the run's job.yaml keeps what the user wrote.
    [prepared] = list(Path(run.run_dir).rglob("prepared.json"))
    manifest = json.loads(prepared.read_text())
    assert manifest["image"] == f"{root}/data/0-{volume.name}:image"
    assert manifest["coordinates"] == f"{root}/data/1-{coords.name}"
    assert str(volume) in (Path(run.run_dir) / "job.yaml").read_text()
    shutil.rmtree(node_local, ignore_errors=True)


def test_a_node_that_cannot_stage_ends_the_job_with_its_name(env: Path, slurm: Any) -> None:
    shared = env / "shared"
    volume, coords = _ffn_data(shared)
    blocker = env / "not-a-directory"
    blocker.write_text("a file where the node-local directory should be\n")
    site = _site(env, str(blocker / "local"), data=True)
    run, view, log = _submit_and_wait(_job(env, volume, coords, env / "tmp"), site)
    node = socket.gethostname()
    assert view.state == "failed"
    assert f"hpctrain: staging failed on {node}: cannot create {blocker}/local/hpctrain-" in log
    assert "the job ends before its ranks start" in log
    assert "hpctrain run" not in log and "[rank 0]" not in log
    assert view.reason.startswith(f"staging failed on {node}: cannot create"), view.reason
    exits = [json.loads(line) for line in (Path(run.run_dir) / "job-exit.jsonl").read_text().splitlines()]
    assert exits[-1]["status"] == 5
