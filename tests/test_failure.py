"""The failure note (hpctrain/submission/failure.py): written once by the first failing rank, whole or not at
all, and shown as the run's reason by ``status``, ``runs`` and ``RunHandle.wait()`` — with real ranks
(``hpctrain run`` under the local launcher, two ranks refusing the same value) on the ``local`` site, and
under srun on the real Slurm behind the loopback sshd (the note comes in the poll's one ssh round trip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.failure import FAILURE_FILE, MAX_CHARS, OWN, failure_line, record_failure
from hpctrain.submission.registry import RunRegistry
from tests.conftest import TinyJob
from tests.transport_record import as_recorded

REPO = Path(__file__).resolve().parent.parent


def test_failure_line_is_one_printable_line() -> None:
    assert failure_line("\n  first: cause\nsecond line\n") == "first: cause"
    assert failure_line("tab\there\x1b[31m") == "tab here [31m"
    long = failure_line("x" * 1000)
    assert len(long) == MAX_CHARS and long.endswith("...")
    assert failure_line("") == ""


def test_first_writer_wins_among_racing_processes(tmp_path: Path) -> None:
    """Eight processes write at once: exactly one wins, the note is one whole line, no temporary is left."""
    code = ("import sys; from hpctrain.submission.failure import record_failure; "
            "print(record_failure(sys.argv[1], 'rank ' + sys.argv[2] + ': ' + 'why ' * 50))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(i)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}) for i in range(8)]
    won = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert won.count("True") == 1 and won.count("False") == 7
    winner = won.index("True")
    assert (tmp_path / FAILURE_FILE).read_text() == f"rank {winner}: " + ("why " * 50).strip() + "\n"
    assert {p.name for p in tmp_path.iterdir()} == {FAILURE_FILE, f".{FAILURE_FILE}.level{OWN}"}  # no temporary
    assert not record_failure(tmp_path, "a later failure")  # the first cause stands


@pytest.mark.processes
@pytest.mark.usefixtures("isolated_home")
def test_failed_ranks_name_the_cause_in_status_runs_and_wait(tmp_path: Path, tiny_job: TinyJob) -> None:
    """Both ranks run the real ``hpctrain run`` and refuse a value only the ranks see (``--set`` on the rank
    command): the run's reason is that rank's line, not only its exit code, wherever the run is shown."""
    tiny_job("twofail", ranks_per_node=2, path=tmp_path / "job.yaml")
    rank = [sys.executable, "-m", "hpctrain", "run", "job.yaml", "--run-dir", ".", "--set", "train.lr=-1"]
    with RunRegistry() as reg:
        run = submit_runs(tmp_path / "job.yaml", "local", command=rank, registry=reg).runs[0]
    view = RunHandle(run.run_id).wait(timeout=120, poll_s=0.5)
    cause = "--set train.lr=-1: train.lr: Input should be greater than 0"
    assert view.state == "failed"
    assert view.reason.startswith(("rank 0: ", "rank 1: ")) and cause in view.reason, view.reason
    assert "exit code" in view.reason  # the code still follows the cause
    note = Path(run.run_dir, FAILURE_FILE).read_text()
    assert note.count("\n") == 1 and cause in note

    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", run.run_id, "--json"], env=environ,
                            capture_output=True, text=True, timeout=60)
    assert cause in json.loads(status.stdout)[0]["reason"]
    runs = subprocess.run([sys.executable, "-m", "hpctrain", "runs"], env=environ, capture_output=True, text=True,
                          timeout=60)
    (line,) = [ln for ln in runs.stdout.splitlines() if ln.startswith(run.run_id)]
    assert " failed " in line and cause in line  # `runs` makes no scheduler call: the reason was recorded


@pytest.mark.slurm
@pytest.mark.usefixtures("isolated_home")
def test_the_note_comes_over_ssh_in_the_same_round_trip(tmp_path: Path, tiny_job: TinyJob, sshd: Any, slurm: Any
                                                         ) -> None:
    """A remote run on the real Slurm whose rank (srun, the real ``hpctrain run``) refuses a value: each poll
    is one ssh call, and the one that sees the job FAILED brings the rank's line with it."""
    from hpctrain.submission.tracking import poll_runs
    from hpctrain.submission.transport import SSHTransport, TransportPool

    tiny_job("twofail", path=tmp_path / "job.yaml")
    control = Path(tempfile.mkdtemp(prefix="hfn", dir="/tmp"))
    calls: list[list[str]] = []

    class Counting(SSHTransport):
        def run(self, argv: list[str], **kw: Any) -> Any:
            calls.append(as_recorded(argv, kw))
            return super().run(argv, **kw)

    pool = TransportPool(lambda r, c: Counting(r, ssh_config=c, control_dir=str(control), connect_timeout=5))
    rank = [sys.executable, "-m", "hpctrain", "run", "job.yaml", "--run-dir", ".", "--set", "train.lr=-1"]
    try:
        with RunRegistry() as reg:
            run = submit_runs(tmp_path / "job.yaml", "ci-slurm", remote=sshd.host, ssh_config=str(sshd.config),
                              run_root=str(tmp_path / "remote-runs"), command=rank, registry=reg, pool=pool).runs[0]
            deadline = time.monotonic() + 120
            while True:
                before = len(calls)
                (view,) = poll_runs(reg, [run], pool)
                assert len(calls) == before + 1
                if view.state not in ("pending", "running") or time.monotonic() > deadline:
                    break
                time.sleep(1)
        assert view.state == "failed", view
        assert view.reason.startswith("rank 0: --set train.lr=-1: train.lr: Input should be greater than 0"), view
    finally:
        pool.close(stop_masters=True)
        shutil.rmtree(control, ignore_errors=True)
