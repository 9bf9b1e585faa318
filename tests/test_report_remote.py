"""The report of a remote run: its files are copied over the run's own ssh connection (the real loopback sshd in
front of the real Slurm), and the page is built from that copy — from a fresh CLI process, as a laptop would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.report.build import report_data
from hpctrain.report.source import open_source
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from tests.conftest import TinyJob

pytestmark = [pytest.mark.slurm, pytest.mark.sshd]
REPO = Path(__file__).resolve().parent.parent
# The job writes what a run of 20 steps would have logged, a rank file and a failure note (no training is needed
# to test the copy).
WRITE_FILES = ("for s in 5 10 15 20; do echo \"{\\\"time\\\": $s, \\\"step\\\": $s, \\\"loss\\\": 1.$s}\" "
               ">> metrics.jsonl; done; mkdir -p ranks; echo 'rank 0 pid 1 host farnode parent 1' > "
               "ranks/node-00000.txt; echo '{\"step\": 20, \"busy_s\": [0.25]}' > rank_times.jsonl; "
               "echo 'rank 0: data file missing' > failure.txt")


@pytest.mark.usefixtures("isolated_home")
def test_remote_run_report_is_built_from_files_copied_over_ssh(tmp_path: Path, tiny_job: TinyJob, sshd: Any,
                                                               slurm: Any) -> None:
    spec = tiny_job("far", steps=20, path=tmp_path / "far.yaml")
    with RunRegistry() as reg:
        run = submit_runs(spec, "ci-slurm", remote=sshd.host, ssh_config=str(sshd.config),
                          run_root=str(tmp_path / "remote-runs"), command=["sh", "-c", WRITE_FILES],
                          registry=reg).runs[0]
    assert RunHandle(run.run_id).wait(timeout=300, poll_s=1).state == "completed"

    cache = tmp_path / "cache"
    source = open_source(run.run_id, cache_dir=cache)
    copied = cache / run.run_id
    assert source.directory == copied and source.facts.where == f"{sshd.host}:{run.run_dir}"
    for name in ("metrics.jsonl", "rank_times.jsonl", "failure.txt", "ranks/node-00000.txt"):
        assert (copied / name).read_bytes() == (Path(run.run_dir) / name).read_bytes(), name
    data = report_data(source)
    assert [r["step"] for r in data.records] == [5, 10, 15, 20]
    assert data.failure == "rank 0: data file missing"
    assert data.ranks is not None and data.ranks.rows == ("rank 0 (farnode)",)

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "far.html"
    done = subprocess.run([sys.executable, "-m", "hpctrain", "report", run.run_id, "-o", str(out)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "rank 0: data file missing" in page.split('id="failure"')[1]
    assert "<svg" in page.split('id="loss"')[1].split("</section>")[0]
    assert f"{sshd.host}:{run.run_dir}" in page
