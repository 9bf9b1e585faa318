"""Cobalt through a STAND-IN: ``tests/standins/cobalt_qsub`` and ``cobalt_qstat`` (no Cobalt exists any more;
ALCF Theta retired in 2023). What is real: the rendered ``#COBALT`` batch script runs under bash from start to
end (prologue, signal timer, the local launcher, the exit record, the resubmission block), and hpctrain's
submission, batched status polling and run registry. What the stand-in fakes: the queue — its ``qsub`` prints a
new numeric id after a warning line (as Cobalt's does) and runs the script at once in the background with
``COBALT_JOBID`` set, ignoring ``--dependencies``; its ``qstat -l -f`` lists a job only while that script runs
and forgets it when it ends, as Cobalt's qstat forgets finished jobs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import TinyJob, write_standin_site

from hpctrain.submission.api import read_log, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import TransportPool
from hpctrain.submission.views import is_terminal

STANDINS = Path(__file__).resolve().parent / "standins"


@pytest.fixture
def env(isolated_home: Path, tiny_job: TinyJob, monkeypatch: pytest.MonkeyPatch) -> Path:
    tmp_path = isolated_home  # the test's tmp_path
    bin_dir, state = tmp_path / "bin", tmp_path / "cobalt-state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "qsub").symlink_to(STANDINS / "cobalt_qsub")
    (bin_dir / "qstat").symlink_to(STANDINS / "cobalt_qstat")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COBALT_STANDIN", str(state))
    # A walltime long enough for a signal 30 s before it, and two requeues for the chain test.
    tiny_job("tiny-cobalt", walltime="00:10:00", checkpoint="{signal_lead_s: 30, max_requeues: 2}")
    write_standin_site(tmp_path, "cobalt-standin", "cobalt")
    return tmp_path


def _run_to_the_end(env: Path, command: list[str]) -> tuple[RunRegistry, object, list[str]]:
    reg = RunRegistry()
    done = submit_runs(env / "tiny.yaml", str(env / "cobalt-standin.yaml"), command=command, registry=reg)
    (run,) = done.runs
    states = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        (view,) = poll_runs(reg, [run], TransportPool())
        states.append(view.state)
        if is_terminal(view.state):
            break
        time.sleep(0.3)
    return reg, run, states


def test_a_finished_cobalt_job_is_completed_not_missing(env: Path) -> None:
    """qstat forgets the job when it ends; the script's exit record says how it ended."""
    reg, run, states = _run_to_the_end(env, ["sh", "-c", "echo cobalt hello"])
    with reg:
        assert states[-1] == "completed", states
        assert "missing" not in states
        (first,) = reg.chain(run.run_id)
        assert first.exit_code == 0
        assert "cobalt hello" in read_log(reg, run)
        record = json.loads(Path(run.run_dir, "job-exit.jsonl").read_text())
        assert record == {"event": "exit", "job": first.job_id, "status": 0}


def test_a_failed_cobalt_job_is_failed_with_its_exit_code(env: Path) -> None:
    reg, run, states = _run_to_the_end(env, ["sh", "-c", "exit 3"])
    with reg:
        assert states[-1] == "failed", states
        (first,) = reg.chain(run.run_id)
        assert first.exit_code == 3


def test_a_cobalt_job_stopped_at_a_checkpoint_resubmits_itself_into_the_chain(env: Path) -> None:
    """The first job exits 75 (as `hpctrain run` after a checkpoint), the script submits itself again with
    HPCTRAIN_RESTART_COUNT=1 and exits 0; polling finds the new id in the exit record, adds it to the run's
    chain and follows it to the end."""
    rank = ('if [ "${HPCTRAIN_RESTART_COUNT:-0}" -ge 1 ]; then echo second run; exit 0; fi; '
            "echo first run; exit 75")
    reg, run, states = _run_to_the_end(env, ["sh", "-c", rank])
    with reg:
        assert states[-1] == "completed", states
        chain = reg.chain(run.run_id)
        assert [(s.kind, s.ok) for s in chain] == [("submit", True), ("resubmit", True)]
        first, second = chain[0].job_id, chain[1].job_id
        assert second == str(int(first) + 1)
        assert chain[0].state == "completed" and chain[1].state == "completed"
        log = read_log(reg, run)
        assert log.index("first run") < log.index(f"resubmitted as job {second}") < log.index("second run")
        records = [json.loads(line) for line in Path(run.run_dir, "job-exit.jsonl").read_text().splitlines()]
        assert records == [{"event": "exit", "job": first, "status": 75},
                           {"event": "resubmit", "job": first, "new_job": second},
                           {"event": "exit", "job": second, "status": 0}]


