"""N ranks of a gloo worker script under the MPICH wheel's mpiexec, each writing ``OUT/rank-R.json``; the reports,
in rank order. The launching environment's rank and launcher variables are dropped, so the worker's ranks are
MPI's alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
DROPPED = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC",
           "HPCTRAIN_", "MPIR_CVAR_", "LD_PRELOAD", "TORCH_GLOO_")


def run_gloo_ranks(worker: str, k: int, n: int, out: Path, **extra: str) -> list[dict[str, Any]]:
    """Run ``worker K OUT`` as ``n`` ranks with ``extra`` in their environment; each rank's report."""
    env = {key: v for key, v in os.environ.items() if not key.startswith(DROPPED)}
    env.update(OMP_NUM_THREADS="1", **extra)
    done = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, worker, str(k), str(out)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(n)]
    assert [x["rank"] for x in reports] == list(range(n))
    return reports
