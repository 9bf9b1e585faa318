"""submitit callables on the real single-node Slurm (site ci-slurm): results, srun tasks' JobEnvironment, job
arrays polled in batches (transport calls counted per poll), and a Checkpointable requeued by the walltime
signal (scontrol requeue) that finishes, its chain visible in ``hpctrain runs``.

The walltime signal is made to come soon the way tests/test_requeue_slurm.py does (see its docstring):
slurmctld checks time limits every 30 s, so once the callable runs the test shortens the job's time limit
so that 60-120 s remain, with the signal 90 s before it; after the requeue the limit is restored.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
import submitit_support
from slurm_support import scontrol, seconds
from submitit_support import CountingTransport, Places, Resumable, add, square, task_environment, wait_for

from hpctrain.submission.api import RunHandle
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.transport import TransportPool
from hpctrain.submitit_plugin.job import HpctrainJob

cloudpickle.register_pickle_by_value(submitit_support)
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parent.parent


def _executor(places: Places, slurm: Any, **kwargs: Any) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site="ci-slurm",
                               hpctrain_run_root=str(places.runs), **kwargs)
    # 100 MB per job: Slurm's default memory per job would let only 4 jobs share the node's 8 CPUs.
    ex.update_parameters(timeout_min=10, mem_gb=0.1, hpctrain_queue=submitit_support.slurm_queue(slurm.partition))
    return ex


def test_a_function_runs_on_slurm_and_an_error_comes_back(places: Places, slurm: Any) -> None:
    """result() returns once the result file is there, as submitit's does, which can be while Slurm still shows
    the job COMPLETING (its processes exiting, the epilog running): the final state is waited for, not raced."""
    ex = _executor(places, slurm)
    job = ex.submit(add, 20, 22)
    assert job.result() == 42
    assert slurm.wait_for_state(job.job_id, ["COMPLETED"], timeout=300) == "COMPLETED"
    assert job.stdout() == "adding 20 and 22\n"
    with RunRegistry() as reg:
        run = reg.get_run(job.run_id)
        assert Path(run.run_dir, "job.sh").read_text().count("hpctrain.submitit_plugin.runner") == 1
    error = ex.submit(submitit_support.fail, 3).exception()
    assert error is not None and "ValueError: bad value 3" in str(error)


def test_a_job_cancelled_outside_hpctrain_is_a_clear_error(places: Places, slurm: Any) -> None:
    """scancel from another shell (or an admin): the result never appears; result() says CANCELLED at once."""
    pid_file = places.root / "pid"
    job = _executor(places, slurm).submit(submitit_support.hold, str(pid_file), 600)
    wait_for(pid_file.exists, 120, "the callable started")
    subprocess.run(["scancel", job.job_id], check=True, timeout=15)
    started = time.monotonic()
    error = job.exception()
    assert time.monotonic() - started < 60
    assert error is not None and "(state: CANCELLED)" in str(error) and "result-0.pkl" in str(error)


def test_srun_tasks_get_their_job_environment(places: Places, slurm: Any) -> None:
    ex = _executor(places, slurm)
    ex.update_parameters(tasks_per_node=2)
    job = ex.submit(task_environment, "srun")
    results = job.results()
    assert [(r["rank"], r["size"], r["local_rank"], r["node"], r["nodes"]) for r in results] == [
        (0, 2, 0, 0, 1), (1, 2, 1, 0, 1)]
    assert {r["job_id"] for r in results} == {job.job_id}


def test_map_array_of_200_tasks_polls_with_two_commands_per_poll(places: Places, slurm: Any) -> None:
    """One array job for 200 tasks; every poll of the shared watcher is ONE status command for all of them
    plus ONE command fetching the results written since (counted on the transport, not timed)."""
    calls: list[list[str]] = []
    pool = TransportPool(lambda remote, cfg: CountingTransport(calls))
    ex = _executor(places, slurm, hpctrain_pool=pool)
    ex.update_parameters(hpctrain_comm_backend="gloo")  # no MPI library check in each of the 200 scripts
    jobs = ex.map_array(square, range(200))
    assert len(jobs) == 200 and len({j.job_id.split("_")[0] for j in jobs}) == 1
    assert {j.job_id for j in jobs} == {f"{jobs[0].job_id.split('_')[0]}_{i}" for i in range(200)}
    watcher = HpctrainJob.watcher
    per_poll: list[tuple[int, int]] = []
    deadline = time.monotonic() + 480
    while True:
        before, polls = len(calls), watcher.num_calls
        finished = sum(job.done() for job in jobs)  # 200 done() calls, at most one poll
        per_poll.append((watcher.num_calls - polls, len(calls) - before))
        if finished == len(jobs):
            break
        assert time.monotonic() < deadline, f"{finished} of 200 done; per poll: {per_poll}"
        time.sleep(1)
    polled = [(p, c) for p, c in per_poll if p]
    assert polled and all(p == 1 and c <= 2 for p, c in polled), per_poll
    assert all(c == 0 for p, c in per_poll if not p)  # no command between polls
    status = [argv[-1] for argv in calls if argv[:2] == ["sh", "-c"] and "sacct" in argv[-1]]
    master = jobs[0].job_id.split("_")[0]
    assert {int(i) for i in re.findall(rf"\b{master}_(\d+)\b", status[0])} == set(range(200))  # one for all
    before = len(calls)
    assert [job.result() for job in jobs] == [i * i for i in range(200)]
    assert len(calls) == before  # every result was already fetched by the polls


def test_batch_submits_one_array(places: Places, slurm: Any) -> None:
    ex = _executor(places, slurm)
    with ex.batch():
        jobs = [ex.submit(add, i, 1) for i in range(3)]
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1
    assert [j.result() for j in jobs] == [1, 2, 3]


def test_a_checkpointable_is_requeued_by_the_walltime_signal_and_finishes(places: Places, slurm: Any) -> None:
    marker = places.root / "marker"
    ex = _executor(places, slurm, hpctrain_max_num_timeout=2)
    ex.update_parameters(hpctrain_signal_lead_s=90)
    job = ex.submit(Resumable(str(marker)))
    job_id = job.job_id
    try:
        wait_for(marker.exists, 150, f"the callable started ({scontrol(job_id)})")
        # Shorten the walltime so that 60-120 s remain (see the module docstring).
        minutes = seconds(scontrol(job_id)["RunTime"]) // 60 + 2
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"], check=True, timeout=15)
        deadline = time.monotonic() + 150
        while int(scontrol(job_id).get("Restarts", "0")) < 1:
            assert time.monotonic() < deadline, f"never requeued: {scontrol(job_id)}"
            assert not job.done(), "the callable finished before the signal came"
            time.sleep(0.5)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], check=True, timeout=15)
        result = job.result()
    except BaseException:
        subprocess.run(["scancel", job_id], timeout=15)  # not after the result: the script may still be ending
        raise
    assert result["runs"] == 2 and result["resumed_from"] > 0
    assert RunHandle(job.run_id).wait(timeout=60, poll_s=1).state == "completed"
    with RunRegistry() as reg:
        run_dir = Path(reg.get_run(job.run_id).run_dir)
    script_log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "SIGUSR2 received, forwarding it to the launcher" in script_log
    assert "launcher exited with status 75" in script_log
    assert "putting the job back in the queue (restart 1 of 2)" in script_log
    assert "stopped at a checkpoint" in (job.stderr() or "")
    out = subprocess.run([sys.executable, "-m", "hpctrain", "runs", "--json"], capture_output=True, text=True,
                         env={**os.environ, "HPCTRAIN_HOME": str(places.home)}, cwd=REPO, timeout=60, check=True)
    (run,) = json.loads(out.stdout)
    assert [(entry["kind"], entry["job_id"]) for entry in run["chain"]] == [("submit", job_id), ("requeue", job_id)]
    assert run["state"] == "completed" and "restart 1 of 2" in run["reason"]


def test_interrupt_signals_the_batch_shell_and_the_job_is_requeued(places: Places, slurm: Any) -> None:
    """``job._interrupt()``: ``scancel --batch --signal=USR2`` reaches the batch shell as the walltime warning
    does; it forwards the signal, rank 0 checkpoints, ``scontrol requeue`` puts the job back, and the callable
    continues from its state."""
    marker = places.root / "marker"
    job = _executor(places, slurm, hpctrain_max_num_timeout=2).submit(Resumable(str(marker)))
    try:
        wait_for(marker.exists, 150, f"the callable started ({scontrol(job.job_id)})")
        job._interrupt(timeout=True)
        result = job.result()
    except BaseException:
        subprocess.run(["scancel", job.job_id], timeout=15)
        raise
    assert result["runs"] == 2 and result["resumed_from"] > 0 and result["count"] == result["resumed_from"]
    assert RunHandle(job.run_id).wait(timeout=60, poll_s=1).state == "completed"
    with RunRegistry() as reg:
        run_dir = Path(reg.get_run(job.run_id).run_dir)
    script_log = (run_dir / f"slurm-{job.job_id}.out").read_text()
    assert "SIGUSR2 received, forwarding it to the launcher" in script_log
    assert "putting the job back in the queue (restart 1 of 2)" in script_log


def test_a_task_that_raises_is_the_error_of_an_srun_job(places: Places, slurm: Any) -> None:
    """srun ends task 0 when task 1 fails: the job's error is task 1's exception, not task 0's missing result."""
    ex = _executor(places, slurm)
    ex.update_parameters(tasks_per_node=2)
    job = ex.submit(submitit_support.fail_on_task_1, str(places.root / "never"))
    error = job.exception()
    assert error is not None and "Job (task=1)" in str(error) and "ValueError: task 1 cannot go on" in str(error)
    with pytest.raises(submitit.core.utils.FailedJobError, match="task 1 cannot go on"):
        job.results()
