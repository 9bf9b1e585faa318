"""submitit callables on PBS Pro and Cobalt through the STAND-INS the back-ends' own tests use (no PBS Pro or
Cobalt server exists here; see /work/shared/ENVIRONMENT.md).

PBS Pro: Debian's ``slurm-wlm-torque`` ``qsub`` runs the rendered ``#PBS`` script on the real Slurm. Real: the
PBS back-end's script, qsub argv and job id, the runner, the result fetch. Not real: the wrapper's ``qstat``
has no ``-F json``, so status polls never answer; the result file alone tells the job is done (as submitit's
``done()`` does). Cobalt: ``tests/standins/cobalt_qsub``/``cobalt_qstat`` (see tests/test_submit_cobalt.py)
run the ``#COBALT`` script at once and forget finished jobs. Real: the script's own walltime timer, the
checkpoint, and the resubmission after exit 75 that Cobalt needs, followed into the run's chain.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
import submitit_support
from conftest import write_standin_site
from submitit.core.utils import FailedJobError
from submitit_support import Places, Resumable, add, fail, square

from hpctrain.submission.api import RunHandle
from hpctrain.submission.registry import RunRegistry

cloudpickle.register_pickle_by_value(submitit_support)
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = pytest.mark.timeout(300)
STANDINS = Path(__file__).resolve().parent / "standins"


@pytest.mark.slurm
def test_pbs_pro_through_the_torque_wrappers(places: Places, slurm: Any) -> None:
    site = write_standin_site(places.root, "pbs-standin", "pbs")
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site=str(site))
    ex.update_parameters(timeout_min=5)
    job = ex.submit(add, 5, 6)
    assert job.job_id.split(".")[0].isdigit()
    assert job.result() == 11
    assert job.stdout() == "adding 5 and 6\n"
    with RunRegistry() as reg:
        run = reg.get_run(job.run_id)
    script = Path(run.run_dir, "job.sh").read_text()
    assert "#PBS -l walltime=00:05:00" in script and "hpctrain.submitit_plugin.runner" in script
    assert Path(run.run_dir).parent == places.root / "runs"  # the profile's remote_root
    # The wrapper's qstat cannot answer: the state stays unknown, never MISSING, and says why.
    assert "no status command answered" in job.get_info(mode="cache").get("PollError", "")
    error = ex.submit(fail, 4).exception()
    assert isinstance(error, FailedJobError) and "ValueError: bad value 4" in str(error)


@pytest.fixture
def cobalt(places: Places, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = places.root / "bin", places.root / "cobalt-state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "qsub").symlink_to(STANDINS / "cobalt_qsub")
    (bin_dir / "qstat").symlink_to(STANDINS / "cobalt_qstat")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COBALT_STANDIN", str(state))
    return write_standin_site(places.root, "cobalt-standin", "cobalt")


@pytest.mark.processes
def test_cobalt_runs_callables_one_job_each(places: Places, cobalt: Path) -> None:
    """Cobalt has no job arrays: map_array submits one job per item."""
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site=str(cobalt))
    ex.update_parameters(timeout_min=5)
    jobs = ex.map_array(square, [3, 4])
    assert [j.result() for j in jobs] == [9, 16]
    assert len({j.job_id for j in jobs}) == 2 and all(j.job_id.isdigit() for j in jobs)


@pytest.mark.processes
def test_a_checkpointable_on_cobalt_resubmits_itself_and_finishes(places: Places, cobalt: Path) -> None:
    """The script's timer raises the signal 10 s before a 20 s walltime; the runner checkpoints and exits 75;
    the script submits itself again (Cobalt cannot requeue) and the new job continues from the checkpoint."""
    marker = places.root / "marker"
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site=str(cobalt),
                               hpctrain_max_num_timeout=1)
    ex.update_parameters(hpctrain_walltime="00:00:20")
    job = ex.submit(Resumable(str(marker)))
    started = time.monotonic()
    result = job.result()
    assert result["runs"] == 2 and result["resumed_from"] > 0
    assert time.monotonic() - started < 120
    assert RunHandle(job.run_id).wait(timeout=60, poll_s=0.5).state == "completed"
    with RunRegistry() as reg:
        chain = reg.chain(job.run_id)
    assert [s.kind for s in chain] == ["submit", "resubmit"] and chain[0].job_id == job.job_id
    assert int(chain[1].job_id or 0) > int(job.job_id)
