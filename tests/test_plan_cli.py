"""``hpctrain plan`` on the command line: the JSON shape, the plot, and one readable line with exit 2 for a run
without measurements, an unknown site or run, a node count over the machine's size, and a bad --set.

Profiles here are written by hand in the runtime's format (a real one is tested in test_plan_profile.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.submission.registry import RunRegistry

REPO = Path(__file__).resolve().parent.parent
THETA_SETS = ["--set", "compute_s=1.43", "--set", "compute_std_s=0.03", "--set", "grad_bytes=2.5e6"]


def write_profile(run_dir: Path, **changes: object) -> Path:
    profile = {
        "version": 1, "ranks": 1, "ranks_per_node": 1, "threads_per_rank": 1, "backend": "none",
        "combiner": "mean", "samples_per_step": 4, "sample_unit": "FOVs", "grad_bytes": 197_000,
        "compute_s": {"mean": 0.050, "std": 0.004, "count": 40},
        "input_s": {"mean": 0.006, "std": 0.001, "count": 40},
        "reduction_wait_s": {"mean": 0.0001, "std": 0.0, "count": 40},
        "step_s": {"mean": 0.057, "std": 0.004, "count": 40},
        "overlap_window_s": 0.02,
        "buckets": [{"bytes": 197_000, "lead_s": 0.0}],
        "wire_ratio": None, "startup_s": 4.5, "loadavg": [1.0, 1.0, 1.0],
        **changes,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "profile.json").write_text(json.dumps(profile))
    return run_dir


def plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", "plan", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **(env or {})}, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.processes
def test_json_shape(tmp_path: Path) -> None:
    run = write_profile(tmp_path / "run")
    out = plan("jobs/ffn-local.yaml", "--site", "local", "--from", str(run), "--set", "ranks_per_node=2",
               "--steps", "1000", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["version"] == 1 and data["job"] == "ffn-local" and data["site"] == "local"
    assert data["sample_unit"] == "FOVs" and data["target"] == {"steps": 1000.0}
    compute = data["parameters"]["compute_s"]
    assert compute == {"value": 0.05, "unit": "s", "source": "measured",
                       "detail": f"{run}/profile.json: compute_s mean of 40 steps"}
    site_detail = "hpctrain/site_configs/local.yaml: network.intra_latency_us"  # the file behind site_configs/
    assert data["parameters"]["intra_latency_us"]["detail"] == site_detail
    assert data["parameters"]["ranks_per_node"]["source"] == "set"
    assert data["parameters"]["intra_latency_us"]["source"] == "site"
    assert data["buckets"] == [{"bytes": 197000.0, "lead_s": 0.0}]
    (pred,) = data["predictions"]  # the local site has one node
    assert pred["nodes"] == 1 and pred["ranks"] == 2
    for key in ("step_s", "efficiency", "steady_efficiency", "samples_per_s", "startup_s", "time_to_target_s"):
        assert isinstance(pred[key], float), key
    assert set(pred["terms_s"]) == {"compute", "oversubscription", "reduction", "straggler", "overhead", "input",
                                    "checkpoint", "startup"}
    assert pred["dominant_loss"] in (*pred["losses"], "none")
    assert pred["reduction"]["algorithm"] == "reduce-scatter + allgather"  # the local site's gloo: hpctrain's p2p
    assert pred["reduction"]["hidden_fraction"] == 0.0  # one bucket: reduced after backward
    assert set(pred["advice"]) == {"lr_scaling", "batch_per_rank"} and isinstance(pred["warnings"], list)
    assert 0 < pred["efficiency"] < 1
    assert pred["time_to_target_s"] == pytest.approx(1000 * pred["step_s"] + pred["startup_s"])


@pytest.mark.processes
def test_text_output_names_assumptions_and_advice(tmp_path: Path) -> None:
    out = plan("jobs/ffn-theta.yaml", "--site", "theta", "--nodes", "1,16,2048", *THETA_SETS)
    assert out.returncode == 0, out.stderr
    assert "parameters (assumptions first" in out.stdout
    assert "multinode_overhead_s" in out.stdout and "not measurable on one node" in out.stdout
    assert "2048 nodes (2048 ranks):" in out.stdout and "sqrt beyond 16 ranks" in out.stdout


@pytest.mark.processes
def test_plot_is_written(tmp_path: Path) -> None:
    png = tmp_path / "eff.png"
    out = plan("jobs/ffn-theta.yaml", "--site", "theta", *THETA_SETS, "--plot", str(png), "--json")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert [p["nodes"] for p in json.loads(out.stdout)["predictions"]] == [2**i for i in range(13)]


@pytest.mark.processes
def test_run_directory_without_profile(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    one_line_error(plan("jobs/ffn-local.yaml", "--from", str(tmp_path / "run")), 2, "has no step profile",
                   "--calibrate")


@pytest.mark.processes
def test_registered_run_without_profile_and_unknown_run(tmp_path: Path) -> None:
    env = {"HPCTRAIN_REGISTRY": str(tmp_path / "registry.db")}
    with RunRegistry(tmp_path / "registry.db") as reg:
        run = reg.create_run("ffn-local", "local", "0" * 16, str(tmp_path / "rundir"))
    one_line_error(plan("jobs/ffn-local.yaml", "--from", run.run_id, env=env), 2, f"run {run.run_id}",
                   "has no step profile")
    one_line_error(plan("jobs/ffn-local.yaml", "--from", "nosuchrun", env=env), 2, "--from nosuchrun")


@pytest.mark.processes
def test_damaged_profile(tmp_path: Path) -> None:
    run = write_profile(tmp_path / "run", compute_s={"mean": "x", "std": 0, "count": 3})
    one_line_error(plan("jobs/ffn-local.yaml", "--from", str(run)), 2, "compute_s: mean is 'x'")
    (run / "profile.json").write_text('{"version": 1, "compute_s": ')
    one_line_error(plan("jobs/ffn-local.yaml", "--from", str(run)), 2, "not JSON")


@pytest.mark.processes
def test_unknown_site() -> None:
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "thetaa", *THETA_SETS), 2, "no site profile named",
                   "did you mean 'theta'")


@pytest.mark.processes
def test_node_count_over_the_machine() -> None:
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "theta", "--nodes", "1,8192", *THETA_SETS), 2,
                   "--nodes 8192", "theta", "4392 nodes")


@pytest.mark.processes
def test_no_measurement_and_bad_sets() -> None:
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "theta"), 2, "no measurement of compute_s",
                   "--from RUN")
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "theta", *THETA_SETS, "--set", "latncy_us=3"), 2,
                   "latncy_us", "did you mean latency_us")
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "theta", *THETA_SETS, "--set", "latency_us=-1"), 2,
                   "latency_us")
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "theta", *THETA_SETS, "--nodes", "1,x"), 2, "--nodes")
    one_line_error(plan("jobs/ffn-theta.yaml", "--site", "theta", *THETA_SETS, "--set", "train.steps=0"), 2,
                   "train.steps")


@pytest.mark.processes
def test_job_keys_in_set_reach_the_job(tmp_path: Path) -> None:
    out = plan("jobs/ffn-theta.yaml", "--site", "theta", "--nodes", "4", *THETA_SETS,
               "--set", "train.batch_per_rank=3", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["parameters"]["batch_per_rank"]["value"] == 3.0


@pytest.mark.processes
def test_plan_imports_no_heavy_modules(tmp_path: Path) -> None:
    run = write_profile(tmp_path / "run")
    code = ("import sys; from hpctrain.cli import main; "
            f"rc = main(['plan', 'jobs/ffn-local.yaml', '--from', {str(run)!r}, '--json']); "
            "print([m for m in ('torch', 'numpy', 'mpi4py', 'matplotlib') if m in sys.modules], file=sys.stderr); "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]"
