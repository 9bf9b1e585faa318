"""The runtime's step profile (hpctrain/runtime/profile.py) from real training runs, and the planner reading it:
a 1-rank run (what --calibrate measures) and a 2-rank MPI run with small buckets (bucket timing, reduction wait).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.planning.measurements import parse_profile
from hpctrain.runtime.profile import SKIP_STEPS, RunningStat, StepProfiler
from tests.mp_helpers.tiny_runs import train_tiny

REPO = Path(__file__).resolve().parent.parent
def test_running_stat_matches_statistics() -> None:
    values = [0.3, 0.1, 0.4, 0.15, 0.9, 0.26]
    s = RunningStat()
    for v in values:
        s.add(v)
    assert s.count == 6 and s.mean == pytest.approx(statistics.mean(values))
    assert s.std == pytest.approx(statistics.stdev(values))


@pytest.mark.processes
def test_one_rank_run_writes_a_profile_the_planner_reads(tmp_path: Path) -> None:
    run_dir = train_tiny(tmp_path, 1)
    raw = json.loads((run_dir / "profile.json").read_text())
    m = parse_profile((run_dir / "profile.json").read_text(), "test")
    assert m.compute.count == 12 - SKIP_STEPS and m.ranks == 1 and m.backend == "none"
    assert m.compute.mean > 0 and m.compute.std > 0 and m.step.mean >= m.compute.mean
    assert m.step.mean == pytest.approx(m.compute.mean + m.input.mean + m.reduction_wait.mean, rel=1e-6)
    assert len(m.buckets) > 1 and m.grad_bytes == raw["grad_bytes"]  # 0.02 MB buckets: several
    assert m.buckets[-1].lead_s == 0.0  # the last bucket is reduced after backward
    assert any(b.lead_s > 0 for b in m.buckets[:-1]) and m.overlap_window_s > 0
    assert m.startup_s is not None and m.startup_s > 0
    assert 0 < (m.cpu_share or 0) <= 1
    out = subprocess.run([sys.executable, "-m", "hpctrain", "plan", str(tmp_path / "tiny.yaml"), "--from",
                          str(run_dir), "--set", "ranks_per_node=2", "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    # begin-to-begin loop time covers the step, the stop vote and the work between steps; the planner adds
    # that work (not the vote, which it models) to the compute
    assert m.loop is not None and m.control is not None and m.loop.count == m.compute.count - 1
    assert m.loop.mean > 0 and m.control.count == m.compute.count
    assert m.between_steps_s == pytest.approx(max(0.0, m.loop.mean - m.step.mean - m.control.mean))
    assert plan["parameters"]["compute_s"]["value"] == pytest.approx(m.compute.mean + m.between_steps_s)
    assert [b["bytes"] for b in plan["buckets"]] == [b.nbytes for b in m.buckets]


@pytest.mark.processes
def test_two_rank_mpi_run_records_the_reduction(tmp_path: Path) -> None:
    m = parse_profile((train_tiny(tmp_path, 2) / "profile.json").read_text(), "test")
    assert m.ranks == 2 and m.ranks_per_node == 2 and m.backend == "mpi"
    assert m.reduction_wait.count == 12 - SKIP_STEPS and m.reduction_wait.mean > 0


def test_only_rank_zero_writes_and_writes_atomically(tmp_path: Path) -> None:
    class Model:
        def parameters(self) -> list:
            return []

    def profiler(path: Path | None) -> StepProfiler:
        return StepProfiler(path, model=Model(), reducer=None, combiner_state=None, ranks=2, ranks_per_node=2,
                            threads_per_rank=1, backend="gloo", combiner="mean", samples_per_step=1,
                            sample_unit="samples")

    path = tmp_path / "profile.json"
    quiet, loud = profiler(None), profiler(path)
    for p in (quiet, loud):
        for _ in range(SKIP_STEPS + 2):
            p.begin()
            for label in ("input", "backward", "reduced"):
                p.mark(label)
            p.end()
        p.write()
    assert [f.name for f in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left behind
    data = json.loads(path.read_text())
    assert data["compute_s"]["count"] == 2 and data["buckets"] == [] and math.isfinite(data["step_s"]["mean"])


@pytest.mark.processes
def test_node_load_counts_other_work_during_the_timed_steps_only() -> None:
    """A process spinning on a core while this one sleeps is other work (/proc/stat); what ran before the first
    mark is not counted, unlike the load average."""
    from hpctrain.runtime.profile import NodeLoad

    spin = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    before = subprocess.Popen([sys.executable, "-c", spin])
    before.wait()  # a minute's load average still carries this; the interval below does not
    load = NodeLoad(ranks_per_node=1)
    load.mark()
    child = subprocess.Popen([sys.executable, "-c", spin])
    child.wait()
    load.mark()
    figures = load.as_dict()
    assert figures is not None
    # the child kept about one CPU busy; whatever else ran on the machine only adds to it
    assert figures["background_cpus"] >= 0.5 and figures["own_cpus"] < 0.2


def test_the_planner_prefers_the_measured_background_to_the_load_average() -> None:
    from hpctrain.planning.inputs import _background

    profile = {"version": 1, "ranks": 1, "ranks_per_node": 1, "threads_per_rank": 1, "backend": "none",
               "combiner": "mean", "samples_per_step": 4, "sample_unit": "FOVs", "grad_bytes": 1000,
               **{k: {"mean": 0.02, "std": 0.001, "count": 50} for k in ("compute_s", "step_s", "cpu_s")},
               **{k: {"mean": 0.0, "std": 0.0, "count": 50} for k in ("input_s", "reduction_wait_s")},
               "overlap_window_s": 0.0, "buckets": [], "loadavg": [3.0, 2.0, 1.0]}
    m = parse_profile(json.dumps({**profile, "node_cpus": {"busy_cpus": 1.3, "own_cpus": 1.0,
                                                             "background_cpus": 0.3}}), "p")
    param = _background(m, 8.0)
    assert param is not None and param.value == pytest.approx(0.3) and "node_cpus" in param.detail
    old = parse_profile(json.dumps(profile), "p")  # a profile of an older hpctrain: the load average, less itself
    assert _background(old, 8.0).value == pytest.approx(2.0)
    with pytest.raises(Exception, match="node_cpus"):
        parse_profile(json.dumps({**profile, "node_cpus": {"background_cpus": "x"}}), "p")


def test_the_background_is_measured_on_the_runs_node_and_predicted_on_the_targets() -> None:
    """``plan --from RUN`` of a run measured on a 2-thread machine, for a site of 128-thread nodes: the other work is
    counted on the measuring node's threads (a rank on a CPU half of each step shared 2 threads with 3 others), and
    the text names both figures: the measuring node's for the measurement, the target's for the prediction."""
    from hpctrain.config.job import load_job
    from hpctrain.config.site import load_site
    from hpctrain.planning.inputs import plan_inputs

    job, site = load_job(REPO / "jobs/ffn-local.yaml"), load_site("perlmutter")
    profile = {"version": 1, "ranks": 1, "ranks_per_node": 1, "threads_per_rank": 1, "backend": "none",
               "combiner": "mean", "samples_per_step": 4, "sample_unit": "FOVs", "grad_bytes": 1000,
               **{k: {"mean": 0.05, "std": 0.001, "count": 50} for k in ("compute_s", "step_s")},
               **{k: {"mean": 0.0, "std": 0.0, "count": 50} for k in ("input_s", "reduction_wait_s")},
               "overlap_window_s": 0.0, "buckets": [], "loadavg": [3.0, 2.0, 1.0], "node_threads": 2}
    shapes = {  # (profile figures, background on the 2-thread node: at most its 2 threads less the run's 1)
        "starved": ({"cpu_s": {"mean": 0.025, "std": 0.001, "count": 50}}, 3.0),
        "node_cpus": ({"node_cpus": {"busy_cpus": 2.0, "own_cpus": 1.0, "background_cpus": 1.5}}, 1.0),
        "load average": ({}, 1.0),
    }
    for name, (figures, expected) in shapes.items():
        measured = parse_profile(json.dumps({**profile, **figures}), "run-x/profile.json")
        params = plan_inputs(job, "jobs/ffn-local.yaml", site, measured).workload.params
        assert params.num("node_threads") == 128
        background = params["background_load"]
        assert background.value == pytest.approx(expected), (name, background.detail)
        assert "its node's 2 hardware threads" in background.detail, background.detail
        assert "the target's nodes of 128 hardware threads" in background.detail, background.detail
    with pytest.raises(Exception, match="node_threads"):
        parse_profile(json.dumps({**profile, "node_threads": 0}), "p")


def test_a_profile_records_the_threads_of_the_node_it_measured_on(tmp_path: Path) -> None:
    import os

    class Model:
        def parameters(self) -> list:
            return []

    profiler = StepProfiler(tmp_path / "profile.json", model=Model(), reducer=None, combiner_state=None, ranks=1,
                            ranks_per_node=1, threads_per_rank=1, backend="none", combiner="mean",
                            samples_per_step=1, sample_unit="samples")
    for _ in range(SKIP_STEPS + 2):
        profiler.begin()
        for label in ("input", "backward", "reduced"):
            profiler.mark(label)
        profiler.end()
    profiler.write()
    written = json.loads((tmp_path / "profile.json").read_text())
    assert written["node_threads"] == os.cpu_count()
    assert parse_profile(json.dumps(written), "p").node_threads == os.cpu_count()
