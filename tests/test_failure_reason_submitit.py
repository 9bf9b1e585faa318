"""submitit on the ``local`` site: a task killed with SIGKILL is the job's error ("rank 1 killed by SIGKILL", the
local launcher's line as hpctrain's reason), not the other task's missing result or its exit code."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
import submitit_support
from submitit.core.utils import UncompletedJobError
from submitit_support import Places, wait_for

from hpctrain.submission.failure import FAILURE_FILE

cloudpickle.register_pickle_by_value(sys.modules[__name__])
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = pytest.mark.timeout(300)


def hold_and_say_pid(directory: str, seconds: float) -> int:
    """Each task writes its pid to DIRECTORY/task-N, then waits (to be killed)."""
    rank = submitit.JobEnvironment().global_rank
    tmp = Path(directory, f".task-{rank}")
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(directory, f"task-{rank}"))
    time.sleep(seconds)
    return rank


@pytest.mark.processes
def test_a_killed_task_is_the_error_of_a_multi_task_job(places: Places) -> None:
    pids = places.root / "pids"
    pids.mkdir()
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_run_root=str(places.runs))
    ex.update_parameters(timeout_min=5, tasks_per_node=2)
    job = ex.submit(hold_and_say_pid, str(pids), 600)
    wait_for(lambda: (pids / "task-0").exists() and (pids / "task-1").exists(), 120, "both tasks started")
    os.kill(int((pids / "task-1").read_text()), signal.SIGKILL)
    error = job.exception()
    assert isinstance(error, UncompletedJobError)
    assert "hpctrain: rank 1 killed by SIGKILL" in str(error), str(error)[-3000:]
    (run_dir,) = [p for p in places.runs.iterdir() if p.is_dir()]
    assert (run_dir / FAILURE_FILE).read_text() == "rank 1 killed by SIGKILL\n"