def test_exit_records_resolve_jobs_the_scheduler_did_not_answer_for(tmp_path: Path) -> None:
    """``apply_exit_records`` on its own: with no scheduler answer at all (None) a job with records is
    resolved along its resubmission chain, a job without records stays unknown, records of other jobs and
    broken lines are ignored, and a live answer is never overridden."""
    from hpctrain.submission.schedulers.state import JobState
    from hpctrain.submission.schedulers.status_parsers import JobStatus
    from hpctrain.submission.tracking import apply_exit_records

    with RunRegistry(tmp_path / "reg.db") as reg:
        runs = {}
        for job in ("100", "200", "300"):
            run = reg.create_run("r" + job, "theta", "h", f"/runs/{job}")
            reg.add_submission(run.run_id, job, "submit", ok=True)
            runs[job] = run
        records = {"100": [{"event": "exit", "job": "100", "status": 75},
                           {"event": "resubmit", "job": "100", "new_job": "101"},
                           {"event": "exit", "job": "101", "status": 75},
                           {"event": "resubmit", "job": "101", "new_job": "102"}],
                   "200": [{"event": "exit", "job": "199", "status": 0}],  # an earlier job of the chain
                   "300": [{"event": "exit", "job": "300", "status": 0}]}
        got = apply_exit_records(reg, None, runs, records)
        assert got["100"].state is JobState.COMPLETED and "resubmitted as job 101" in got["100"].reason_text
        assert got["101"].state is JobState.COMPLETED and got["102"].state is JobState.PENDING
        assert [s.job_id for s in reg.chain(runs["100"].run_id)] == ["100", "101", "102"]
        assert "200" not in got  # nothing known: the caller keeps it unknown and reports the poll error
        assert got["300"].exit_code == 0
        live = {"300": JobStatus("300", JobState.RUNNING)}  # a requeued job running again: the scheduler wins
        assert apply_exit_records(reg, live, {"300": runs["300"]}, records)["300"].state is JobState.RUNNING
        again = apply_exit_records(reg, None, runs, records)  # a second poll adds no duplicate chain rows
        assert again["102"].state is JobState.PENDING and len(reg.chain(runs["100"].run_id)) == 3
        # PBS with job history still lists a job that resubmitted itself, as finished: its state stands, and
        # the resubmission still joins the chain.
        run = reg.create_run("r400", "polaris", "h", "/runs/400")
        reg.add_submission(run.run_id, "400.pbs", "submit", ok=True)
        ended = {"400.pbs": JobStatus("400.pbs", JobState.COMPLETED, "finished", exit_code=0)}
        pbs = apply_exit_records(reg, ended, {"400.pbs": run}, {"400.pbs": [
            {"event": "exit", "job": "400.pbs", "status": 75},
            {"event": "resubmit", "job": "400.pbs", "new_job": "401.pbs"}]})
        assert pbs["400.pbs"] == ended["400.pbs"] and pbs["401.pbs"].state is JobState.PENDING
        assert [s.job_id for s in reg.chain(run.run_id)] == ["400.pbs", "401.pbs"]
        # Slurm: squeue already lists the job FAILED (no exit code there) while sacct has no record yet (seen in
        # CI): the state stands and the script's exit code fills the gap; a record disagreeing with the state
        # (an earlier run of a requeued job) fills in nothing.
        run = reg.create_run("r500", "slurm", "h", "/runs/500")
        reg.add_submission(run.run_id, "500", "submit", ok=True)
        squeue = {"500": JobStatus("500", JobState.FAILED, "NonZeroExitCode")}
        filled = apply_exit_records(reg, squeue, {"500": run}, {"500": [{"event": "exit", "job": "500", "status": 1}]})
        assert filled["500"].state is JobState.FAILED and filled["500"].exit_code == 1
        assert filled["500"].reason_text == "NonZeroExitCode"
        stale = apply_exit_records(reg, squeue, {"500": run}, {"500": [{"event": "exit", "job": "500", "status": 0}]})
        assert stale["500"].exit_code is None
        # sacct prints the script's 137 (a rank killed by SIGKILL) as "9:0": the script's own status stands for it;
        # an exit code that is not such a fold is the scheduler's and stays.
        sacct = {"500": JobStatus("500", JobState.FAILED, "", exit_code=9)}
        killed = [{"event": "exit", "job": "500", "status": 137}]
        assert apply_exit_records(reg, sacct, {"500": run}, {"500": killed})["500"].exit_code == 137
        other = {"500": JobStatus("500", JobState.FAILED, "", exit_code=3)}
        assert apply_exit_records(reg, other, {"500": run}, {"500": killed})["500"].exit_code == 3
