"""The laptop side of blamed nodes: the registry keeps what each run's ``blamed-nodes.jsonl`` says (from the one
batched poll), ``status`` names the nodes, ``resume`` and ``submit`` keep jobs off them, a node two runs blamed is
remembered for the site until ``sites forget-nodes``, and the report lists them.

No scheduler daemon: the local back-end for polling, and a Slurm site whose ``sbatch`` is a stand-in script that
keeps the script it was given (what matters here is the ``--exclude`` line hpctrain writes into it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.preflight import PreflightWarning
from hpctrain.errors import ConfigError
from hpctrain.nodes.blame import BLAME_FILE, Blame
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.blamed_nodes import checked_node_name, left_out_by_run
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_db import _SCHEMA_V1, SCHEMA_VERSION
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import Completed, LocalTransport, TransportPool

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("isolated_home")

KILLED = Blame("node03", "killed by SIGKILL", ranks=(2,), source="launcher", job="", time=1.0)
CHECKED = Blame("node05", "/tmp has 0.1 GB free, needs 2 GB", source="check", time=2.0)
SLOW = Blame("node07", "step time 1.6x the median", kind="slow", ranks=(6, 7), source="straggler", time=3.0)


def _run(reg: RunRegistry, name: str = "r", site: str = "local") -> str:
    return reg.create_run(name, site, "h", f"/runs/{name}").run_id


# --- the registry ----------------------------------------------------------------------------------------------


def test_blames_are_kept_once_per_node_kind_source_job_and_restart(tmp_path: Path) -> None:
    with RunRegistry(tmp_path / "r.db") as reg:
        rid = _run(reg)
        assert reg.record_blames(rid, [KILLED, CHECKED]) == [KILLED, CHECKED]
        again = Blame("node03", "killed by SIGKILL", ranks=(2,), source="launcher", time=9.0)
        assert reg.record_blames(rid, [again, SLOW]) == [SLOW]  # the same blame read by the next poll
        later = Blame("node03", "killed by SIGKILL", ranks=(2,), source="launcher", restart=1, time=10.0)
        assert reg.record_blames(rid, [later]) == [later]  # the next attempt blamed it again
        assert [b.node for b in reg.blames(rid)] == ["node03", "node05", "node07", "node03"]
        assert reg.blames(rid)[2].ranks == (6, 7)
        assert reg.delete_runs([rid]) == 1 and reg.blames(rid) == []


def test_a_version_1_registry_is_migrated_and_reads_without_blames_read_only(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript(_SCHEMA_V1)
    con.execute("INSERT INTO runs (run_id, name, site, spec_hash, run_dir, created, state) "
                "VALUES ('old-1', 'old', 'local', 'h', '/r', '2026-01-01T00:00:00Z', 'failed')")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    with RunRegistry(path, readonly=True) as reg:  # cannot migrate: the new tables read empty
        assert reg.blames("old-1") == [] and reg.remembered_nodes("local") == {}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1
    with RunRegistry(path) as reg:
        assert reg.schema_version == SCHEMA_VERSION == 2
        assert reg.record_blames("old-1", [KILLED]) == [KILLED]
        assert reg.integrity_problems() == []


def test_a_node_failed_in_two_runs_of_a_site_is_remembered_until_forgotten(tmp_path: Path) -> None:
    with RunRegistry(tmp_path / "r.db") as reg:
        a, b, elsewhere = _run(reg, "a"), _run(reg, "b"), _run(reg, "c", site="polaris")
        reg.record_blames(a, [KILLED, SLOW])
        assert reg.remembered_nodes("local") == {}  # one run is not enough
        reg.record_blames(elsewhere, [KILLED])
        assert reg.remembered_nodes("local") == {}  # another site's run does not count
        reg.record_blames(b, [Blame("node03", "did not answer the node check", source="check"), SLOW])
        remembered = reg.remembered_nodes("local")
        assert list(remembered) == ["node03"]  # slow twice is no failure
        assert [(f.run_id, f.blame.cause) for f in remembered["node03"]] == [
            (a, "killed by SIGKILL"), (b, "did not answer the node check")]
        assert reg.forget_nodes("local", ["node03"]) == ["node03"]
        assert reg.remembered_nodes("local") == {}
        c = _run(reg, "d")
        reg.record_blames(c, [KILLED])  # one new failure after forgetting: not remembered yet
        assert reg.remembered_nodes("local") == {}
        reg.record_blames(_run(reg, "e"), [KILLED])
        assert list(reg.remembered_nodes("local")) == ["node03"]
        assert reg.forget_nodes("local") == ["node03"] and reg.remembered_nodes("local") == {}


# --- the words and the choice ----------------------------------------------------------------------------------


def test_the_next_attempt_leaves_out_failed_nodes_and_slow_ones_only_with_spares() -> None:
    assert left_out_by_run([KILLED, CHECKED, SLOW], spare_nodes=0) == {
        "node03": "node03 (rank 2: killed by SIGKILL)", "node05": "node05 (check: /tmp has 0.1 GB free, needs 2 GB)"}
    assert list(left_out_by_run([KILLED, CHECKED, SLOW], spare_nodes=1)) == ["node03", "node05", "node07"]


@pytest.mark.parametrize("name", ["node03", "nid001234", "x1000c0s0b0n0", "cn-1.cluster.example"])
def test_node_names_that_can_be_host_names_pass(name: str) -> None:
    assert checked_node_name(name, "--exclude") == name


@pytest.mark.parametrize("name", ["", "-node", "node_3", "a b", "node03,node04", "n" * 64, "x\n", "../x"])
def test_a_name_that_cannot_be_a_host_name_is_refused_naming_the_flag(name: str) -> None:
    with pytest.raises(ConfigError, match="--exclude .*not a node name"):
        checked_node_name(name, "--exclude")


# --- the poll and status (the local back-end) -------------------------------------------------------------------


class CountingTransport(LocalTransport):
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **kw: Any) -> Completed:
        self.calls.append(argv)
        return super().run(argv, **kw)


# A job whose launcher blamed a node and which then failed.
BLAMING_JOB = f"echo '{KILLED.to_json()}' >> {BLAME_FILE}; exit 1"


def _ended(run_id: str) -> Any:
    deadline = time.monotonic() + 60
    while True:
        view = RunHandle(run_id).status()
        if view.state not in ("pending", "running"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.3)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.processes
def test_the_poll_keeps_a_runs_blames_and_status_names_the_node(tmp_path: Path, tiny_job: Any) -> None:
    spec = tiny_job("blaming")
    with RunRegistry() as reg:
        run = submit_runs(spec, "local", registry=reg, command=["sh", "-c", BLAMING_JOB]).runs[0]
    view = _ended(run.run_id)
    assert view.state == "failed"
    assert [b.node for b in view.blamed] == ["node03"] and view.left_out == {
        "node03": "node03 (rank 2: killed by SIGKILL)"}
    with RunRegistry() as reg:
        assert [b.cause for b in reg.blames(run.run_id)] == ["killed by SIGKILL"]
        # An ended run is not polled again: no transport call at all, and its blames stay.
        transport = CountingTransport()
        poll_runs(reg, [reg.get_run(run.run_id)], TransportPool(lambda *_: transport), progress=False)
        assert transport.calls == [] and len(reg.blames(run.run_id)) == 1
    out = subprocess.run([sys.executable, "-m", "hpctrain", "status", run.run_id], env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert f"{run.run_id}: excluded nodes: node03 (rank 2: killed by SIGKILL)" in out.stdout, out
    shown = json.loads(subprocess.run([sys.executable, "-m", "hpctrain", "status", run.run_id, "--json"], env=_env(),
                                      capture_output=True, text=True, timeout=120).stdout)
    assert shown[0]["blamed"][0]["node"] == "node03" and shown[0]["blamed"][0]["ranks"] == [2]
    assert shown[0]["left_out"] == {"node03": "node03 (rank 2: killed by SIGKILL)"}


@pytest.mark.processes
def test_one_transport_call_polls_status_and_blames(tmp_path: Path, tiny_job: Any) -> None:
    spec = tiny_job("waiting")
    with RunRegistry() as reg:
        done = submit_runs(spec, "local", registry=reg, command=["sleep", "60"])
        run, job = done.runs[0], done.job_ids[0]
        earlier = Blame("node08", "slow in the attempt before", kind="slow", source="straggler", job="1", time=2.5)
        Path(run.run_dir, BLAME_FILE).write_text("\n".join(
            (earlier.to_json(), replace(SLOW, job=str(job)).to_json(), '{"node": "cut-li')) + "\n")  # cut: skipped
        transport = CountingTransport()
        (view,) = poll_runs(reg, [reg.get_run(run.run_id)], TransportPool(lambda *_: transport))
        assert len(transport.calls) == 1
        assert view.state in ("pending", "running") and [b.node for b in view.blamed] == ["node08", "node07"]
        assert view.reason.endswith("straggler node07 (ranks 6-7: step time 1.6x the median)"), view.reason
        RunHandle(run.run_id).cancel()


def test_a_failed_runs_reason_names_the_node_its_job_blamed(tmp_path: Path) -> None:
    with RunRegistry(tmp_path / "r.db") as reg:
        rid = reg.create_run("r", "local", "h", str(tmp_path)).run_id
        (tmp_path / "home").mkdir(exist_ok=True)
        reg.add_submission(rid, "77", "submit", ok=True)
        reg.update_states({"77": JobStatus("77", JobState.FAILED, "rank 2 killed by SIGKILL", exit_code=137)})
        reg.record_blames(rid, [Blame("node03", "killed by SIGKILL", ranks=(2,), source="launcher", job="77"),
                                Blame("node09", "old news", source="check", job="12")])
        from hpctrain.submission.views import view_of

        view = view_of(reg, reg.get_run(rid))
        assert view.reason.startswith("on node03 (rank 2): rank 2 killed by SIGKILL"), view.reason
        assert "node09" not in view.reason  # blamed by an earlier job: not why this one failed
        # A note that names the node already (srun's report as the batch script writes it) is left as it is.
        reg.update_states({"77": JobStatus("77", JobState.FAILED, "rank 2 on node03 killed by SIGKILL",
                                           exit_code=137)})
        assert view_of(reg, reg.get_run(rid)).reason.startswith("rank 2 on node03 killed by SIGKILL")


# --- resume and submit (a Slurm site with a stand-in sbatch) ----------------------------------------------------


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Slurm site profile whose sbatch is a script that answers job id 4242 and submits nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 4242\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    site = tmp_path / "fake-slurm.yaml"
    site.write_text(f"name: fake-slurm\nscheduler: slurm\nlauncher: srun\nremote_root: {tmp_path / 'runs'}\n"
                    "node: {cores: 2, threads_per_core: 1, gpus: 0, memory_gb: 1}\n")
    return site


def _failed_run(reg: RunRegistry, spec: Path, site: Path, blames: list[Blame]) -> Any:
    run = submit_runs(spec, str(site), registry=reg, command=["true"]).runs[0]
    reg.update_states({"4242": JobStatus("4242", JobState.FAILED, "rank 2 killed by SIGKILL", exit_code=137)},
                      site="fake-slurm")
    reg.record_blames(run.run_id, blames)
    return reg.get_run(run.run_id)


def test_resume_keeps_the_job_off_blamed_named_and_remembered_nodes(
        fake_slurm: Path, tiny_job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.submission import resume

    # What is not asked here: the checkpoint on the run's machine and the queue's limits.
    monkeypatch.setattr(resume, "newest_checkpoint_step", lambda *_: 1)
    monkeypatch.setattr(resume, "check_queued_jobs", lambda *_: None)
    monkeypatch.setattr(resume, "check_usable_nodes", lambda *args: args[4])  # the exclusions, all kept
    spec = tiny_job("resumed", steps=5)
    with RunRegistry() as reg:
        other = _failed_run(reg, spec, fake_slurm, [Blame("node11", "lost its network", source="scheduler")])
        run = _failed_run(reg, spec, fake_slurm, [KILLED, CHECKED, SLOW,
                                                  Blame("node11", "lost its network", source="scheduler")])
        assert other.run_id != run.run_id
        with pytest.raises(ConfigError, match="--exclude 'node 9'"):
            resume.resume_run(reg, run.run_id, exclude=["node 9"])
        done = resume.resume_run(reg, run.run_id, exclude=["node09"], include=["node05"])
        script = (Path(reg.path).parent / "runs" / run.run_id / "job.sh").read_text()
    assert list(done.excluded) == ["node11", "node03", "node09"]  # the site's, the run's, the person's
    excluded = next(line for line in script.splitlines() if "--exclude=" in line)
    assert excluded == "#SBATCH --exclude=node11,node03,node09"


def test_resume_on_a_scheduler_without_exclusion_warns_without_spare_nodes(tmp_path: Path) -> None:
    from hpctrain.submission.resume import nodes_kept_off

    with RunRegistry(tmp_path / "r.db") as reg:
        rid = _run(reg)
        reg.record_blames(rid, [KILLED])
        run = reg.get_run(rid)
        with pytest.warns(PreflightWarning, match="pbs cannot keep a job off named nodes.*node03.*spare_nodes"):
            assert list(nodes_kept_off(reg, run, 0, "pbs", (), ())) == ["node03"]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nodes_kept_off(reg, run, 1, "pbs", (), ())  # a spare node takes its place: nothing to warn of
            nodes_kept_off(reg, run, 0, "slurm", (), ())  # Slurm excludes it


@pytest.mark.processes
def test_submit_excludes_nodes_remembered_for_the_site_and_sites_show_and_forget_them(
        fake_slurm: Path, tiny_job: Any) -> None:
    spec = tiny_job("remembered", steps=5)
    with RunRegistry() as reg:
        for _ in range(2):
            _failed_run(reg, spec, fake_slurm, [KILLED])
    cli = [sys.executable, "-m", "hpctrain"]
    out = subprocess.run([*cli, "submit", str(spec), "--site", str(fake_slurm), "--command", "true"], env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("leaving out nodes remembered as bad on site fake-slurm: node03 (failed in runs "
            in out.stderr) and "killed by SIGKILL)" in out.stderr
    run_id = out.stdout.split()[0]
    with RunRegistry() as reg:
        script = (Path(reg.path).parent / "runs" / run_id / "job.sh").read_text()
    assert "#SBATCH --exclude=node03" in script
    shown = subprocess.run([*cli, "sites", "show", str(fake_slurm)], env=_env(), capture_output=True, text=True,
                           timeout=120).stdout
    assert "# nodes remembered as bad on fake-slurm" in shown and "#   node03: run " in shown
    import yaml

    assert yaml.safe_load(shown)["name"] == "fake-slurm"  # still the profile, as YAML
    shown_json = json.loads(subprocess.run([*cli, "sites", "show", str(fake_slurm), "--json"], env=_env(),
                                           capture_output=True, text=True, timeout=120).stdout)
    assert [n["node"] for n in shown_json["remembered_nodes"]] == ["node03"]
    forgot = subprocess.run([*cli, "sites", "forget-nodes", "fake-slurm", "node03", "node04"], env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert forgot.returncode == 0 and "forgot node03 on fake-slurm" in forgot.stdout
    assert "node04 was not remembered" in forgot.stderr
    bad = subprocess.run([*cli, "sites", "forget-nodes", "fake-slurm", "node;rm"], env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "not a node name" in bad.stderr
    again = subprocess.run([*cli, "submit", str(spec), "--site", str(fake_slurm), "--command", "true"], env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "remembered" not in again.stderr
    assert "remembered_nodes" not in subprocess.run([*cli, "sites", "show", str(fake_slurm), "--json"], env=_env(),
                                                    capture_output=True, text=True, timeout=120).stdout


# --- the report -------------------------------------------------------------------------------------------------


def test_the_report_lists_blamed_nodes_with_cause_ranks_source_and_attempt(tmp_path: Path) -> None:
    from hpctrain.report.collect import RunFacts, collect
    from hpctrain.report.html import page

    (tmp_path / BLAME_FILE).write_text("\n".join(b.to_json() for b in (
        Blame("node03", "killed by SIGKILL", ranks=(2, 3), source="launcher", job="4242", restart=1),
        SLOW)) + "\n")
    data = collect(tmp_path, RunFacts("r", str(tmp_path)))
    nodes = page(data).split('id="nodes"')[1].split("</section>")[0]
    assert "<h2>Nodes</h2>" in nodes
    for text in ("node03", "killed by SIGKILL", "ranks 2-3", "launcher", "job 4242, restart 1", "node07", "slow"):
        assert text in nodes, text
    empty = page(collect(tmp_path / "none", RunFacts("r", "x"))).split('id="nodes"')[1]
    assert "no node blamed" in empty.split("</section>")[0]


def test_exclusions_that_would_leave_too_few_nodes_are_given_up_or_refused_when_a_person_named_them() -> None:
    """A stand-in transport answers sinfo for ci-cluster's queue with five idle nodes: a 3-node job can be kept off
    two of them; a 4-node job cannot, so the run's blamed nodes are given up with a warning (a job the scheduler
    can never place helps no one), and the person's own --exclude is refused."""
    import subprocess as sp

    from hpctrain.config.fit import check_fit
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import load_site
    from hpctrain.errors import FitError
    from hpctrain.submission.queue_limits import check_usable_nodes

    class Sinfo:
        host = "login"

        def run(self, argv: list[str], **_: object) -> sp.CompletedProcess[str]:
            assert argv[0] == "sinfo"
            return sp.CompletedProcess(argv, 0, "".join(f"node0{i}|idle|none\n" for i in range(1, 6)), "")

    site = load_site("ci-cluster")

    def placement(nodes: int) -> object:
        job = JobSpec.model_validate({"name": "x", "model": "resnet", "train": {"steps": 1, "batch_per_rank": 1,
                                      "lr": 0.1}, "resources": {"nodes": nodes}})
        return check_fit(job, site)

    blamed = {"node02": "rank 1 on node02 killed by SIGKILL", "node04": "check: /tmp full"}
    assert check_usable_nodes(Sinfo(), site, placement(3), 3, blamed) == blamed  # type: ignore[arg-type]
    with pytest.warns(Warning, match="not keeping the job off node02, node04: queue 'cluster' has 3 usable nodes"):
        assert check_usable_nodes(Sinfo(), site, placement(4), 4, blamed) == {}  # type: ignore[arg-type]
    with pytest.raises(FitError, match="3 usable nodes besides node02, node04") as refused:
        check_usable_nodes(Sinfo(), site, placement(4), 4, blamed, named=["node04"])  # type: ignore[arg-type]
    assert refused.value.key == "--exclude"
