"""A requeued Slurm job starts its ranks although its first run was killed after ``MPI_Init`` (real Slurm, MPICH wheel).

MPICH names a job's shared-memory segment after the PMI job id, which Slurm makes ``JOBID.STEPID``: the requeued
job's first step has the same name as the killed run's, whose segment nobody removed. Without hpctrain removing
it first (``runtime/mpi_env.remove_stale_segments``), both ranks of the second run spin in ``MPI_Init`` until
the watcher ends them ("MPI_Init did not complete"), which is how a 2-rank job under ``srun --mpi=pmi2`` once
waited 300 s.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from hpctrain.runtime.comm.mpi_env import mpich_world_id

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.timeout(400)]

WORKER = """\
import os, signal
from hpctrain.runtime.comm.mpi_env import import_mpi
MPI = import_mpi(timeout_s=60)
MPI.COMM_WORLD.Barrier()
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
print(f"restart {restart} rank {MPI.COMM_WORLD.Get_rank()} passed MPI_Init", flush=True)
if restart == 0:
    os.kill(os.getpid(), signal.SIGKILL)  # as a walltime kill or srun --kill-on-bad-exit ends a rank: no MPI_Finalize
"""
SCRIPT = """\
#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
srun --mpi=pmi2 -n 2 --kill-on-bad-exit=1 {python} {worker}
if [ "${{SLURM_RESTART_COUNT:-0}}" -eq 0 ]; then scontrol requeue "$SLURM_JOB_ID"; fi
"""


def test_a_requeued_step_starts_although_its_killed_run_left_its_segment(tmp_path: Path, slurm: Any,
                                                                        venv_bin: Path) -> None:
    worker, script, out = tmp_path / "worker.py", tmp_path / "job.sh", tmp_path / "job.out"
    worker.write_text(WORKER)
    script.write_text(SCRIPT.format(python=shlex.quote(str(venv_bin / "python")), worker=shlex.quote(str(worker))))
    job = slurm.sbatch("-n", "2", "-o", str(out), str(script), cwd=tmp_path)
    slurm.wait_for_state(job, ["COMPLETED"], timeout=300)
    log = out.read_text()
    world = mpich_world_id({"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "PMI_FD": "-"})
    assert world is not None
    segment = f"/dev/shm/mpich_shm_{world:x}_0"
    for rank in (0, 1):
        assert f"restart 0 rank {rank} passed MPI_Init" in log, log[-3000:]
        assert f"restart 1 rank {rank} passed MPI_Init" in log, log[-3000:]
    assert "MPI_Init did not complete" not in log
    assert f"removed {segment}, a shared-memory segment an earlier run of this Slurm job step left behind" in log
    assert not Path(segment).exists()  # the second run ended well: MPICH removed its own segment
