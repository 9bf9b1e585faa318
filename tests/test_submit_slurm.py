"""Submission and state tracking against the real single-node Slurm (fixture ``slurm``), from the login node.

The test Slurm keeps accounting in slurmdbd (plain ``sacct`` works) and a job-completion file (``sacct -c``); a
site without accounting storage is the same Slurm seen through a copy of its config that says so (plain ``sacct``
fails there as it does on such a site), and a site without squeue/sacct is made by running the real commands with
a PATH that lacks them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpctrain.errors import HpctrainError, TransportError
from hpctrain.submission.api import RunHandle, cancel_run, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import SUBMIT_FAILED
from hpctrain.submission.schedulers.base import get_scheduler
from hpctrain.submission.tracking import poll_runs, poll_scheduler
from hpctrain.submission.transport import Completed, LocalTransport, TransportPool
from tests.conftest import TinyJob

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parent.parent
SLURM = get_scheduler("slurm")
BASIC_TOOLS = ["sh", "env", "mktemp", "cat", "rm", "tail", "printf", "mkdir", "mv", "bash", "sleep", "true"]


class CountingTransport(LocalTransport):
    """The real LocalTransport, counting its commands (and optionally running them with a reduced PATH)."""

    def __init__(self, path: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.path = path

    def run(self, argv: list[str], **kw: Any) -> Completed:
        self.calls.append(argv)
        return super().run(["env", f"PATH={self.path}", *argv] if self.path else argv, **kw)


def shim_path(tmp_path: Path, tools: list[str]) -> str:
    """A directory holding links to only ``tools`` (a login node where other commands do not exist)."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for tool in BASIC_TOOLS + tools:
        real = shutil.which(tool)
        if real and not (d / tool).exists():
            (d / tool).symlink_to(real)
    return str(d)


@pytest.fixture
def env(isolated_home: Path, tiny_job: TinyJob) -> Path:
    tiny_job()
    return isolated_home


def _submit(env: Path, command: list[str], pool: TransportPool | None = None, **kw: Any) -> Any:
    with RunRegistry() as reg:
        return submit_runs(env / "tiny.yaml", "ci-slurm", command=command, registry=reg, pool=pool, **kw)


def no_accounting_conf(directory: Path) -> Path:
    """A copy of the clients' slurm.conf with accounting storage off: what the commands of a site without slurmdbd
    read (the controller is the same)."""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    lines = [("AccountingStorageType=accounting_storage/none" if ln.startswith("AccountingStorageType=") else ln)
             for ln in conf.read_text().splitlines() if not ln.startswith("AccountingStorageEnforce=")]
    copy = directory / "slurm-no-accounting.conf"
    copy.write_text("\n".join(lines) + "\n")
    return copy


def test_states_with_accounting_off_sacct_c_and_a_forgotten_job(env: Path, slurm: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ok = _submit(env, ["true"]).runs[0]
    bad = _submit(env, ["sh", "-c", "exit 3"]).runs[0]
    slow = _submit(env, ["sleep", "60"]).runs[0]
    with RunRegistry() as reg:
        ghost = reg.create_run("ghost", "ci-slurm", "x", str(env / "runs" / "ghost"))
        reg.add_submission(ghost.run_id, "99999999", "submit", ok=True)  # a job id Slurm never had
        ids = {r.run_id: RunHandle(r.run_id).job_id for r in (ok, bad, slow)}
    slurm.wait_for_state(ids[ok.run_id], ["COMPLETED"])
    slurm.wait_for_state(ids[bad.run_id], ["FAILED"])
    slurm.wait_for_state(ids[slow.run_id], ["RUNNING"])

    t = CountingTransport()
    answer = poll_scheduler(t, SLURM, dict.fromkeys([*ids.values(), "99999999"], str(env)))
    assert answer.sources == ("sacct", "squeue")  # slurmdbd answers
    monkeypatch.setenv("SLURM_CONF", str(no_accounting_conf(env)))
    t.calls.clear()
    answer = poll_scheduler(t, SLURM, dict.fromkeys([*ids.values(), "99999999"], str(env)))
    assert answer.sources == ("sacct -c", "squeue")  # plain sacct failed: accounting storage is off
    assert len(t.calls) == 1
    t.calls.clear()
    with RunRegistry() as reg:
        views = {v.run_id: v for v in poll_runs(reg, reg.list_runs(), TransportPool(lambda r, c: t))}
        assert len(t.calls) == 1  # ONE call for all four runs (status and metrics together)
        assert views[ok.run_id].state == "completed"
        assert views[bad.run_id].state == "failed"
        assert reg.chain(bad.run_id)[-1].exit_code == 3
        assert views[slow.run_id].state == "running"
        assert views[ghost.run_id].state == "missing"
        cancel_run(reg, reg.get_run(slow.run_id))
        assert reg.get_run(slow.run_id).state == "cancelled"
    slurm.wait_for_state(ids[slow.run_id], ["CANCELLED"])


def test_squeue_and_sacct_missing_falls_back_to_scontrol(env: Path, slurm: Any) -> None:
    done = _submit(env, ["sleep", "20"])
    job_id = done.job_ids[0]
    slurm.wait_for_state(job_id, ["RUNNING"])
    t = CountingTransport(shim_path(env, ["scontrol"]))
    answer = poll_scheduler(t, SLURM, {job_id: str(env), "99999999": str(env)})
    assert answer.sources == ("scontrol",)
    assert answer.statuses is not None
    assert answer.statuses[job_id].state.value == "running"
    assert answer.statuses["99999999"].state.value == "missing"
    nothing = poll_scheduler(CountingTransport(shim_path(env / "bin", [])), SLURM, {job_id: str(env)})
    assert nothing.statuses is None and "no status command answered" in nothing.error  # never MISSING
    subprocess.run(["scancel", job_id], check=True)


def test_array_of_three_each_its_own_run(env: Path, slurm: Any) -> None:
    done = _submit(env, ["sh", "-c", "grep '  lr:' job.yaml > lr.txt; echo task $SLURM_ARRAY_TASK_ID"],
                   array="train.lr=0.1,0.2,0.3")
    assert len(done.runs) == 3
    master = done.job_ids[0].split("_")[0]
    assert done.job_ids == [f"{master}_{i}" for i in range(3)]
    views = [RunHandle(r.run_id).wait(timeout=90, poll_s=1) for r in done.runs]
    assert [v.state for v in views] == ["completed"] * 3
    with RunRegistry() as reg:
        runs = [reg.get_run(r.run_id) for r in done.runs]
    assert [r.array_index for r in runs] == [0, 1, 2]
    assert {r.array_parent for r in runs} == {runs[0].run_id}
    for i, (run, lr) in enumerate(zip(runs, ["0.1", "0.2", "0.3"], strict=True)):
        assert Path(run.run_dir, "lr.txt").read_text().split() == ["lr:", lr]
        assert f"task {i}" in RunHandle(run.run_id).logs()


def test_dependency_holds_until_parent_ends(env: Path, slurm: Any) -> None:
    parent = _submit(env, ["sleep", "6"])
    child = _submit(env, ["true"], after=parent.runs[0].run_id)
    pool = TransportPool()
    with RunRegistry() as reg:
        deadline = time.monotonic() + 30
        while True:
            view = poll_runs(reg, [child.runs[0]], pool)[0]
            if view.reason or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert view.state == "pending"
    assert view.reason == "waiting for a job it depends on to finish"
    assert slurm.state(parent.job_ids[0]) in ("PENDING", "RUNNING")
    assert RunHandle(child.runs[0].run_id).wait(timeout=90, poll_s=1).state == "completed"
    assert slurm.state(parent.job_ids[0]) == "COMPLETED"


def test_sbatch_refusal_is_recorded_as_failed(env: Path, slurm: Any) -> None:
    (env / "bad.yaml").write_text("name: ci-bad\nextends: ci-slurm\nqueues:\n"
                                  "  nope: {max_nodes: 1, max_walltime: '01:00:00'}\ndefault_queue: nope\n")
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "tiny.yaml", "--site", str(env / "bad.yaml"),
                          "--command", "true"], cwd=env, env=environ, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("\n") == 1 and "refused the job" in out.stderr and "partition" in out.stderr
    with RunRegistry() as reg:
        (run,) = reg.list_runs()
        assert run.state == SUBMIT_FAILED and "partition" in run.state_reason
        assert [(s.ok, s.job_id) for s in reg.chain(run.run_id)] == [(False, None)]
    runs = json.loads(subprocess.run([sys.executable, "-m", "hpctrain", "runs", "--json"], cwd=env, env=environ,
                                     capture_output=True, text=True, timeout=60).stdout)
    assert runs[0]["state"] == "submit_failed"


def test_sbatch_missing_is_recorded_as_failed(env: Path, slurm: Any) -> None:
    pool = TransportPool(lambda r, c: CountingTransport(shim_path(env, [])))
    # (env quotes the name with ‘’ in a UTF-8 locale; transport.py keeps those quotes)
    with pytest.raises(TransportError, match="sbatch.? not found on this machine"):
        _submit(env, ["true"], pool=pool)
    with RunRegistry() as reg:
        (run,) = reg.list_runs()
        assert run.state == SUBMIT_FAILED and "not found on this machine" in run.state_reason


def test_dry_run_asks_sbatch_test_only_and_registers_nothing(env: Path, slurm: Any) -> None:
    done = _submit(env, ["true"], dry_run=True)
    assert done.dry_run and Path(done.script_path).is_file()
    assert "to start at" in done.message  # sbatch --test-only's answer
    with RunRegistry() as reg:
        assert reg.list_runs() == []
    # A profile that claims more memory than the node has: our fit check passes, Slurm's test does not.
    (env / "big.yaml").write_text("name: ci-big\nextends: ci-slurm\nnode: {memory_gb: 100000}\n")
    with RunRegistry() as reg, pytest.raises(HpctrainError, match="refused the script"):
        submit_runs(env / "tiny.yaml", str(env / "big.yaml"), command=["true"], registry=reg, dry_run=True,
                    sets=["resources.memory_gb=50000"])
