"""``hpctrain resume`` refusals, and the local controller's requeue: on ``--site local`` a job stopped at a
checkpoint by the controller's walltime signal (exit 75) is run again until it finishes, bit-exact.

The local controller sends the warning ``signal_lead_s`` before its walltime: 30 s after each run starts here.
What happens when is decided by the step the run reached, not by how fast this machine trains: the ranks hold
after step 100 until the signal comes (the test hook ``HPCTRAIN_HOLD_AT_STEP``), and vote on a stop only every 50
steps, so a run resumed from step 100 always finishes its last 50 steps. A run still starting up when its
signal comes (a loaded machine) stops at step 50 instead, and the next run holds at 100.
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

import pytest

from hpctrain.checkpoint.session import HOLD_AT_STEP_ENV
from hpctrain.errors import HpctrainError
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.resume import resume_run

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("isolated_home")]
SPEC = """name: {name}
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: {steps}, batch_per_rank: 8, lr: 0.05, log_every: 50, seed: 7, collective_timeout_s: 30}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:05:00"}}
checkpoint: {{every_steps: 100000, keep: 2, max_requeues: 4, signal_lead_s: 90, stop_check_every: 50}}
{extra}"""
HELD, STEPS = 100, 150


def final_shared(run_dir: Path) -> dict[str, Any]:
    import torch

    manifest = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())
    newest = max(manifest["checkpoints"], key=lambda c: c["step"])
    return torch.load(run_dir / "checkpoints" / newest["dir"] / "shared.pt", weights_only=False)


@pytest.mark.processes
def test_local_controller_requeues_after_walltime_signal_bit_exact(tmp_path: Path) -> None:
    spec = tmp_path / "lq.yaml"
    spec.write_text(SPEC.format(name="lq", steps=STEPS, extra=f"env: {{{HOLD_AT_STEP_ENV}: '{HELD}'}}"))
    (tmp_path / "ref.yaml").write_text(SPEC.format(name="ref", steps=STEPS, extra=""))
    with RunRegistry() as reg:
        run = submit_runs(spec, "local", walltime="00:02:00", registry=reg).runs[0]
        ref = submit_runs(tmp_path / "ref.yaml", "local", registry=reg).runs[0]  # uninterrupted: no hold, no signal
    view = RunHandle(run.run_id).wait(timeout=360, poll_s=1, max_poll_s=3)
    out = Path(run.run_dir, "job.out").read_text()
    assert view.state == "completed", out[-3000:]
    assert RunHandle(ref.run_id).wait(timeout=120, poll_s=1).state == "completed"
    assert "SIGUSR2 received, forwarding it to the launcher" in out
    assert "running it again (restart 1 of 4)" in out
    stops = [int(s) for s in re.findall(r"rank 0: stopped at step (\d+) after a checkpoint", out)]
    restarts = out.count("running it again")
    assert stops and stops[-1] == HELD and set(stops) <= {50, HELD} and len(stops) == restarts, out[-3000:]
    assert f"(step {HELD})" in out and f"training finished at step {STEPS}" in out
    with RunRegistry() as reg:
        chain = reg.chain(run.run_id)
        assert [s.kind for s in chain] == ["submit"] + ["requeue"] * restarts
        assert chain[-1].state == "completed" and chain[-1].restart_count == restarts
    import torch

    a, b = final_shared(Path(run.run_dir)), final_shared(Path(ref.run_dir))
    assert a["step"] == b["step"] == STEPS
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    with RunRegistry() as reg, pytest.raises(HpctrainError, match=f"already completed all {STEPS} steps"):
        resume_run(reg, run.run_id)


@pytest.mark.processes
def test_resume_refuses_an_active_run_and_one_without_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(SPEC.format(name="t", steps=10, extra=""))
    with RunRegistry() as reg:
        busy = submit_runs(tmp_path / "t.yaml", "local", command=["sleep", "60"], registry=reg).runs[0]
        empty = submit_runs(tmp_path / "t.yaml", "local", command=["true"], registry=reg).runs[0]
    environ = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    deadline = time.monotonic() + 30
    while RunHandle(empty.run_id).status().state != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    out = subprocess.run([sys.executable, "-m", "hpctrain", "resume", busy.run_id], env=environ,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "is still RUNNING" in out.stderr and "hpctrain cancel" in out.stderr
    out = subprocess.run([sys.executable, "-m", "hpctrain", "resume", empty.run_id], env=environ,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "has no checkpoint in" in out.stderr and "checkpoints" in out.stderr
    with RunRegistry() as reg:
        with pytest.raises(HpctrainError, match="same or fewer"):
            resume_run(reg, empty.run_id, nodes=4)
        assert [s.kind for s in reg.chain(empty.run_id)] == ["submit"]  # refusals submit nothing
    RunHandle(busy.run_id).cancel()
