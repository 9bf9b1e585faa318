"""PBS submission through a STAND-IN: Debian's ``slurm-wlm-torque`` ``qsub``/``qstat`` wrappers, which submit
``#PBS`` scripts to the real single-node Slurm. No PBS Pro server exists here (see /work/shared/ENVIRONMENT.md).

What this proves: the PBS back-end's ``qsub`` argv and job-id parsing, the staged run directory and the
``#PBS -o`` log path work end to end. What it cannot: the wrapper's ``qstat`` has no ``-x -F json``, so
status polling must report that no status command answered and must not mark the job MISSING; and the
wrapper passes its own ``-o job.sh.o<id>`` to sbatch, overriding ``#PBS -o`` (``read_log`` falls back to it).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TinyJob, write_standin_site

from hpctrain.submission.api import read_log, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import TransportPool

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(isolated_home: Path, tiny_job: TinyJob) -> Path:
    tiny_job("tiny-pbs")
    write_standin_site(isolated_home, "pbs-standin", "pbs")
    return isolated_home


def test_qsub_wrapper_submits_a_pbs_script(env: Path, slurm: Any) -> None:
    assert shutil.which("qsub") and "slurm" in Path(shutil.which("qsub") or "").read_text(errors="replace").lower()
    with RunRegistry() as reg:
        done = submit_runs(env / "tiny.yaml", str(env / "pbs-standin.yaml"),
                           command=["sh", "-c", "echo pbs hello from $PWD"], registry=reg)
        (run,) = done.runs
        (job_id,) = done.job_ids
        assert job_id and job_id.split(".")[0].isdigit()
        script = Path(run.run_dir, "job.sh").read_text()
        assert f"#PBS -o {run.run_dir}/pbs.out" in script and "#PBS -l walltime=00:05:00" in script
        # The wrapper handed the job to Slurm under the same id.
        slurm.wait_for_state(job_id.split(".")[0], ["COMPLETED"], timeout=60)
        deadline = time.monotonic() + 10
        while "pbs hello" not in read_log(reg, run) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert f"pbs hello from {run.run_dir}" in read_log(reg, run)
        (view,) = poll_runs(reg, [run], TransportPool())
        assert view.state == "pending"  # unknown, so unchanged: never MISSING on a failed poll
        assert "no status command answered" in view.poll_error and "qstat" in view.poll_error
