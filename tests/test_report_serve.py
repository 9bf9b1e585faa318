"""``hpctrain report RUN --serve`` from a fresh CLI process on a registered run of the ``local`` site: the page is
live (it reloads itself) while the run goes on, grows as the metrics grow, and the server writes the final report
and exits by itself once the scheduler says the run has ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hpctrain.submission.api import submit_runs
from hpctrain.submission.registry import RunRegistry
from tests.conftest import TinyJob

REPO = Path(__file__).resolve().parent.parent
# Logs step 5, then waits for the test's `more` file, logs step 10, waits for `release` and ends well.
STAGED = ("echo '{\"time\": 1, \"step\": 5, \"loss\": 2.5}' >> metrics.jsonl; "
          "for i in $(seq 3000); do [ -e more ] && break; sleep 0.2; done; "
          "echo '{\"time\": 2, \"step\": 10, \"loss\": 1.25}' >> metrics.jsonl; "
          "for i in $(seq 3000); do [ -e release ] && break; sleep 0.2; done; exit 0")


def fetch(url: str, pause_s: float = 0.0) -> str:
    time.sleep(pause_s)
    with urllib.request.urlopen(url, timeout=120) as answer:
        return answer.read().decode()


@pytest.mark.processes
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("isolated_home")
def test_served_report_follows_the_run_and_stops_when_it_ends(tmp_path: Path, tiny_job: TinyJob) -> None:
    spec = tiny_job("live", steps=20, path=tmp_path / "live.yaml")
    with RunRegistry() as reg:
        run = submit_runs(spec, "local", command=["sh", "-c", STAGED], registry=reg).runs[0]
    run_dir = Path(run.run_dir)
    out = tmp_path / "final.html"
    server = subprocess.Popen([sys.executable, "-m", "hpctrain", "report", run.run_id, "--serve", "--refresh", "0.5",
                               "-o", str(out)], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        first = server.stdout.readline()  # type: ignore[union-attr]
        assert first.startswith(f"serving the live report of {run.run_id} at http://127.0.0.1:"), first
        url = first.split(" at ", 1)[1].strip()
        page = fetch(url)
        while "step 5" not in page:  # the job's first line may not be written yet
            page = fetch(url, 0.2)
        assert 'http-equiv="refresh"' in page
        (run_dir / "more").touch()
        while "step 10" not in page:  # rebuilt from the grown metrics at a later reload
            page = fetch(url, 0.2)
        assert 'http-equiv="refresh"' in page
        (run_dir / "release").touch()
        rest, err = server.communicate(timeout=300)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, err
    assert rest.strip() == f"the run has ended; report written to {out}"
    final = out.read_text()
    assert "step 10" in final and 'http-equiv="refresh"' not in final and "completed" in final
