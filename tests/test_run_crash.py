"""A rank that dies in native code says where: ``hpctrain run`` enables faulthandler before anything else, so a
segmentation fault prints the Python stack of every thread before the process ends with signal 11."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.processes
def test_a_segfault_in_a_model_prints_the_python_stack(tmp_path: Path) -> None:
    (tmp_path / "crashing_model.py").write_text(textwrap.dedent("""\
        import ctypes

        def build(**_):
            return crash_here()

        def crash_here():
            return ctypes.string_at(0)  # reads address 0: SIGSEGV in native code
        """))
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: crash\nmodel: crashing_model:build\n"
                    "train: {steps: 2, batch_per_rank: 1, lr: 0.1}\n"
                    "resources: {nodes: 1, ranks_per_node: 1, walltime: '00:05:00'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "SLURM_", "OMPI_", "MPI_LOCAL"))}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", OMP_NUM_THREADS="1")
    env.pop("PYTHONFAULTHANDLER", None)
    out = subprocess.run([sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(tmp_path / "run"),
                          "--backend", "none"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == -signal.SIGSEGV, (out.returncode, out.stderr[-3000:])
    assert "Fatal Python error: Segmentation fault" in out.stderr
    assert "crash_here" in out.stderr and "crashing_model.py" in out.stderr  # the frame that crashed, by name
