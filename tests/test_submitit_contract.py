"""submitit's plug-in contract: its own plug-in tests against the installed hpctrain plug-in, the job's
``_interrupt`` (the checkpoint signal now, as before the walltime) and the environment's ``_requeue``, with
real jobs on the ``local`` site (hpctrain's local controller and launcher).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
import submitit
import submitit_support
from submitit.core import plugins
from submitit_support import Places, Resumable, requeue_once, wait_for

from hpctrain.errors import SchedulerError
from hpctrain.submission.api import RunHandle
from hpctrain.submission.registry import RunRegistry
from hpctrain.submitit_plugin.environment import HpctrainJobEnvironment
from hpctrain.submitit_plugin.job import HpctrainJob

cloudpickle.register_pickle_by_value(submitit_support)
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = pytest.mark.timeout(300)

# These two assert that submitit finds no executor but its own three and the one the test installs: true only
# where no plug-in is installed, hpctrain's included. Every other test of the file runs.
NEEDS_NO_PLUGIN_INSTALLED = ("test_find_good_plugin", "test_skip_bad_plugin")


@pytest.mark.processes
def test_submitits_own_plugin_tests_pass_with_hpctrain_installed(tmp_path: Path) -> None:
    """submitit.core.test_plugins, run as submitit's CI runs it, finds hpctrain's executor and job environment
    through the entry points and holds them to the contract (``_requeue`` overridden, affinity, not active
    outside a job)."""
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")  # submitit's tests, not this repository's pytest settings
    argv = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
            "-p", "no:xdist", "-v", "--pyargs", "submitit.core.test_plugins",
            "-k", " and ".join(f"not {name}" for name in NEEDS_NO_PLUGIN_INSTALLED)]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = set(re.findall(r"::(\S+) PASSED", done.stdout))
    environments = plugins.get_job_environments()
    assert "hpctrain" in environments and "hpctrain" in plugins.get_executors()
    assert {f"test_env[env{i}]" for i in range(len(environments))} <= passed  # hpctrain's among them
    assert "test_executors[HpctrainExecutor]" in passed
    assert not re.search(r"\b(FAILED|ERROR)\b", done.stdout)
    assert not passed & set(NEEDS_NO_PLUGIN_INSTALLED)
    assert HpctrainJobEnvironment._requeue is not submitit.JobEnvironment._requeue


def _executor(places: Places, **parameters: object) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_run_root=str(places.runs),
                               hpctrain_max_num_timeout=2)
    ex.update_parameters(timeout_min=10, **parameters)
    return ex


def _chain(job: HpctrainJob) -> list[str]:
    """The run's submissions once it has ended (a poll records the requeue)."""
    assert RunHandle(job.run_id).wait(timeout=60, poll_s=0.5).state == "completed"
    with RunRegistry() as reg:
        return [s.kind for s in reg.chain(job.run_id)]


@pytest.mark.processes
def test_interrupt_sends_the_checkpoint_signal_now_and_the_job_is_requeued(places: Places) -> None:
    """``job._interrupt()`` (submitit's way to test preemption): the local controller hands the job its
    checkpoint signal at once, 10 minutes before the walltime would; rank 0 checkpoints, the job is run again
    and continues from the checkpointed state."""
    marker = places.root / "marker"
    job = _executor(places).submit(Resumable(str(marker)))
    assert isinstance(job, HpctrainJob)
    wait_for(marker.exists, 120, "the callable started")
    job._interrupt()
    result = job.result()
    assert result["runs"] == 2 and result["resumed_from"] > 0 and result["count"] == result["resumed_from"]
    assert _chain(job) == ["submit", "requeue"]
    assert "stopped at a checkpoint" in (job.stderr() or "")


@pytest.mark.processes
def test_interrupt_of_a_job_that_has_ended_is_a_clear_error(places: Places) -> None:
    job = _executor(places).submit(submitit_support.square, 3)
    assert job.result() == 9
    wait_for(lambda: job.state == "COMPLETED", 60, f"COMPLETED (state {job.state})")
    with pytest.raises(SchedulerError, match=r"sending SIGUSR2 to job \d+ of run .* failed: .*is not running"):
        job._interrupt(timeout=True)


@pytest.mark.processes
@pytest.mark.parametrize("tasks", [1, 2])
def test_requeue_from_the_job_environment_requeues_the_job(places: Places, tasks: int) -> None:
    """``submitit.JobEnvironment()._requeue(countdown)``, as submitit's signal handler calls it: every task
    exits 75, the batch script puts the job back in line (here the local controller runs it again)."""
    job = _executor(places, tasks_per_node=tasks).submit(requeue_once)
    results = job.results()
    assert [r["requeued"] for r in results] == [True] * tasks
    assert [r["restarts"] for r in results] == [1] * tasks and [r["rank"] for r in results] == list(range(tasks))
    assert _chain(job) == ["submit", "requeue"]
    log = job.task(0).stderr() or ""  # both attempts: a requeue, not an error result overwritten later
    assert "asked for a requeue" in log and "the callable raised" not in log


def test_each_back_end_says_how_it_signals_a_running_job() -> None:
    """What ``_interrupt`` runs on the login node: the batch shell gets the signal, as the walltime warning
    comes (Slurm's B:, PBS's session leader, the local supervisor's script); Cobalt has no such command."""
    from hpctrain.submission.schedulers.base import get_scheduler

    assert get_scheduler("slurm").signal_argv("12_3", "/r", "USR2") == ["scancel", "--batch", "--signal=USR2",
                                                                          "12_3"]
    assert get_scheduler("pbs").signal_argv("7.pbs01", "/r", "USR1") == ["qsig", "-s", "USR1", "7.pbs01"]
    assert get_scheduler("cobalt").signal_argv("99", "/r", "USR2") is None
    assert get_scheduler("local").signal_argv("4242", "/r", "USR2")[-5:] == ["signal", "--", "4242", "/r", "USR2"]
