"""Scheduler status parsing against recorded outputs (real ones from the local Slurm, synthetic PBS/Cobalt).

tests/data/status/README.md says which file is real and which is synthetic. The `slurm`-marked test at the
end runs the parsers against live output of the local Slurm (conftest's `slurm` fixture).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.submission.schedulers import cobalt as cobalt_backend
from hpctrain.submission.schedulers import pbs as pbs_backend
from hpctrain.submission.schedulers import status_parsers as sp
from hpctrain.submission.schedulers.cobalt import COBALT_STATES
from hpctrain.submission.schedulers.pbs import PBS_STATES, pbs_exit_state
from hpctrain.submission.schedulers.slurm import status as slurm_backend
from hpctrain.submission.schedulers.slurm.status import SLURM_STATES, slurm_reason, slurm_state
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.tracking import combine

if TYPE_CHECKING:
    from conftest import SlurmCluster

    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.registry_rows import Run

DATA = Path(__file__).parent / "data" / "status"


def read(name: str) -> str:
    return (DATA / name).read_text()


# --- state tables ------------------------------------------------------------------------------------------


def test_terminal_states() -> None:
    terminal = {s for s in JobState if s.is_terminal}
    assert terminal == {
        JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED,
        JobState.PREEMPTED, JobState.MISSING,
    }
    assert JobState.REQUEUED.is_active and JobState.PENDING.is_active


@pytest.mark.parametrize(
    "code,state",
    [
        ("PD", JobState.PENDING), ("PENDING", JobState.PENDING), ("CG", JobState.RUNNING),
        ("CANCELLED by 0", JobState.CANCELLED), ("CANCELLED+", JobState.CANCELLED),
        ("TO", JobState.TIMEOUT), ("DEADLINE", JobState.TIMEOUT), ("OOM", JobState.FAILED),
        ("NODE_FAIL", JobState.FAILED), ("REQUEUE_HOLD", JobState.REQUEUED), ("RQ", JobState.REQUEUED),
        ("PR", JobState.PREEMPTED), ("BOOT_FAIL", JobState.FAILED), ("SPECIAL_EXIT", JobState.FAILED),
        ("REVOKED", JobState.CANCELLED), ("SUSPENDED", JobState.RUNNING), ("CONFIGURING", JobState.PENDING),
    ],
)
def test_slurm_state_codes(code: str, state: JobState) -> None:
    assert slurm_state(code) is state


def test_slurm_unknown_state_raises() -> None:
    with pytest.raises(ValueError, match="unknown Slurm job state 'BOGUS'"):
        slurm_state("BOGUS")


def test_every_table_maps_to_jobstate() -> None:
    for table in (SLURM_STATES, PBS_STATES, COBALT_STATES):
        assert all(isinstance(v, JobState) for v in table.values())
    # every long Slurm name has its short code and they agree
    pairs = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "TIMEOUT": "TO",
             "CANCELLED": "CA", "PREEMPTED": "PR", "NODE_FAIL": "NF", "OUT_OF_MEMORY": "OOM",
             "REQUEUED": "RQ", "COMPLETING": "CG", "SUSPENDED": "S", "BOOT_FAIL": "BF", "DEADLINE": "DL"}
    for long, short in pairs.items():
        assert SLURM_STATES[long] is SLURM_STATES[short], long


def test_slurm_reasons_readable() -> None:
    assert slurm_reason("None") == ""
    assert "depends on failed" in slurm_reason("DependencyNeverSatisfied")
    assert "QOS" in slurm_reason("QOSMaxNodePerJobLimit")
    assert slurm_reason("ReqNodeNotAvail, UnavailableNodes:nid1").endswith("(UnavailableNodes:nid1)")
    assert slurm_reason("SomeNewReason") == "SomeNewReason"


@pytest.mark.parametrize(
    "status,comment,state",
    [
        (0, "", JobState.COMPLETED), (-29, "", JobState.TIMEOUT), (271, "", JobState.CANCELLED),
        (271, "job killed: walltime 3610 exceeded limit 3600", JobState.TIMEOUT), (2, "", JobState.FAILED),
        (-27, "", JobState.FAILED), (-11, "", JobState.REQUEUED), (267, "", JobState.FAILED),
        (None, "Job deleted by alice before it ran", JobState.CANCELLED),
    ],
)
def test_pbs_exit_status(status: int | None, comment: str, state: JobState) -> None:
    assert pbs_exit_state(status, comment)[0] is state


# --- Slurm, real outputs ---------------------------------------------------------------------------------


def test_squeue_real() -> None:
    got = slurm_backend.parse_squeue(read("slurm_squeue.txt"))
    assert got["1"].state is JobState.COMPLETED
    assert got["2"].state is JobState.FAILED and "non-zero" in got["2"].reason_text
    assert got["3"].state is JobState.TIMEOUT and "walltime" in got["3"].reason_text
    assert got["4"].state is JobState.CANCELLED
    assert got["5"].state is JobState.PENDING and "held by the user" in got["5"].reason_text
    assert got["6"].reason_text.startswith("will never start")
    assert {k for k in got if k.startswith("7_")} == {"7_0", "7_1", "7_2", "7_3"}
    assert got["7_1"].state is JobState.FAILED and got["7_2"].state is JobState.COMPLETED
    assert got["9"].state is JobState.RUNNING
    assert got["10"].state is JobState.FAILED  # the name "st name|pipe" must not shift the columns
    assert got["10"].raw_state == "FAILED"


def test_squeue_pending_array_range() -> None:
    got = slurm_backend.parse_squeue(read("slurm_squeue_array_pending.txt"))
    assert list(got) == ["15_[0-3]"] and got["15_[0-3]"].state is JobState.PENDING


def test_scontrol_real() -> None:
    got = slurm_backend.parse_scontrol_job(read("slurm_scontrol.txt"))
    assert got["2"].exit_code == 3 and got["2"].state is JobState.FAILED
    assert got["3"].state is JobState.TIMEOUT
    assert got["10"].signal == 9 and "signal 9" in got["10"].reason_text
    assert got["8"].restart_count == 1 and got["8"].state is JobState.COMPLETED
    assert got["14"].restart_count == 1 and got["14"].state is JobState.PENDING
    # the array master line (JobId=7 is task 3) is keyed like squeue keys it
    assert {"7_0", "7_1", "7_2", "7_3"} <= set(got) and "7" not in got
    assert got["7_3"].exit_code == 1


def test_scontrol_values_with_spaces() -> None:
    kv = slurm_backend.parse_key_values("JobId=10 JobName=st name|pipe UserId=root(0) CPUs/Task=1 AllocNode:Sid=h:1 "
                             "TRES=cpu=1,mem=1M")
    assert kv["JobName"] == "st name|pipe"
    assert kv["CPUs/Task"] == "1" and kv["AllocNode:Sid"] == "h:1" and kv["TRES"] == "cpu=1,mem=1M"


def test_scontrol_pending_array_range() -> None:
    line = ("JobId=15 ArrayJobId=15 ArrayTaskId=0-3 JobName=x JobState=PENDING Reason=JobHeldUser "
            "Restarts=0 ExitCode=0:0")
    assert list(slurm_backend.parse_scontrol_job(line)) == ["15_[0-3]"]


def test_sacct_completion_real() -> None:
    got = slurm_backend.parse_sacct_completion(read("slurm_sacct_completion.txt"))
    assert got["1"].state is JobState.COMPLETED and got["1"].exit_code == 0
    assert got["2"].exit_code == 3
    assert got["3"].state is JobState.TIMEOUT
    # requeued: one record per run; the last one wins and the earlier ones count as restarts
    assert got["8"].state is JobState.COMPLETED and got["8"].restart_count == 1
    assert got["14"].state is JobState.PENDING
    # the filetxt plug-in lost the state of the job whose name has a space: read as failed, never success
    assert got["10"].state is JobState.FAILED and got["10"].signal == 9
    assert "7" in got and "7_1" not in got


def test_unknown_job_errors_real() -> None:
    assert sp.is_unknown_job_error(read("slurm_squeue_unknown.stderr.txt"))
    assert sp.is_unknown_job_error(read("slurm_scontrol_unknown.stderr.txt"))
    assert not sp.is_unknown_job_error(read("slurm_sacct_disabled.stderr.txt"))


# --- Slurm sacct (synthetic), PBS, Cobalt -------------------------------------------------------------------


def test_sacct_synthetic() -> None:
    got = slurm_backend.parse_sacct(read("slurm_sacct.txt"))
    assert not any("." in k for k in got)  # steps ignored
    assert got["101"].state is JobState.COMPLETED
    assert got["103"].state is JobState.TIMEOUT  # the step's CANCELLED must not override the job
    assert got["104"].state is JobState.CANCELLED and "uid 1234" in got["104"].reason_text
    assert got["105"].state is JobState.PENDING and "priority" in got["105"].reason_text
    assert got["107"].state is JobState.RUNNING and got["107"].restart_count == 2
    assert got["108_1"].state is JobState.FAILED and got["108_1"].signal == 125
    assert got["108_[2-5]"].state is JobState.PENDING
    assert got["109"].state is JobState.FAILED and got["109"].raw_state == "NODE_FAIL"
    assert got["110"].state is JobState.PREEMPTED
    assert "QOS" in got["111"].reason_text
    assert got["113"].reason_text.startswith("a required node is down")


def test_pbs_json() -> None:
    got = pbs_backend.parse_pbs_qstat_json(read("pbs_qstat_x_f.json"))
    assert got["1001.polaris-pbs-01"].state is JobState.COMPLETED
    t = got["1002.polaris-pbs-01"]
    assert t.state is JobState.TIMEOUT and "WALLTIME" in t.reason_text and t.exit_code == -29
    assert got["1003.polaris-pbs-01"].state is JobState.CANCELLED and got["1003.polaris-pbs-01"].signal == 15
    assert got["1004.polaris-pbs-01"].state is JobState.FAILED and got["1004.polaris-pbs-01"].exit_code == 2
    q = got["1005.polaris-pbs-01"]
    assert q.state is JobState.PENDING and "Insufficient amount of resource" in q.reason_text
    r = got["1006.polaris-pbs-01"]
    assert r.state is JobState.RUNNING and r.restart_count == 1
    assert got["1007.polaris-pbs-01"].reason_text.startswith("held")
    assert got["1008[].polaris-pbs-01"].state is JobState.RUNNING
    assert got["1008[1].polaris-pbs-01"].state is JobState.FAILED
    assert got["1009.polaris-pbs-01"].state is JobState.CANCELLED
    assert got["1010.polaris-pbs-01"].state is JobState.RUNNING
    assert pbs_backend.parse_pbs_qstat_json("") == {}
    with pytest.raises(ValueError, match="not JSON"):
        pbs_backend.parse_pbs_qstat_json("qstat: Unknown Job Id 1.x")


def test_cobalt() -> None:
    got = cobalt_backend.parse_cobalt_qstat(read("cobalt_qstat_lf.txt"))
    assert list(got) == ["512301", "512302", "512303", "512304", "512305", "512306"]
    assert got["512301"].state is JobState.RUNNING
    assert got["512302"].state is JobState.PENDING
    assert got["512303"].state is JobState.PENDING and "depends" in got["512303"].reason_text
    assert got["512304"].reason_text.startswith("held by the user")
    assert got["512305"].state is JobState.RUNNING  # exiting: the final word is in the cobaltlog
    assert got["512306"].state is JobState.FAILED


def test_argv_builders_are_lists() -> None:
    argv = slurm_backend.sacct_argv(["1", "2"])
    assert argv[-2:] == ["-j", "1,2"] and "JobID,JobName,State" in argv[5]
    assert slurm_backend.squeue_argv(["5"])[-1] == "5" and pbs_backend.pbs_qstat_argv(["1.s"])[-1] == "1.s"


# --- live Slurm -------------------------------------------------------------------------------------------


@pytest.mark.slurm
def test_live_slurm_exit_code_and_missing(slurm: SlurmCluster, tmp_path: Path) -> None:
    fail = str(slurm.sbatch("-J", "hpctrain-test-status", "-o", "/dev/null", "--wrap", "exit 7",
                            cwd=tmp_path))
    held = str(slurm.sbatch("-J", "hpctrain-test-status", "-H", "-o", "/dev/null", "--wrap", "true",
                            cwd=tmp_path))
    try:
        slurm.wait_for_state(fail, ["FAILED"])
        ids = [fail, held, "999999"]
        out = subprocess.run(slurm_backend.squeue_argv(ids), capture_output=True, text=True, timeout=30)
        got = combine(ids, None, slurm_backend.parse_squeue(out.stdout))  # production's merge, live view only
        assert got[fail].state is JobState.FAILED
        assert got[held].state is JobState.PENDING and "held" in got[held].reason_text
        assert got["999999"].state is JobState.MISSING
        answer = subprocess.run(slurm_backend.scontrol_argv(fail), capture_output=True, text=True, timeout=30)
        sc = slurm_backend.parse_scontrol_job(answer.stdout)
        assert sc[fail].exit_code == 7
        comp = subprocess.run(slurm_backend.sacct_completion_argv([fail]), capture_output=True, text=True, timeout=30)
        assert slurm_backend.parse_sacct_completion(comp.stdout)[fail].exit_code == 7
    finally:
        subprocess.run(["scancel", held], capture_output=True, timeout=30)


# --- node failures and node availability (Slurm) ---------------------------------------------------------------


def test_sacct_runs_of_a_requeued_job_keep_how_each_ended() -> None:
    text = ("327|wrap|NODE_FAIL|0:0|None|00:00:40|t|t|node[01-02]\n"
            "327|wrap|REQUEUED|0:0|None|00:00:40|t|t|node[03-04]\n"
            "327|wrap|RUNNING|0:0|None|00:00:03|t|Unknown|node[03,05]\n")
    (status,) = slurm_backend.parse_sacct(text).values()
    assert status.state is JobState.RUNNING and status.restart_count == 2
    assert status.earlier_runs == (sp.PastRun("NODE_FAIL", "node[01-02]"), sp.PastRun("REQUEUED", "node[03-04]"))


def test_an_active_job_counts_the_failed_run_accounting_still_shows_last() -> None:
    """sacct may list only the run that ended with its node while squeue already shows the job again."""

    accounting = slurm_backend.parse_sacct("327|wrap|NODE_FAIL|0:0|None|00:00:40|t|t|node[01-02]\n")
    live = slurm_backend.parse_squeue("327|PENDING|BeginTime|0:00||wrap\n")
    (status,) = combine(["327"], accounting, live).values()
    assert status.state is JobState.PENDING and status.restart_count == 1
    assert status.earlier_runs == (sp.PastRun("NODE_FAIL", "node[01-02]"),)


def test_srun_names_the_node_it_lost() -> None:
    from hpctrain.submission.schedulers.slurm import SCHEDULER

    log = ("hpctrain: node 1 (node02): 1 ranks 1\nsrun: error: Node failure on node02\n"
           "slurmstepd-node01: error: *** JOB 299 ON node01 CANCELLED AT 2026 DUE TO NODE FAILURE ***\n"
           "srun: error: Node failure on node02\nsrun: error: Node failure on node05\n")
    assert SCHEDULER.parse_lost_nodes(log) == ["node02", "node05"]
    argv = SCHEDULER.lost_nodes_argv("/runs/r 1", "299")
    assert argv is not None and argv[-1] == "/runs/r 1/slurm-299.out"  # a path is an argument, never script text
    with pytest.raises(Exception, match="job id"):
        SCHEDULER.lost_nodes_argv("/runs/r", "299; rm -rf /")


def test_sinfo_node_states_tell_usable_from_broken() -> None:
    text = ("node01|idle|none\nnode02|down*|Not responding\nnode03|allocated|none\nnode04|drained|maintenance\n"
            "node05|mixed|none\nnode06|idle*|none\nnode07|draining|bad dimm\nnode08|idle~|none\nnode01|idle|none\n")
    nodes = {n.name: n for n in slurm_backend.parse_sinfo_nodes(text)}
    assert sorted(n for n, v in nodes.items() if v.usable) == ["node01", "node03", "node05", "node08"]
    assert nodes["node02"].reason == "Not responding" and nodes["node02"].state == "down*"
    assert nodes["node01"].reason == "" and len(nodes) == 8


def test_a_requeue_after_a_node_failure_reads_as_one(tmp_path: Path) -> None:
    """The chain entry a node failure closed says which node; the view of the run goes on from it. A requeue the
    ranks asked for (exit 75) keeps its words."""
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.schedulers.slurm import SCHEDULER
    from hpctrain.submission.tracking import lost_node_jobs, record_requeues
    from hpctrain.submission.views import view_of

    with RunRegistry(tmp_path / "registry.db") as reg:
        runs = {}
        for job in ("41", "42"):
            run = reg.create_run("r", "ci-cluster", "h", str(tmp_path / job))
            reg.add_submission(run.run_id, job, "submit", ok=True)
            runs[job] = run
        statuses = {
            "41": JobStatus("41", JobState.RUNNING, restart_count=1, raw_state="RUNNING",
                            earlier_runs=(sp.PastRun("NODE_FAIL", "node[01-02]"),)),
            "42": JobStatus("42", JobState.RUNNING, restart_count=1, raw_state="RUNNING",
                            earlier_runs=(sp.PastRun("REQUEUED", "node[03-04]"),)),
        }
        assert lost_node_jobs(reg, SCHEDULER, statuses, runs) == ["41"]
        lost = {"41": "a node failure (node02 stopped answering the scheduler)"}
        assert record_requeues(reg, statuses, runs, lost, SCHEDULER) == 2
        reg.update_states(statuses)
        assert lost_node_jobs(reg, SCHEDULER, statuses, runs) == []  # recorded: not asked again
        first = reg.chain(runs["41"].run_id)[0]
        assert (first.state, first.exit_code) == ("requeued", None) and first.state_reason.startswith(lost["41"])
        assert view_of(reg, reg.get_run(runs["41"].run_id)).reason == f"restart 1, after {lost['41']}"
        assert view_of(reg, reg.get_run(runs["42"].run_id)).reason == "restart 1, after a checkpoint"
        assert reg.chain(runs["42"].run_id)[0].exit_code == 75


# --- a reason to wait belongs to a waiting job (Slurm) -----------------------------------------------------------
# Slurm keeps the hold after a requeue (Reason=BeginTime) on the job once it has run: in sacct's record of the run
# that completed, and in squeue/scontrol of a job cancelled in that hold. The lines are the recorded outputs' shapes
# (slurm_sacct.txt, slurm_squeue.txt, slurm_scontrol.txt) with the states of those two jobs.

REQUEUED_THEN_COMPLETED = ("8|st-requeue|REQUEUED|0:0|None|00:00:05|2026-11-22T02:37:30|2026-11-22T02:37:35|"
                           "localhost\n"
                           "8|st-requeue|COMPLETED|0:0|BeginTime|00:00:30|2026-11-22T02:37:47|2026-11-22T02:38:17|"
                           "localhost\n")
REQUEUED_THEN_CANCELLED = ("14|st-requeue2|REQUEUED|0:0|None|00:00:05|2026-11-22T02:37:40|2026-11-22T02:37:45|"
                           "localhost\n"
                           "14|st-requeue2|CANCELLED by 0|0:0|BeginTime|00:00:00|2026-11-22T02:37:52|"
                           "2026-11-22T02:37:52|None assigned\n")


def _scontrol_of_14(state: str) -> str:
    (line,) = [x for x in read("slurm_scontrol.txt").splitlines() if x.startswith("JobId=14 ")]
    return line.replace("JobState=PENDING", f"JobState={state}")


@pytest.mark.parametrize("parse,text,state", [
    (slurm_backend.parse_sacct, REQUEUED_THEN_COMPLETED, JobState.COMPLETED),
    (slurm_backend.parse_sacct, REQUEUED_THEN_CANCELLED, JobState.CANCELLED),
    (slurm_backend.parse_squeue, "14|CANCELLED|BeginTime|0:05||st-requeue2\n", JobState.CANCELLED),
    (slurm_backend.parse_squeue, "14|COMPLETED|BeginTime|0:30|localhost|st-requeue2\n", JobState.COMPLETED),
    (slurm_backend.parse_squeue, "14|RUNNING|BeginTime|0:03|localhost|st-requeue2\n", JobState.RUNNING),
    (slurm_backend.parse_scontrol_job, _scontrol_of_14("CANCELLED"), JobState.CANCELLED),
    (slurm_backend.parse_scontrol_job, _scontrol_of_14("COMPLETED"), JobState.COMPLETED),
    (slurm_backend.parse_sacct, "105|ffn-local|RUNNING|0:0|Priority|00:03:10|2026-11-20T10:09:00|Unknown|nid000020\n",
     JobState.RUNNING),
])
def test_a_job_that_runs_or_has_ended_is_never_said_to_wait(
        parse: Callable[[str], dict[str, JobStatus]], text: str, state: JobState) -> None:
    (status,) = parse(text).values()
    assert status.state is state
    assert "waiting" not in status.reason_text and "priority" not in status.reason_text, status.reason_text
    if status.raw_state.startswith("CANCELLED by"):
        assert status.reason_text == "cancelled by uid 0"


def test_a_waiting_job_keeps_its_reason_and_an_ended_one_why_it_ended() -> None:
    assert slurm_backend.parse_squeue(read("slurm_squeue.txt"))["14"].reason_text == \
        "waiting for its requested start time"
    assert slurm_backend.parse_scontrol_job(_scontrol_of_14("REQUEUE_HOLD"))["14"].reason_text == \
        "waiting for its requested start time"
    ended = slurm_backend.parse_sacct(read("slurm_sacct.txt"))
    assert "walltime" in ended["103"].reason_text and "out of memory" in ended["108_1"].reason_text
    never = slurm_backend.parse_squeue("6|CANCELLED|DependencyNeverSatisfied|0:00||st-dep\n")["6"]
    assert never.reason_text.startswith("will never start")  # why Slurm cancelled it (kill_invalid_depend)


def _requeued_run(reg: RunRegistry, tmp_path: Path, job: str, text: str) -> Run:
    """A Slurm run whose job was requeued once, polled with ``text`` (sacct -D) as a poll would record it."""
    from hpctrain.submission.run_record import META_FILE, RunMeta, record_dir
    from hpctrain.submission.schedulers.slurm import SCHEDULER
    from hpctrain.submission.tracking import record_requeues

    run = reg.create_run("r", "ci-slurm", "h", str(tmp_path / job))
    reg.add_submission(run.run_id, job, "submit", ok=True)
    (record_dir(reg, run.run_id)).mkdir(parents=True)
    (record_dir(reg, run.run_id) / META_FILE).write_text(RunMeta("slurm", max_requeues=5).to_json())
    statuses = slurm_backend.parse_sacct(text)
    assert record_requeues(reg, statuses, {job: run}, {}, SCHEDULER) == 1
    reg.update_states(statuses)
    return reg.get_run(run.run_id)


def test_status_runs_and_the_report_of_a_requeued_run_that_ended_do_not_say_it_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.cli import main
    from hpctrain.commands.status import rows_of
    from hpctrain.report.collect import ReportData
    from hpctrain.report.html import summary
    from hpctrain.report.source import facts_of
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.views import view_of

    monkeypatch.setenv("HPCTRAIN_REGISTRY", str(tmp_path / "registry.db"))
    with RunRegistry() as reg:
        completed = _requeued_run(reg, tmp_path, "8", REQUEUED_THEN_COMPLETED)
        cancelled = _requeued_run(reg, tmp_path, "14", REQUEUED_THEN_CANCELLED)
        views = {run.state: view_of(reg, run) for run in (completed, cancelled)}
        assert views["completed"].reason == "in restart 1 of 5"
        assert views["cancelled"].reason == "cancelled by uid 0; exit code 0; in restart 1 of 5"
        texts = {state: summary(ReportData(facts_of(reg, run))) for state, run in
                 (("completed", completed), ("cancelled", cancelled))}
    assert main(["runs"]) == 0
    shown = {"status": "\n".join(" ".join(row) for row in rows_of(list(views.values()))),
             "runs": capsys.readouterr().out, **texts}
    for where, text in shown.items():
        assert "waiting" not in text and "start time" not in text, (where, text)
        assert "in restart 1 of 5" in text, (where, text)


def test_a_requeue_hold_recorded_before_is_not_shown_once_the_run_ended(tmp_path: Path) -> None:
    """A registry may hold the hold's words on an ended run from a poll made before the parsers dropped them."""
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.views import view_of

    with RunRegistry(tmp_path / "registry.db") as reg:
        run = _requeued_run(reg, tmp_path, "8", REQUEUED_THEN_COMPLETED)
        stale = JobStatus("8", JobState.COMPLETED, "waiting for its requested start time", 0, 1, "COMPLETED")
        reg.update_states({"8": stale})
        run = reg.get_run(run.run_id)
        assert run.state_reason == "waiting for its requested start time"
        assert view_of(reg, run).reason == "in restart 1 of 5"
