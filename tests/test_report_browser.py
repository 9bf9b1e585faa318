"""The report of a real run in a real browser, and the same run's metrics where users already look.

One real 2-rank run on the ``local`` site (real local controller, real MPI-free ranks, real checkpoints) that
stops at a checkpoint after step 20 as a walltime signal would make it (the test hook ``HPCTRAIN_STOP_AT_STEP``),
is requeued by the controller and finishes at step 40, with TensorBoard and MLflow (file store) switched on in its
job spec. Headless Chromium (Debian's package) opens ``hpctrain report``'s page of it: no console errors, every
section present and non-empty, one curve across the requeue with its mark, measured against predicted efficiency.
TensorBoard's own event reader and MLflow's client read back what rank 0 wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_support import Browser

REPO = Path(__file__).resolve().parent.parent
# Every test reads the run the module fixture trains and requeues: real processes.
pytestmark = [pytest.mark.timeout(900), pytest.mark.processes]
STEPS, STOP_AT, LOG_EVERY = 40, 20, 5
SPEC = f"""name: seen
model: resnet
model_args: {{channels: 8, blocks: 1}}
train: {{steps: {STEPS}, batch_per_rank: 4, lr: 0.05, log_every: {LOG_EVERY}, seed: 7, collective_timeout_s: 60}}
resources: {{nodes: 1, ranks_per_node: 2, walltime: "00:10:00"}}
checkpoint: {{every_steps: 10, keep: 5, max_requeues: 2, stop_check_every: 5}}
env: {{HPCTRAIN_STOP_AT_STEP: '{STOP_AT}'}}
metrics: {{tensorboard: true, mlflow: {{tracking_uri: mlruns}}}}
"""
# Where a copy of the screenshot goes when set (docs/img/report.png is refreshed this way).
SCREENSHOT_ENV = "HPCTRAIN_REPORT_SCREENSHOT"


def cli(env: dict[str, str], cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def requeued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The finished run: its id, run directory and the environment that finds it in its registry."""
    base = tmp_path_factory.mktemp("report-run")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HPCTRAIN_HOME": str(base / "home"),
           "HPCTRAIN_RUNS": str(base / "runs")}
    env.pop("HPCTRAIN_REGISTRY", None)
    (base / "seen.yaml").write_text(SPEC)
    submitted = cli(env, base, "submit", "seen.yaml", "--site", "local")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.split()[0]
    watched = cli(env, base, "status", run_id, "--watch", timeout=800)  # returns once the run has ended
    runs = json.loads(cli(env, base, "runs", "--json").stdout)
    (run,) = [r for r in runs if r["run_id"] == run_id]
    run_dir = Path(run["run_dir"])
    log = (run_dir / "job.out").read_text() if (run_dir / "job.out").exists() else ""
    assert run["state"] == "completed", watched.stdout + log[-3000:]
    assert [(c["kind"], c["state"], c["exit_code"]) for c in run["chain"]] == \
        [("submit", "requeued", 75), ("requeue", "completed", 0)], log[-3000:]
    yield {"run_id": run_id, "run_dir": run_dir, "env": env, "base": base}


def metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if not r.get("final")]


def test_report_of_a_requeued_run_in_a_real_browser(requeued: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = cli(requeued["env"], requeued["base"], "report", requeued["run_id"], "-o", str(out))
    assert done.returncode == 0, done.stderr
    browser = Browser()
    try:
        browser.open(out.as_uri())
        sections = browser.evaluate("""JSON.stringify(Array.from(document.querySelectorAll('section')).map(s => ({
            id: s.id, text: s.innerText.replace(s.querySelector('h2').innerText, '').trim().length,
            svgs: s.querySelectorAll('svg').length,
            height: s.getBoundingClientRect().height})))""")
        loss_text = browser.evaluate("document.getElementById('loss').innerText")
        plan_text = browser.evaluate("document.getElementById('plan').innerText")
        errors = browser.console_errors
        shot = browser.screenshot(tmp_path / "report.png")
    finally:
        browser.close()
    assert errors == []
    found = {s["id"]: s for s in json.loads(sections)}
    assert list(found) == ["summary", "loss", "throughput", "step-time", "ranks", "plan", "checkpoints", "failure",
                           "nodes", "evaluation", "segmentation"]
    for name, s in found.items():
        assert s["text"] > 0 and s["height"] > 0, (name, s)
    for name in ("loss", "throughput", "step-time", "ranks", "plan"):
        assert found[name]["svgs"] >= 1, (name, found[name])
    assert f"requeue 1 after a checkpoint: resumed after step {STOP_AT}" in loss_text
    assert "measured efficiency" in plan_text and "predicted" in plan_text
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(shot, os.environ[SCREENSHOT_ENV])


def test_the_report_data_is_one_curve_across_the_requeue(requeued: dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("HPCTRAIN_HOME", "HPCTRAIN_RUNS"):
        monkeypatch.setenv(key, requeued["env"][key])
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    from hpctrain.report.build import report_data
    from hpctrain.report.source import open_source

    data = report_data(open_source(requeued["run_id"]))
    started = [json.loads(line) for line in (requeued["run_dir"] / "attempts.jsonl").read_text().splitlines()]
    assert [a["step"] for a in started] == [0, STOP_AT]  # rank 0 noted each attempt's start
    steps = list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert [r["step"] for r in data.records] == steps  # both attempts, in order, nothing repeated or lost
    assert [r["attempt"] for r in data.records] == [0 if s <= STOP_AT else 1 for s in steps]
    assert [(m.step, m.label) for m in data.marks] == [(STOP_AT, "requeue 1")]
    assert data.efficiency is not None and data.efficiency.measured is not None, data.efficiency_note
    assert 0 < data.efficiency.predicted <= 1.0 and data.efficiency.ranks == 2
    assert [c.step for c in data.checkpoints] == [10, 20, 30, 40] and all(c.written for c in data.checkpoints)
    assert data.final is not None and "test_accuracy" in data.final
    assert data.ranks is not None and [r.split(" (")[0] for r in data.ranks.rows] == ["rank 0", "rank 1"]
    assert all(r.endswith(")") for r in data.ranks.rows)  # each named with its host (ranks/node-*.txt)
    assert list(data.ranks.steps) == steps  # every interval of both attempts timed at least one step per rank
    assert all(v is not None and v > 0 for row in data.ranks.values for v in row)


def test_tensorboard_reads_the_event_files_of_both_attempts(requeued: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    run_dir = requeued["run_dir"]
    events = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) >= 2  # one file per attempt (TensorBoard joins them by step)
    mux = EventMultiplexer().AddRunsFromDirectory(str(run_dir / "tensorboard")).Reload()
    scalars = {}
    for run in mux.Runs():
        for tag in mux.GetAccumulator(run).Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(mux.Scalars(run, tag))
    expected = metrics_of(run_dir)
    loss = sorted(scalars["loss"], key=lambda e: e.step)
    assert [e.step for e in loss] == [r["step"] for r in expected]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in expected], rel=1e-6)
    assert [e.step for e in sorted(scalars["lr"], key=lambda e: e.step)] == [r["step"] for r in expected]
    assert {"per_rank_rate", "final/test_accuracy"} <= set(scalars)


def test_mlflow_holds_one_run_across_the_requeue(requeued: dict[str, Any]) -> None:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    run_dir = requeued["run_dir"]
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    run_id = (run_dir / "mlflow-run-id").read_text().strip()
    history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    expected = metrics_of(run_dir)
    assert [m.step for m in history] == [r["step"] for r in expected]
    assert [m.value for m in history] == pytest.approx([r["loss"] for r in expected])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "seen"
