"""submitit callables on the ``local`` site: hpctrain's real local controller (walltime signal, requeue on exit 75,
cancel) and local launcher run them; the laptop folder and the run root are different directories.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import cloudpickle
import pytest
import submitit
import submitit_support
from submitit.core.utils import DelayedSubmission, FailedJobError, UncompletedJobError
from submitit_support import Places, Resumable, add, fail, hold, square, task_environment, wait_for

from hpctrain.config.preflight import PreflightWarning
from hpctrain.submission.api import RunHandle
from hpctrain.submission.registry import RunRegistry
from hpctrain.submitit_plugin.job import HpctrainJob

cloudpickle.register_pickle_by_value(submitit_support)
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parent.parent


def _executor(places: Places, **parameters: object) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_run_root=str(places.runs))
    ex.update_parameters(timeout_min=5, **parameters)
    return ex


@pytest.mark.processes
def test_a_function_returns_its_result_and_logs(places: Places) -> None:
    job = _executor(places).submit(add, 2, 3)
    assert isinstance(job, HpctrainJob) and job.job_id.isdigit()
    assert job.result() == 5
    assert job.done()
    # The result comes back as the job script ends; the next polls see the run end.
    wait_for(lambda: job.state == "COMPLETED", 60, f"COMPLETED (state {job.state})")
    assert job.stdout() == "adding 2 and 3\n"
    assert "a line on stderr" in (job.stderr() or "")
    # The laptop side keeps submitit's files; the job wrote only in its run directory, under the run root.
    with RunRegistry() as reg:
        run = reg.get_run(job.run_id)
    assert Path(run.run_dir).parent == places.runs
    assert sorted(p.name for p in places.folder.iterdir()) == sorted(
        f"{job.job_id}_{suffix}" for suffix in ("submitted.pkl", "0_result.pkl", "0_log.out", "0_log.err"))
    assert job.submission().args == (2, 3)  # submitit's own pickle format, readable with submitit
    # A job pickled and loaded again (another process, later) reaches its run through the registry.
    again = pickle.loads(pickle.dumps(job))
    assert again.run_id == job.run_id and again.result() == 5 and again.state == "COMPLETED"


@pytest.mark.processes
def test_an_exception_comes_back_with_its_traceback(places: Places) -> None:
    job = _executor(places).submit(fail, 7)
    error = job.exception()
    assert isinstance(error, FailedJobError)
    text = str(error)
    assert "ValueError: bad value 7" in text and "submitit_support.py" in text and ", in fail" in text
    with pytest.raises(FailedJobError, match="bad value 7"):
        job.result()
    wait_for(lambda: job.state == "FAILED", 60, f"FAILED (state {job.state})")


@pytest.mark.processes
def test_tasks_get_their_job_environment_from_the_local_launcher(places: Places) -> None:
    job = _executor(places, tasks_per_node=2).submit(task_environment, "two")
    results = job.results()
    assert [(r["rank"], r["size"], r["local_rank"], r["node"], r["nodes"]) for r in results] == [
        (0, 2, 0, 0, 1), (1, 2, 1, 0, 1)]
    assert {r["cluster"] for r in results} == {"hpctrain"} and {r["job_id"] for r in results} == {job.job_id}
    assert results[1]["result_path"].endswith("result-1.pkl") and Path(results[1]["cwd"]).parent == places.runs
    assert job.task(1).result() == results[1]


@pytest.mark.processes
def test_map_array_and_batch_without_arrays_submit_one_run_each(places: Places) -> None:
    """The local back-end has no job arrays: each call is its own run (one controller each)."""
    ex = _executor(places)
    jobs = ex.map_array(square, [1, 2, 3])
    with ex.batch():
        batched = [ex.submit(add, i, 10) for i in range(2)]
    assert [j.result() for j in jobs] == [1, 4, 9]
    assert [j.result() for j in batched] == [10, 11]
    assert len({j.run_id for j in [*jobs, *batched]}) == 5


@pytest.mark.processes
def test_a_killed_job_is_a_clear_error_not_a_hang(places: Places) -> None:
    """The callable's process is killed (as by the OOM killer): no result ever appears; result() says how the
    job ended, with the end of its logs, as soon as hpctrain sees it ended."""
    pid_file = places.root / "pid"
    job = _executor(places).submit(hold, str(pid_file), 600)
    wait_for(pid_file.exists, 120, "the callable started")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(UncompletedJobError) as info:
        job.result()
    assert time.monotonic() - started < 60
    text = str(info.value)
    assert f"Job {job.job_id} (run {job.run_id}, task 0) has not produced any output (state: FAILED)" in text
    # the launcher's note names the rank and the signal; the status is the one the job log prints
    assert "rank 0 killed by SIGKILL; exit status 137" in text and "result-0.pkl" in text, text
    assert "launcher exited with status" in text  # the end of the job script's output
    assert isinstance(job.exception(), UncompletedJobError)


@pytest.mark.processes
def test_a_short_walltime_warns_about_requeues_only_when_the_callable_can_be_requeued(places: Places) -> None:
    """submitit's README example (one minute for a function of a few seconds) submits without a word about
    requeues that cannot happen; a Checkpointable with the same walltime is told that each run gets little time."""
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_run_root=str(places.runs))
    ex.update_parameters(timeout_min=1)
    assert ex._executor.max_num_timeout > 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job = ex.submit(add, 5, 7)
    assert [str(w.message) for w in caught if issubclass(w.category, PreflightWarning)] == []
    assert job.result() == 12
    marker = places.root / "marker"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumable = ex.submit(Resumable(str(marker)))
    said = [str(w.message) for w in caught if issubclass(w.category, PreflightWarning)]
    assert len(said) == 1 and said[0].startswith("timeout_min 00:01:00 leaves 45 s per run before the stop signal")
    assert "each of the 3 requeues (max_num_timeout)" in said[0]
    resumable.cancel()
    with pytest.raises(UncompletedJobError, match=r"state: CANCELLED"):
        resumable.result()
    # No requeue allowed: nothing to warn about for a Checkpointable either.
    never = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_max_num_timeout=0)
    assert not never._executor.may_requeue([DelayedSubmission(Resumable(str(marker)))])
    assert ex._executor.may_requeue([DelayedSubmission(Resumable(str(marker)))])
    assert not ex._executor.may_requeue([DelayedSubmission(add, 5, 7)])


@pytest.mark.processes
def test_cancel_stops_the_job(places: Places) -> None:
    pid_file = places.root / "pid"
    job = _executor(places).submit(hold, str(pid_file), 600)
    wait_for(pid_file.exists, 120, "the callable started")
    job.cancel()
    with pytest.raises(UncompletedJobError, match=r"state: CANCELLED"):
        job.result()


def _runs_json(places: Places) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "hpctrain", "runs", "--json"], capture_output=True, text=True,
                         env={**os.environ, "HPCTRAIN_HOME": str(places.home)}, cwd=REPO, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.processes
def test_a_checkpointable_is_requeued_at_the_walltime_signal_and_finishes(places: Places) -> None:
    """The local controller signals 10 s before a 20 s walltime; the runner checkpoints, exits 75; the
    controller runs the script again (what scontrol requeue does) and the callable continues from its state."""
    marker = places.root / "marker"
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_run_root=str(places.runs),
                               hpctrain_max_num_timeout=2)
    ex.update_parameters(hpctrain_walltime="00:00:20")
    job = ex.submit(Resumable(str(marker)))
    result = job.result()
    assert result["runs"] == 2 and result["resumed_from"] > 0 and result["count"] == result["resumed_from"]
    # The result is back as the job script ends; `hpctrain status` (here RunHandle) sees it end.
    assert RunHandle(job.run_id).wait(timeout=60, poll_s=0.5).state == "completed"
    (run,) = _runs_json(places)
    assert [entry["kind"] for entry in run["chain"]] == ["submit", "requeue"]  # type: ignore[index]
    assert run["state"] == "completed" and "restart 1 of 2" in str(run["reason"])
    assert "stopped at a checkpoint" in (job.stderr() or "")


@pytest.mark.processes
def test_past_max_num_timeout_the_job_ends_at_its_walltime_with_a_clear_error(places: Places) -> None:
    """hpctrain's cap: one requeue allowed; at the second signal the callable runs on and the walltime ends
    it (TIMEOUT). No result: the error names the state and the restart."""
    marker = places.root / "marker"
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_run_root=str(places.runs),
                               hpctrain_max_num_timeout=1)
    ex.update_parameters(hpctrain_walltime="00:00:20")
    job = ex.submit(Resumable(str(marker), finish=False))
    error = job.exception()
    assert isinstance(error, UncompletedJobError) and not isinstance(error, FailedJobError)
    assert "state: TIMEOUT" in str(error) and "restart 1 of 1" in str(error)
    reason = str(error).splitlines()[1]  # hpctrain's reason, below the first line
    assert reason.startswith("hpctrain: ") and "walltime of 20 s reached" in reason and "exit code" not in reason
    assert "max_requeues is 1" in str(error)  # the task's own stderr says why it was not requeued again
    assert marker.read_text() == "2\n"


@pytest.mark.processes
def test_a_task_that_raises_is_the_error_of_a_multi_task_job(places: Places) -> None:
    """Task 1 raises while task 0 waits for it; the launcher ends task 0, which leaves no result. result(),
    results() and exception() give task 1's own exception with its traceback, not task 0's missing result;
    task 0's own error says which task failed first."""
    job = _executor(places, tasks_per_node=2).submit(submitit_support.fail_on_task_1, str(places.root / "never"))
    error = job.exception()
    assert isinstance(error, FailedJobError)
    text = str(error)
    assert "Job (task=1)" in text and "ValueError: task 1 cannot go on" in text and ", in fail_on_task_1" in text
    for call in (job.results, job.result):
        with pytest.raises(FailedJobError, match="task 1 cannot go on"):
            call()
    task_0 = job.task(0).exception()
    assert isinstance(task_0, UncompletedJobError) and not isinstance(task_0, FailedJobError)
    assert "result-0.pkl" in str(task_0)
    assert "task 1 raised ValueError: task 1 cannot go on (job.task(1).exception() has its traceback)" in str(task_0)
