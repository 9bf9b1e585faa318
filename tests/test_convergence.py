"""Tests of hpctrain_bench/simulate.py, the bundled models' learning and example jobs, and benchmarks/convergence.py.

The simulation is checked against the trainer itself: one simulated worker against ``runtime.trainer.train`` in
this process (bitwise), and in ``--quick`` against four real ranks under the MPICH wheel's ``mpiexec`` for every
combiner. The quick run checks the machinery (every claim gives its row and PNG), not the numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.config.job import JobSpec
from hpctrain.errors import RuntimeFailure
from hpctrain_bench.simulate import Diverged, Simulation, simulate

REPO = Path(__file__).resolve().parent.parent
CLAIMS = ["ranks", "digits", "adasum", "adacomp", "dasgd", "legw", "ffn"]


def digits_job(combiner: dict, *, steps: int = 4, batch: int = 4, lr: float = 0.05, **train: object) -> JobSpec:
    return JobSpec.model_validate({
        "name": "sim", "model": "resnet", "model_args": {"channels": 4, "blocks": 1},
        "train": {"steps": steps, "batch_per_rank": batch, "lr": lr, "seed": 1, "log_every": 2,
                  "optimizer": {"name": "sgd", "momentum": 0.9}, "combiner": combiner, **train},
        "checkpoint": {"every_steps": 1000}})


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --------------------------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("combiner", [{"name": "mean"}, {"name": "adasum", "adasum_on": "delta"},
                                      {"name": "adacomp"}, {"name": "dasgd", "period": 2, "delay": 1}])
def test_one_simulated_worker_is_the_trainer_on_one_rank(tmp_path: Path, combiner: dict) -> None:
    from hpctrain.runtime.trainer import train

    torch.set_num_threads(1)
    job = digits_job(combiner, steps=5, warmup={"kind": "linear", "steps": 2})
    train(job, tmp_path / "real", backend="none", environ={})
    shared = torch.load(sorted((tmp_path / "real" / "checkpoints").glob("step-*"))[-1] / "shared.pt",
                        weights_only=True)
    result = simulate(job, 1, tmp_path / "sim")
    assert result.steps == 5 and len(result.losses) == 5
    assert max_difference(result.state, shared["model"]) == 0.0


@pytest.mark.parametrize("combiner", [{"name": "mean"}, {"name": "adasum", "adasum_on": "delta"},
                                      {"name": "adasum", "adasum_on": "gradient"},
                                      {"name": "dasgd", "period": 2, "delay": 2}])
def test_batched_gradients_equal_each_worker_s_own_backward(tmp_path: Path, combiner: dict) -> None:
    # 3 workers: Adasum takes its non-power-of-two path; AdaComp is left out because a rounding difference can
    # move an element across its bin threshold (the selection is discontinuous).
    job = digits_job(combiner, steps=4)
    own = simulate(job, 3, tmp_path)
    batched = simulate(job, 3, tmp_path, gradients="batched")
    assert max_difference(own.state, batched.state) < 1e-5
    assert own.losses == pytest.approx(batched.losses, rel=1e-5)


def test_dasgd_averaging_every_step_without_delay_is_synchronous_sgd(tmp_path: Path) -> None:
    # SGD with momentum is linear in the gradients, so averaging the models after every local step equals
    # averaging the gradients before it: the all-reduce of models against the all-reduce of buckets.
    sync = simulate(digits_job({"name": "mean"}, steps=6), 4, tmp_path)
    averaged = simulate(digits_job({"name": "dasgd", "period": 1, "delay": 0}, steps=6), 4, tmp_path)
    delayed = simulate(digits_job({"name": "dasgd", "period": 1, "delay": 1}, steps=6), 4, tmp_path)
    assert max_difference(sync.state, averaged.state) < 1e-5
    assert max_difference(sync.state, delayed.state) > 1e-3  # the delay does change the trajectory


def test_workers_take_their_own_shards_and_the_mean_is_the_large_batch(tmp_path: Path) -> None:
    # 4 workers x 4 images with the mean and no LR scaling take the step one worker takes on their 16 images
    # (ShardedIndexStream deals one permutation round-robin: step s of 4 x 4 = positions [16 s, 16 s + 16)).
    four = simulate(digits_job({"name": "mean"}, steps=3, batch=4), 4, tmp_path)
    one = simulate(digits_job({"name": "mean"}, steps=3, batch=16), 1, tmp_path)
    assert max_difference(four.state, one.state) < 1e-5


def test_a_diverging_run_stops_or_raises_and_leaves_no_thread(tmp_path: Path) -> None:
    import threading

    job = digits_job({"name": "mean"}, steps=30, lr=1000.0)
    stopped = simulate(job, 4, tmp_path, stop_on_divergence=True)
    assert stopped.diverged_at is not None and stopped.steps == stopped.diverged_at < 30
    assert stopped.final == {}
    with pytest.raises(Diverged, match="loss is"):
        simulate(job, 4, tmp_path)
    assert not [t for t in threading.enumerate() if t.name.startswith("simulated-worker")]


def test_workers_that_do_not_meet_are_an_error_not_a_hang(tmp_path: Path) -> None:
    sim = Simulation(digits_job({"name": "mean"}), 3, tmp_path)
    sim.workers[1].combiner.after_backward = lambda: None  # type: ignore[method-assign]  # skips the all-reduce
    with pytest.raises(RuntimeFailure, match="wait for each other forever"):
        sim.run()


def test_adacomp_workers_report_their_ratio_per_layer(tmp_path: Path) -> None:
    sim = Simulation(digits_job({"name": "adacomp"}, steps=3), 2, tmp_path)
    result = sim.run()
    shapes = {n: p.shape for n, p in sim.workers[0].model.named_parameters()}
    for w in sim.workers:
        counted = w.combiner.layer_bytes  # type: ignore[attr-defined]
        assert set(counted) == set(shapes)
        assert all(wire > 0 for _, wire in counted.values())
        # a weight is sent compressed; a 4-element bias may cost more than dense (the scale rides along)
        assert all(counted[n][0] > counted[n][1] for n, shape in shapes.items() if len(shape) > 1)
    assert any(key.startswith("adacomp_ratio_") for key in result.intervals[-1])


# ---------------------------------------------------------------------------------- the bundled models


def test_the_digits_cnn_learns_in_a_few_hundred_steps(tmp_path: Path) -> None:
    # The issue's new user: batch 16, SGD momentum 0.9, lr 0.05; before the fix 400 steps reached ~11-20 %.
    job = digits_job({"name": "mean"}, steps=200, batch=16, lr=0.05)
    job.model_args.update(channels=16, blocks=2)
    assert simulate(job, 1, tmp_path).final["test_accuracy"] >= 0.85


def test_the_lstm_learns_and_its_epoch_is_its_windows(tmp_path: Path) -> None:
    from hpctrain.config.plugins.charlm import SCHEMA
    from hpctrain.models.charlm import CharLMTask
    from hpctrain.models.task import TaskContext

    args = {"seq_len": 32, "embed": 16, "hidden": 64}
    data = {"max_chars": 40_000}
    task = CharLMTask(TaskContext(args, data, 4, 0, 0, 1, tmp_path, torch.device("cpu")))
    assert SCHEMA.dataset_size(*SCHEMA.parse(args, data)) == len(task.train) // 32
    job = JobSpec.model_validate({"name": "lstm", "model": "lstm", "model_args": args, "data": data,
                                  "train": {"steps": 150, "batch_per_rank": 16, "lr": 0.5,
                                            "optimizer": {"name": "sgd", "momentum": 0.9}}})
    assert simulate(job, 1, tmp_path).final["valid_loss"] < 2.6  # from ln(vocabulary) = 4.6 at the start


@pytest.mark.processes
@pytest.mark.parametrize("name", ["resnet-local", "lstm-local"])
def test_each_bundled_model_s_example_job_validates_and_runs(tmp_path: Path, name: str) -> None:
    spec = REPO / "jobs" / f"{name}.yaml"
    checked = subprocess.run([sys.executable, "-m", "hpctrain", "jobs", "validate", str(spec)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    ran = subprocess.run([sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(tmp_path / "run"),
                          "--set", "train.steps=24", "--set", "train.log_every=8", "--backend", "none"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert ran.returncode == 0, ran.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if not r.get("final")] == [8, 16, 24]
    assert records[-1]["final"] and all(isinstance(v, float) for k, v in records[-1].items() if k != "final"
                                        and k not in ("step", "time"))


# ------------------------------------------------------------------------------------ the quick runner


@pytest.mark.mpi
@pytest.mark.slow
def test_quick_run_gives_every_claim_its_row_and_the_simulation_equals_real_ranks(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "convergence.py"), "--quick", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {r["claim"]: r for r in results["rows"]}
    assert len(results["rows"]) == len(CLAIMS)
    ranks = rows["simulation = real ranks"]
    assert ranks["holds"] is True, ranks["measured"]
    assert set(ranks["data"]["max_abs_diff"]) == {"mean", "adasum (delta)", "adasum (gradient)", "adacomp",
                                                  "dasgd (period 2, delay 1)"}
    for row in results["rows"]:
        assert row["measured"] and row["holds"] in (True, False)
        if row is not ranks:
            assert (tmp_path / row["png"]).stat().st_size > 5000, row["claim"]
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {claim} |" in table for claim in rows)


def _convergence_benchmark():  # noqa: ANN202 - the benchmark script as a module
    import importlib.util

    spec = importlib.util.spec_from_file_location("convergence_benchmark", REPO / "benchmarks" / "convergence.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_writes_to_a_temporary_directory_unless_told(tmp_path: Path) -> None:
    """Without --out a run (--quick above all) never lands in docs/convergence, where the committed results are."""
    bench = _convergence_benchmark()
    args = bench.parse_args(["--quick"])
    out = bench.output_dir(args.out, args.quick)
    try:
        assert REPO not in out.resolve().parents and out.is_dir() and not any(out.iterdir())
    finally:
        out.rmdir()
    assert bench.output_dir(tmp_path / "mine", quick=True) == tmp_path / "mine"


def test_a_quick_run_refuses_to_replace_a_full_run_s_results(tmp_path: Path) -> None:
    bench = _convergence_benchmark()
    full = {"quick": False, "runs": [], "rows": []}
    (tmp_path / "results.json").write_text(json.dumps(full))
    with pytest.raises(SystemExit, match="full run's results"):
        bench.main(["--quick", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "results.json").read_text()) == full  # nothing written
    assert bench.output_dir(tmp_path, quick=False) == tmp_path  # a full run refreshes them
