"""``hpctrain plan --from RUN --compare``: the prediction at a real run's scale next to what the run measured.

Two real short runs of a tiny job (1 rank, and 2 MPI ranks on this node): the plan from the 1-rank run compared
with itself and with the 2-rank run; every measured number printed is the run's own profile.json figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mp_helpers.tiny_runs import train_tiny

REPO = Path(__file__).resolve().parent.parent


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", "plan", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


# Every test reads the runs the module fixture trains: real processes.
pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("compare")
    return tmp / "tiny.yaml", train_tiny(tmp, 1), train_tiny(tmp, 2)


def test_compare_prints_the_runs_own_measurements(runs: tuple[Path, Path, Path]) -> None:
    job, one, two = runs
    out = plan(str(job), "--site", "local", "--from", str(one), "--compare", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    profile = json.loads((one / "profile.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert data["nodes"] == 1 and data["ranks"] == 1
    assert rows["step (wall time per step)"]["measured_s"] == pytest.approx(profile["loop_s"]["mean"])
    between = max(0.0, profile["loop_s"]["mean"] - profile["step_s"]["mean"] - profile["control_s"]["mean"])
    assert rows["compute + work between steps"]["measured_s"] == pytest.approx(profile["compute_s"]["mean"] + between)
    assert rows["start-up"]["measured_s"] == pytest.approx(profile["startup_s"])
    # one rank: the plan starts from this run's compute, so the predicted compute is the measured one
    assert rows["compute + work between steps"]["ratio"] == pytest.approx(1.0, rel=1e-6)
    assert all(r["predicted_s"] >= 0 for r in data["rows"])


def test_compare_with_another_run_predicts_at_its_scale(runs: tuple[Path, Path, Path]) -> None:
    job, one, two = runs
    out = plan(str(job), "--site", "local", "--from", str(one), "--compare", str(two), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    profile = json.loads((two / "profile.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert data["ranks"] == 2 and data["run"].startswith(str(two))
    waited = profile["reduction_wait_s"]["mean"] + profile["control_s"]["mean"]
    assert rows["reduction wait + stop vote"]["measured_s"] == pytest.approx(waited)
    assert rows["reduction wait + stop vote"]["predicted_s"] > 0  # two ranks: a reduction to wait for
    text = plan(str(job), "--site", "local", "--from", str(one), "--compare", str(two))
    assert text.returncode == 0 and "measured / predicted" in text.stdout and "Sending a site's numbers" in text.stdout


def test_compare_needs_a_run(runs: tuple[Path, Path, Path]) -> None:
    job = runs[0]
    out = plan(str(job), "--site", "local", "--set", "compute_s=1", "--set", "compute_std_s=0", "--set",
               "grad_bytes=1e6", "--compare")
    assert out.returncode == 2 and "--compare needs --from RUN" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
