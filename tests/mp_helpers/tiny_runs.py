"""A real short training run of a tiny job (1 rank, or N MPI ranks on this node) for tests that read what a run
measured (profile.json, counters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = """name: tiny
model: resnet
train: {steps: 12, batch_per_rank: 2, lr: 0.01, log_every: 4, combiner: {name: mean, bucket_mb: 0.02}}
resources: {nodes: 1, ranks_per_node: 1, walltime: "00:05:00"}
checkpoint: {every_steps: 12}
"""


def train_tiny(tmp_path: Path, ranks: int) -> Path:
    """Write tmp_path/tiny.yaml and run it to the end on ``ranks`` ranks; the run directory."""
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY)
    run_dir = tmp_path / f"run{ranks}"
    cmd = [sys.executable, "-m", "hpctrain", "run", str(job), "--run-dir", str(run_dir)]
    if ranks > 1:
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks), *cmd, "--backend", "mpi"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir
