"""The combiners' and LR rules' papers reproduced in miniature on K simulated workers (docs/convergence.md).

Run: ``python benchmarks/convergence.py [--quick] [--out DIR] [--only NAME ...]``. Every claim runs >= 3 seeds
(2 with ``--quick``) on ``hpctrain_bench.simulate`` (the runtime's own combiners, optimizers and LR schedule),
and ends in a row of the table (claim / setting / measured / holds?) and a PNG in DIR (default: a new temporary
directory, printed; the committed results are refreshed with ``--out docs/convergence``), beside results.json
(every number) and table.md. First, ``mpiexec -n 4`` runs ``hpctrain run``
on a small job once per combiner and the simulation of the same job must end with the same parameters.
``--quick`` checks that machinery in a few minutes; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from hpctrain.config.job import JobSpec  # noqa: E402
from hpctrain.runtime.combiners import AdaCompCombiner  # noqa: E402
from hpctrain_bench.simulate import Simulation, SimulationResult  # noqa: E402

VENV_BIN = Path(sys.executable).parent
TOLERANCE = 1e-5  # |simulated - real| per parameter: sums taken in another order (MPI's) differ by rounding


@dataclass
class Row:
    claim: str
    setting: str
    measured: str
    holds: bool | None
    png: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sizes:
    """How big each experiment is: the full run, or ``--quick`` (machinery only)."""

    quick: bool

    @property
    def seeds(self) -> list[int]:
        return [0, 1] if self.quick else [0, 1, 2]

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


# ---------------------------------------------------------------------------------------------- helpers


def make_job(model: str, *, steps: int, batch: int, lr: float, seed: int, model_args: dict[str, Any] | None = None,
             data: dict[str, Any] | None = None, scaling: str = "none", combiner: dict[str, Any] | None = None,
             optimizer: dict[str, Any] | None = None, warmup: dict[str, Any] | None = None,
             decay: dict[str, Any] | None = None, log_every: int = 10) -> JobSpec:
    return JobSpec.model_validate({
        "name": "convergence", "model": model, "model_args": model_args or {}, "data": data or {},
        "train": {"steps": steps, "batch_per_rank": batch, "lr": lr, "lr_scaling": scaling, "seed": seed,
                  "optimizer": optimizer or {"name": "sgd", "momentum": 0.9},
                  "combiner": combiner or {"name": "mean"}, "warmup": warmup or {"kind": "none"},
                  "decay": decay or {"kind": "none"}, "log_every": log_every},
        "checkpoint": {"every_steps": 100000}})


def simulate(job: JobSpec, workers: int, run_dir: Path, **options: Any) -> SimulationResult:
    torch.set_num_threads(1)
    return Simulation(job, workers, run_dir, **options).run()


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def pm(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    m, s = mean_std(values)
    return "diverged" if math.isnan(m) else f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}"


def accuracy(result: SimulationResult) -> float:
    """Worker 0's final test accuracy; NaN when the run diverged."""
    return result.final.get("test_accuracy", math.nan) if result.diverged_at is None else math.nan


def curve(result: SimulationResult, key: str) -> tuple[list[int], list[float]]:
    return [s for s, _ in result.evaluations], [e[key] for _, e in result.evaluations]


def band(ax: Any, runs: Sequence[tuple[list[int], list[float]]], label: str, **style: Any) -> None:
    """Mean ± one standard deviation over seeds; a seed that diverged ends its curve where it did."""
    longest = max(runs, key=lambda r: len(r[0]))[0]
    means, lows, highs, xs = [], [], [], []
    for i, x in enumerate(longest):
        vals = [r[1][i] for r in runs if i < len(r[1]) and math.isfinite(r[1][i])]
        if not vals:
            break
        m, s = mean_std(vals)
        xs.append(x)
        means.append(m)
        lows.append(m - s)
        highs.append(m + s)
    if not xs:
        return
    line = ax.plot(xs, means, label=label, **style)[0]
    ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.2)


def figure(ncols: int = 1, width: float = 5.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 3.6), squeeze=False)
    return fig, axes[0]


def log_ticks(ax: Any, values: Sequence[float]) -> None:
    """A log axis labelled at the values measured, written plainly."""
    ax.set_xticks(list(values), [f"{v:g}" for v in values])
    ax.minorticks_off()


def save(fig: Any, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


# ----------------------------------------------------------------------------- simulation vs real ranks

RANK_CHECKS = {
    "mean": {"name": "mean"},
    "adasum (delta)": {"name": "adasum", "adasum_on": "delta"},
    "adasum (gradient)": {"name": "adasum", "adasum_on": "gradient"},
    "adacomp": {"name": "adacomp"},
    "dasgd (period 2, delay 1)": {"name": "dasgd", "period": 2, "delay": 1},
}


def final_checkpoint(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[int, dict[str, torch.Tensor]]]:
    """The last checkpoint's model (rank 0's) and, where ranks saved their own, each rank's."""
    step_dir = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    shared = torch.load(step_dir / "shared.pt", weights_only=True)
    ranks = {}
    for path in sorted(step_dir.glob("rank-*.pt")):
        state = torch.load(path, weights_only=True)
        if "model" in state:
            ranks[int(path.stem.split("-")[1])] = state["model"]
    return shared["model"], ranks


def check_real_ranks(sizes: Sizes, out: Path, work: Path) -> Row:
    """The trainer on 4 real ranks (one ``mpiexec -n 4``, each combiner's job in turn) against the simulation
    of the same jobs: digits CNN, 4 steps."""
    ranks, steps = 4, 4
    jobs: dict[str, tuple[JobSpec, Path]] = {}
    for i, (label, combiner) in enumerate(RANK_CHECKS.items()):
        job = make_job("resnet", steps=steps, batch=4, lr=0.05, seed=3, model_args={"channels": 8, "blocks": 1},
                       combiner=combiner, log_every=2)
        run_dir = work / "ranks" / str(i)
        run_dir.mkdir(parents=True, exist_ok=True)
        content = job.model_dump(mode="json", exclude_none=True)
        content["resources"].update(nodes=1, ranks_per_node=ranks)
        (run_dir / "job.yaml").write_text(yaml.safe_dump(content))
        jobs[label] = (job, run_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HPCTRAIN_", "SLURM_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    argv = [str(VENV_BIN / "mpiexec"), "-n", str(ranks), sys.executable, str(Path(__file__).resolve()),
            "--train-on-ranks", *(str(d) for _, d in jobs.values())]
    done = subprocess.run(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"convergence: mpiexec -n {ranks} failed:\n{done.stdout[-3000:]}")
    diffs: dict[str, float] = {}
    for label, (job, run_dir) in jobs.items():
        real_model, real_ranks = final_checkpoint(run_dir / "real")
        torch.set_num_threads(1)
        sim = Simulation(job, ranks, run_dir / "sim")
        sim.run()
        worst = 0.0
        for k, worker in enumerate(sim.workers):
            expected = real_ranks.get(k, real_model)  # ranks in sync saved one model for all
            for name, value in worker.model.state_dict().items():
                worst = max(worst, float((value - expected[name]).abs().max()))
        diffs[label] = worst
    holds = all(d <= TOLERANCE for d in diffs.values())
    measured = "; ".join(f"{k}: {v:.1e}" for k, v in diffs.items())
    return Row("simulation = real ranks", f"`mpiexec -n {ranks}`, the trainer (runtime/trainer.py) on the digits "
               f"CNN, {steps} steps, every combiner; max |parameter difference| over all ranks, tolerance "
               f"{TOLERANCE:g}", measured, holds, data={"max_abs_diff": diffs})


def train_on_ranks(run_dirs: Sequence[str]) -> int:
    """On every rank under mpiexec: ``runtime.trainer.train`` for each ``RUN_DIR/job.yaml`` in turn."""
    from hpctrain.config.job import load_job
    from hpctrain.runtime.trainer import train

    for run_dir in map(Path, run_dirs):
        train(load_job(str(run_dir / "job.yaml")), run_dir / "real", backend="mpi")
    return 0


# ------------------------------------------------------------------------------ the digits CNN, fixed


def digits_before_after(sizes: Sizes, out: Path, work: Path) -> Row:
    """400 steps of batch 16, SGD momentum 0.9, lr 0.05 (the issue's new user) on the model before the fix, with
    each of the fix's three changes alone, and after (hpctrain/models/digits.py)."""
    from torch import nn

    from hpctrain.models.digits import SmallResNet, load_digits_tensors
    from hpctrain.models.task import ShardedIndexStream

    class OldResidualBlock(nn.Module):  # the model as it was before issue 17, for the comparison only
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.conv2(torch.relu(self.conv1(torch.relu(x))))

    class OldSmallResNet(nn.Module):
        """``spatial``: the new head (2x2 pool, 4x4 grid); ``he``: He initialisation; else as it was."""

        def __init__(self, c: int = 16, blocks: int = 2, spatial: bool = False, he: bool = False) -> None:
            super().__init__()
            self.stem = nn.Conv2d(1, c, 3, padding=1)
            self.blocks = nn.Sequential(*[OldResidualBlock(c) for _ in range(blocks)])
            self.spatial = spatial
            self.head = nn.Linear(c * 16 if spatial else c, 10)
            for m in self.modules():
                if he and isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    nn.init.zeros_(m.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.blocks(self.stem(x)))
            return self.head(nn.functional.avg_pool2d(h, 2).flatten(1) if self.spatial else h.mean(dim=(2, 3)))

    torch.set_num_threads(1)
    steps, every = sizes.pick(400, 100), 25
    images, labels = load_digits_tensors()
    raw = (images[297:], images[:297])
    mean, std = raw[0].mean(), raw[0].std()
    norm = ((raw[0] - mean) / std, (raw[1] - mean) / std)
    variants: dict[str, tuple[Callable[[], nn.Module], tuple[torch.Tensor, torch.Tensor]]] = {
        "before": (OldSmallResNet, raw),
        "standardised input only": (OldSmallResNet, norm),
        "He init only": (lambda: OldSmallResNet(he=True), raw),
        "spatial head only": (lambda: OldSmallResNet(spatial=True), raw),
        "after": (SmallResNet, norm),
    }
    runs: dict[str, list[tuple[list[int], list[float]]]] = {name: [] for name in variants}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    spread: dict[str, list[float]] = {name: [] for name in variants}
    for name, (build, (train_x, test_x)) in variants.items():
        for seed in sizes.seeds:
            torch.manual_seed(seed)
            model = build()
            with torch.no_grad():  # how much the logits differ between images before training
                spread[name].append(float(model(test_x).std(0).mean()))
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            stream = ShardedIndexStream(len(train_x), 16, 0, 1, seed)
            xs, accs, started = [], [], time.perf_counter()
            for step in range(1, steps + 1):
                idx = stream.next()
                opt.zero_grad()
                nn.functional.cross_entropy(model(train_x[idx]), labels[297:][idx]).backward()
                opt.step()
                if step % every == 0:
                    with torch.no_grad():
                        accs.append(float((model(test_x).argmax(1) == labels[:297]).float().mean()))
                    xs.append(step)
            seconds[name].append(time.perf_counter() - started)
            runs[name].append((xs, accs))
    fig, (ax,) = figure(width=6.0)
    for name, style in zip(variants, ({"ls": "--", "color": "C3"}, {"ls": ":"}, {"ls": ":"}, {"ls": ":"},
                                      {"color": "C0"}), strict=True):
        band(ax, runs[name], name, **style)
    ax.set(xlabel="step (batch 16)", ylabel="test accuracy", title="digits CNN, SGD m=0.9 lr=0.05", ylim=(0, 1))
    ax.legend(fontsize=8)
    png = save(fig, out, "digits_before_after")
    final = {k: [r[1][-1] for r in v] for k, v in runs.items()}
    at100 = {k: [r[1][3] for r in v] for k, v in runs.items()}
    holds = mean_std(final["after"])[0] >= 0.9
    measured = (f"test accuracy after {steps} steps: before {pm(final['before'], 100)} %, after "
                f"{pm(final['after'], 100)} % (after 100 steps: {pm(at100['before'], 100)} % vs "
                f"{pm(at100['after'], 100)} %); {pm(seconds['after'], digits=1)} s per run")
    return Row("digits CNN learns in seconds", f"batch 16, SGD momentum 0.9, lr 0.05, {steps} steps, "
               f"{len(sizes.seeds)} seeds; the fix: standardised input, 2x2-pooled spatial head, He init",
               measured, holds, png, data={"final": final, "at_100": at100, "seconds": seconds,
                                           "logit_spread": spread})


# ------------------------------------------------------------------------------------------------ Adasum


DIGITS_SMALL = {"channels": 8, "blocks": 1}
# AdaComp and DaSGD, K workers x 4 images: 0.02 x sqrt(K) with a 10-step warm-up and a cosine decay, for the
# baseline and the combiner alike. (0.05 x sqrt(K), tried first, diverged for the uncompressed mean at K = 128.)
DIGITS_LR = 0.02
DIGITS_SCHEDULE: dict[str, Any] = {"scaling": "sqrt", "warmup": {"kind": "linear", "steps": 10},
                                   "decay": {"kind": "cosine"}}


def adasum_claim(sizes: Sizes, out: Path, work: Path) -> Row:
    """K workers x 1 image: Adasum (delta, no LR scaling) against the mean with linear LR scaling."""
    workers = sizes.pick([64, 256, 1024], [16])
    steps = sizes.pick({64: 60, 256: 40, 1024: 15}, {16: 10})
    # The LR one worker trains best with at batch 1 (SGD m=0.9, 600 steps: 0.005 and 0.01 reach 80-88 %, 0.02
    # is unstable, 0.05 diverges): the base LR that each rule then scales, or not, for K workers.
    base_lr = 0.01
    lrs = sizes.pick([0.0025, 0.01, 0.04], [0.01, 0.04])
    sweep_k = workers[0]
    results: dict[str, dict[Any, list[SimulationResult]]] = {"adasum": {}, "mean": {}}

    def run(kind: str, k: int, lr: float, seed: int) -> SimulationResult:
        combiner = {"name": "adasum", "adasum_on": "delta"} if kind == "adasum" else {"name": "mean"}
        job = make_job("resnet", steps=steps[k], batch=1, lr=lr, seed=seed, model_args=DIGITS_SMALL,
                       combiner=combiner, scaling="none" if kind == "adasum" else "linear")
        return simulate(job, k, work / "digits", gradients="batched", eval_every=max(1, steps[k] // 10),
                        stop_on_divergence=True)

    for kind in results:
        for k in workers:
            results[kind][k] = [run(kind, k, base_lr, s) for s in sizes.seeds]
        for lr in lrs:
            results[kind][("lr", lr)] = (results[kind][sweep_k] if lr == base_lr else
                                         [run(kind, sweep_k, lr, s) for s in sizes.seeds])
    fig, axes = figure(len(workers) + 1, 4.0)
    for ax, k in zip(axes, workers, strict=False):
        for kind, style in (("adasum", {}), ("mean", {"ls": "--"})):
            band(ax, [curve(r, "test_accuracy") for r in results[kind][k]],
                 f"Adasum, lr {base_lr:g}" if kind == "adasum" else f"mean, lr {base_lr:g} x {k}", **style)
        ax.set(title=f"K = {k} workers x 1 image", xlabel="step", ylabel="test accuracy", ylim=(0, 1))
        ax.legend(fontsize=8)
    ax = axes[-1]
    for kind, style in (("adasum", {"marker": "o"}), ("mean", {"marker": "s", "ls": "--"})):
        finals = [mean_std([accuracy(r) for r in results[kind][("lr", lr)]]) for lr in lrs]
        ax.errorbar(lrs, [0.0 if math.isnan(m) else m for m, _ in finals],
                    yerr=[0.0 if math.isnan(s) else s for _, s in finals], capsize=3,
                    label="Adasum" if kind == "adasum" else "mean (linear scaling)", **style)
    ax.set(xscale="log", title=f"LR sensitivity, K = {sweep_k}", xlabel="base LR (one worker)",
           ylabel="final test accuracy (0 = diverged)", ylim=(0, 1))
    log_ticks(ax, lrs)
    ax.legend(fontsize=8)
    png = save(fig, out, "adasum")
    # Held: Adasum converges (>= 80 % test accuracy) at every K, and the mean stalls (< 50 %) or diverges at
    # some K: "Adasum keeps converging where the mean with linear LR scaling stalls or diverges".
    parts, converges, stalls = [], True, False
    for k in workers:
        a = [accuracy(r) for r in results["adasum"][k]]
        m = [accuracy(r) for r in results["mean"][k]]
        diverged = sum(r.diverged_at is not None for r in results["mean"][k])
        parts.append(f"K={k}: Adasum {pm(a, 100)} %, mean {pm(m, 100)} %"
                     + (f" ({diverged}/{len(m)} diverged)" if diverged else ""))
        am, mm = mean_std(a)[0], mean_std(m)[0]
        converges &= not math.isnan(am) and am >= 0.8
        stalls |= math.isnan(mm) or mm < 0.5
    holds = converges and stalls
    sweep = {kind: {lr: [accuracy(r) for r in results[kind][("lr", lr)]] for lr in lrs} for kind in results}
    parts.append(f"LR sweep at K={sweep_k}: " + ", ".join(
        f"{lr:g}: {pm(sweep['adasum'][lr], 100, 0)} vs {pm(sweep['mean'][lr], 100, 0)}" for lr in lrs))
    return Row("Adasum at large batch (Maleki et al.)",
               f"digits CNN 8 ch, K = {', '.join(map(str, workers))} workers x 1 image, SGD m=0.9; Adasum on the "
               f"update (no LR scaling) vs mean with lr x K; {', '.join(f'{steps[k]}' for k in workers)} steps",
               "; ".join(parts), holds, png,
               data={"accuracy": {kind: {str(k): [accuracy(r) for r in v] for k, v in d.items()}
                                  for kind, d in results.items()},
                     "seconds": sum(r.seconds for d in results.values() for v in d.values() for r in v)})


# ----------------------------------------------------------------------------------------------- AdaComp


def adacomp_claim(sizes: Sizes, out: Path, work: Path) -> Row:
    """AdaComp against the uncompressed mean at K = 16 and 128; wire ratios per layer."""
    workers = sizes.pick([16, 128], [8])
    steps = sizes.pick({16: 150, 128: 40}, {8: 15})
    model = {"channels": 16, "blocks": 1}
    accs: dict[str, dict[int, list[float]]] = {"adacomp": {}, "mean": {}}
    curves: dict[str, dict[int, list[tuple[list[int], list[float]]]]] = {"adacomp": {}, "mean": {}}
    layer_bytes: dict[int, dict[str, list[int]]] = {}
    for k in workers:
        layer_bytes[k] = {}
        for kind in accs:
            accs[kind][k], curves[kind][k] = [], []
            for seed in sizes.seeds:
                job = make_job("resnet", steps=steps[k], batch=4, lr=DIGITS_LR, seed=seed, model_args=model,
                               combiner={"name": kind}, **DIGITS_SCHEDULE)
                sim = Simulation(job, k, work / "digits", gradients="batched", eval_every=max(1, steps[k] // 10))
                torch.set_num_threads(1)
                result = sim.run()
                accs[kind][k].append(accuracy(result))
                curves[kind][k].append(curve(result, "test_accuracy"))
                for w in sim.workers:
                    if isinstance(w.combiner, AdaCompCombiner):
                        for name, (dense, wire) in w.combiner.layer_bytes.items():
                            totals = layer_bytes[k].setdefault(name, [0, 0])
                            totals[0] += dense
                            totals[1] += wire
    ratios = {k: {name: dense / wire for name, (dense, wire) in sorted(v.items())} for k, v in layer_bytes.items()}

    def kind_ratio(k: int, conv: bool) -> float:
        names = [n for n in layer_bytes[k] if n.endswith("weight") and ("conv" in n or "stem" in n) == conv]
        return sum(layer_bytes[k][n][0] for n in names) / sum(layer_bytes[k][n][1] for n in names)

    fig, axes = figure(len(workers) + 1, 4.0)
    for ax, k in zip(axes, workers, strict=False):
        for kind, style in (("adacomp", {}), ("mean", {"ls": "--"})):
            band(ax, curves[kind][k], "AdaComp" if kind == "adacomp" else "uncompressed mean", **style)
        ax.set(title=f"K = {k} workers x 4 images", xlabel="step", ylabel="test accuracy", ylim=(0.5, 1))
        ax.legend(fontsize=8)
    ax = axes[-1]
    names = list(ratios[workers[0]])
    width = 0.8 / len(workers)
    for i, k in enumerate(workers):
        ax.bar([j + i * width for j in range(len(names))], [ratios[k][n] for n in names], width, label=f"K = {k}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], [n.replace(".weight", ".w").replace(".bias", ".b")
                                                                      for n in names], rotation=60, fontsize=7)
    ax.axhline(40, ls=":", color="grey")
    ax.axhline(200, ls=":", color="grey")
    ax.set(yscale="log", ylabel="dense bytes / bytes sent", title="AdaComp wire ratio per layer")
    ax.legend(fontsize=8)
    png = save(fig, out, "adacomp")
    parts, holds = [], True
    for k in workers:
        a, m = mean_std(accs["adacomp"][k]), mean_std(accs["mean"][k])
        loss_pp = (m[0] - a[0]) * 100
        conv, fc = kind_ratio(k, True), kind_ratio(k, False)
        parts.append(f"K={k}: {pm(accs['adacomp'][k], 100)} % vs {pm(accs['mean'][k], 100)} % "
                     f"(loss {loss_pp:+.1f} pp); conv weights {conv:.0f}x, FC {fc:.0f}x")
        holds &= loss_pp <= 1.0 and conv >= 40 and fc >= 200
    return Row("AdaComp ≥40x conv, ≥200x FC, ≤1 % loss (Chen et al.)",
               f"digits CNN 16 ch, K = {', '.join(map(str, workers))} workers x 4, lr 0.02 x sqrt(K), "
               f"bins 50 (conv) / 500 (FC); ratio = dense bytes / hpctrain's wire bytes",
               "; ".join(parts), holds, png,
               data={"accuracy": {kind: {str(k): v for k, v in d.items()} for kind, d in accs.items()},
                     "ratios": {str(k): v for k, v in ratios.items()}})


# -------------------------------------------------------------------------------------------------- DaSGD


def dasgd_claim(sizes: Sizes, out: Path, work: Path) -> Row:
    """DaSGD with delay 1 (period 1) and delay 2 (period 2) against synchronous SGD (the mean)."""
    workers = sizes.pick([16, 64], [8])
    steps = sizes.pick({16: 150, 64: 80}, {8: 15})
    variants = {"synchronous": {"name": "mean"}, "DaSGD delay 1": {"name": "dasgd", "period": 1, "delay": 1},
                "DaSGD delay 2": {"name": "dasgd", "period": 2, "delay": 2}}
    accs: dict[str, dict[int, list[float]]] = {v: {} for v in variants}
    losses: dict[str, dict[int, list[tuple[list[int], list[float]]]]] = {v: {} for v in variants}
    for k in workers:
        for label, combiner in variants.items():
            accs[label][k], losses[label][k] = [], []
            for seed in sizes.seeds:
                job = make_job("resnet", steps=steps[k], batch=4, lr=DIGITS_LR, seed=seed, model_args=DIGITS_SMALL,
                               combiner=combiner, **DIGITS_SCHEDULE)
                result = simulate(job, k, work / "digits", gradients="batched")
                accs[label][k].append(accuracy(result))
                losses[label][k].append((list(range(1, result.steps + 1)), smooth(result.losses, 10)))
    fig, axes = figure(len(workers), 4.5)
    for ax, k in zip(axes, workers, strict=True):
        for label, style in zip(variants, ({}, {"ls": "--"}, {"ls": ":"}), strict=True):
            band(ax, losses[label][k], label, **style)
        ax.set(title=f"K = {k} workers x 4 images", xlabel="step", ylabel="training loss (mean of 10 steps)",
               yscale="log")
        ax.legend(fontsize=8)
    png = save(fig, out, "dasgd")
    parts, holds = [], True
    for k in workers:
        sync = mean_std(accs["synchronous"][k])
        for label in list(variants)[1:]:
            m = mean_std(accs[label][k])
            holds &= abs(m[0] - sync[0]) <= max(2 * max(m[1], sync[1]), 0.01)
        parts.append(f"K={k}: " + ", ".join(f"{label.removeprefix('DaSGD ')} {pm(accs[label][k], 100)} %"
                                          for label in variants))
    return Row("DaSGD delay 1, 2 ≈ synchronous SGD", f"digits CNN 8 ch, K = {', '.join(map(str, workers))} x 4 "
               f"images, SGD m=0.9, lr 0.02 x sqrt(K); delay d averages every d steps; held if |Δ accuracy| ≤ "
               f"max(2σ, 1 pp)",
               "; ".join(parts), holds, png,
               data={"accuracy": {v: {str(k): a for k, a in d.items()} for v, d in accs.items()}})


def smooth(values: Sequence[float], n: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


# --------------------------------------------------------------------------------------------------- LEGW


LSTM = {"seq_len": 32, "embed": 16, "hidden": 64}


def legw_claim(sizes: Sizes, out: Path, work: Path) -> Row:
    """The char LSTM at 16x and 64x its base batch, sqrt LR scaling: LEGW warm-up against a fixed one."""
    from hpctrain.config.plugins.charlm import SCHEMA as CHARLM

    data = {"max_chars": sizes.pick(60_000, 20_000)}
    # lr 0.5 is the best of 0.25, 0.5, 1 and 2 for the base batch (3 epochs, one seed)
    base_batch, epochs = 4, sizes.pick(3, 1)
    scales = sizes.pick([1, 16, 64], [1, 8])
    args, parsed = CHARLM.parse(LSTM, data)
    windows = CHARLM.dataset_size(args, parsed)
    warm_epochs = 8 * base_batch / windows  # 8 steps at the base batch
    results: dict[str, dict[int, list[SimulationResult]]] = {"LEGW": {}, "fixed": {}}
    for k in scales:
        steps = epochs * (windows // (base_batch * k))
        for label in results if k > 1 else ["LEGW"]:
            # fixed: the base run's warm-up epochs, so k times fewer steps; LEGW: k times the epochs
            warmup = ({"kind": "legw", "epochs": warm_epochs} if label == "LEGW" else
                      {"kind": "linear", "steps": max(1, round(8 / k))})
            results[label][k] = [simulate(make_job("lstm", steps=steps, batch=base_batch, lr=0.5, seed=seed,
                                                   model_args=LSTM, data=data, scaling="sqrt", warmup=warmup,
                                                   log_every=max(1, steps // 20)), k, work / "lstm",
                                          eval_every=max(1, steps // 10), stop_on_divergence=True)
                                 for seed in sizes.seeds]
    results["fixed"][1] = results["LEGW"][1]

    def valid(r: SimulationResult) -> float:
        return r.final.get("valid_loss", math.nan) if r.diverged_at is None else math.nan

    fig, axes = figure(2, 4.5)
    for label, style in (("LEGW", {}), ("fixed", {"ls": "--"})):
        for k in scales[1:]:
            runs = [([s * k * base_batch / windows for s in xs], ys)
                    for xs, ys in (curve(r, "valid_loss") for r in results[label][k])]
            band(axes[0], runs, f"{label}, {k}x batch", **style)
    band(axes[0], [([s * base_batch / windows for s in xs], ys) for xs, ys in
                   (curve(r, "valid_loss") for r in results["LEGW"][1])], "base batch", color="black")
    axes[0].set(xlabel="epoch", ylabel="validation loss (nats/char)", title="char LSTM, sqrt LR scaling")
    axes[0].legend(fontsize=8)
    for label, style in (("LEGW", {"marker": "o"}), ("fixed", {"marker": "s", "ls": "--"})):
        finals = [mean_std([valid(r) for r in results[label][k]]) for k in scales]
        axes[1].errorbar(scales, [m for m, _ in finals], yerr=[s for _, s in finals], capsize=3, label=label, **style)
    axes[1].set(xscale="log", xlabel="batch / base batch", ylabel=f"validation loss after {epochs} epochs",
                title="same epochs, no retuning")
    log_ticks(axes[1], scales)
    axes[1].legend(fontsize=8)
    png = save(fig, out, "legw")
    base = mean_std([valid(r) for r in results["LEGW"][1]])
    parts, holds = [f"base batch {base_batch}: {pm([valid(r) for r in results['LEGW'][1]], digits=3)}"], True
    for k in scales[1:]:
        legw, fixed = ([valid(r) for r in results[lab][k]] for lab in ("LEGW", "fixed"))
        parts.append(f"{k}x: LEGW {pm(legw, digits=3)}, fixed {pm(fixed, digits=3)}")
        lm, ls = mean_std(legw)
        fm, _ = mean_std(fixed)
        matches = not math.isnan(lm) and lm - base[0] <= max(2 * max(ls, base[1]), 0.05)
        holds &= matches and (math.isnan(fm) or fm > lm)
    return Row("LEGW for LSTM (You et al.)", f"char LSTM 64 hidden, base batch {base_batch}, {epochs} epochs at every "
               f"batch, SGD m=0.9 lr 0.5 x sqrt(k); LEGW warm-up {warm_epochs * 1:.4f} x k epochs vs the base's "
               f"epochs; held if LEGW is within max(2σ, 0.05) of the base and below fixed",
               "; ".join(parts), holds, png,
               data={"valid_loss": {lab: {str(k): [valid(r) for r in v] for k, v in d.items()}
                                    for lab, d in results.items()}})


# ---------------------------------------------------------------------------------------------------- FFN


def ffn_claim(sizes: Sizes, out: Path, work: Path) -> Row:
    """The FFN at 4 .. 64 virtual nodes, linear against sqrt LR scaling (Dong et al.: sqrt best beyond 16)."""
    nodes = sizes.pick([4, 16, 32, 64], [2, 4])
    steps = sizes.pick(60, 6)
    model = {"depth": 2, "features": 8, "fov": [9, 9, 9], "deltas": [2, 2, 2], "single_fov_steps": steps}
    data = {"train": {"synthetic": {"shape": [32, 64, 64], "seed": 1}}}
    losses: dict[str, dict[int, list[float]]] = {"linear": {}, "sqrt": {}}
    curves: dict[str, dict[int, list[tuple[list[int], list[float]]]]] = {"linear": {}, "sqrt": {}}
    for rule in losses:
        for n in nodes:
            losses[rule][n], curves[rule][n] = [], []
            for seed in sizes.seeds:
                job = make_job("ffn", steps=steps, batch=1, lr=0.002, seed=seed, model_args=model, data=data,
                               scaling=rule, optimizer={"name": "adam"}, warmup={"kind": "linear", "steps": 10})
                result = simulate(job, n, work / "ffn", stop_on_divergence=True)
                tail = result.losses[-max(1, steps // 4):] if result.diverged_at is None else [math.nan]
                losses[rule][n].append(statistics.fmean(tail))
                curves[rule][n].append((list(range(1, result.steps + 1)), smooth(result.losses, 10)))
    fig, axes = figure(2, 4.5)
    for rule, style in (("linear", {"marker": "s", "ls": "--"}), ("sqrt", {"marker": "o"})):
        finals = [mean_std(losses[rule][n]) for n in nodes]
        axes[0].errorbar(nodes, [m for m, _ in finals], yerr=[s for _, s in finals], capsize=3, label=rule, **style)
        band(axes[1], curves[rule][nodes[-1]], f"{rule}, {nodes[-1]} nodes", ls=style["ls"] if "ls" in style else "-")
    axes[0].set(xscale="log", xlabel="virtual nodes (1 FOV each)", ylabel=f"training loss, last {max(1, steps // 4)} "
                "steps", title="FFN: LR scaling rule")
    log_ticks(axes[0], nodes)
    axes[0].legend(fontsize=8)
    axes[1].set(xlabel="step", ylabel="training loss (mean of 10 steps)", title=f"{nodes[-1]} virtual nodes")
    axes[1].legend(fontsize=8)
    png = save(fig, out, "ffn_lr_scaling")
    parts, holds = [], True
    for n in nodes:
        lin, sq = mean_std(losses["linear"][n]), mean_std(losses["sqrt"][n])
        best = "sqrt" if math.isnan(lin[0]) or sq[0] < lin[0] else "linear"
        parts.append(f"{n}: linear {pm(losses['linear'][n], digits=3)}, sqrt {pm(losses['sqrt'][n], digits=3)} "
                     f"({best})")
        if n > 16:
            holds &= best == "sqrt"
    return Row("FFN: sqrt beats linear LR scaling beyond 16 nodes (Dong et al.)",
               f"FFN depth 2, 8 features, FOV 9³, synthetic EM; {', '.join(map(str, nodes))} virtual nodes x 1 FOV, "
               f"Adam lr 0.002, 10-step warm-up, {steps} steps", "; ".join(parts), holds, png,
               data={"loss": {r: {str(n): v for n, v in d.items()} for r, d in losses.items()}})


# ---------------------------------------------------------------------------------------------- the run

CLAIMS: dict[str, Callable[[Sizes, Path, Path], Row]] = {
    "ranks": check_real_ranks, "digits": digits_before_after, "adasum": adasum_claim, "adacomp": adacomp_claim,
    "dasgd": dasgd_claim, "legw": legw_claim, "ffn": ffn_claim,
}


# The rows' claim names, in the order of CLAIMS (a partial run keeps the table in this order).
CLAIM_NAMES = ["simulation = real ranks", "digits CNN learns in seconds", "Adasum at large batch (Maleki et al.)",
               "AdaComp ≥40x conv, ≥200x FC, ≤1 % loss (Chen et al.)", "DaSGD delay 1, 2 ≈ synchronous SGD",
               "LEGW for LSTM (You et al.)", "FFN: sqrt beats linear LR scaling beyond 16 nodes (Dong et al.)"]


def table(rows: Sequence[Row]) -> str:
    lines = ["| claim | setting | measured | holds? |", "|---|---|---|---|"]
    for r in rows:
        holds = {True: "yes", False: "**no**", None: "—"}[r.holds]
        cells = (text.replace("|", "\\|") for text in (r.claim, r.setting, r.measured))  # | ends a cell
        lines.append("| " + " | ".join([*cells, holds]) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the machinery in a few minutes")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNGs, results.json, table.md (default: a new temporary directory; the committed "
                        "results are docs/convergence)")
    parser.add_argument("--only", nargs="*", choices=sorted(CLAIMS), help="run only these (default: all)")
    parser.add_argument("--train-on-ranks", nargs="+", metavar="RUN_DIR", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def output_dir(out: Path | None, quick: bool) -> Path:
    """Where this run writes: ``out``, or a new temporary directory. A ``--quick`` run never replaces the rows
    of a full run (its numbers mean nothing): that refusal comes before any work."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="hpctrain-convergence-results-"))
    previous = out / "results.json"
    if quick and previous.exists():
        try:
            earlier_quick = json.loads(previous.read_text()).get("quick", True)
        except (ValueError, AttributeError, OSError):
            earlier_quick = True
        if earlier_quick is False:
            raise SystemExit(f"convergence.py: {out} holds a full run's results; a --quick run would replace them "
                             "with numbers that mean nothing: give another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.train_on_ranks:
        return train_on_ranks(args.train_on_ranks)
    sizes = Sizes(args.quick)
    args.out = output_dir(args.out, args.quick)
    print(f"results go to {args.out}", flush=True)
    started, load_at_start = time.perf_counter(), os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpctrain-convergence-") as tmp:
        for name in args.only or list(CLAIMS):
            t0 = time.perf_counter()
            row = CLAIMS[name](sizes, args.out, Path(tmp))
            row.seconds = time.perf_counter() - t0
            rows.append(row)
            print(f"[{row.seconds:6.0f} s] {row.claim}: {row.measured} -> holds: {row.holds}", flush=True)
    total = time.perf_counter() - started
    kept, runs = [], []
    previous = args.out / "results.json"
    if args.only and previous.exists():  # the other claims' rows of an earlier run in this folder stay
        earlier = json.loads(previous.read_text())
        if earlier.get("quick") == args.quick:
            names = {r.claim for r in rows}
            kept = [Row(**r) for r in earlier["rows"] if r["claim"] not in names]
            runs = earlier.get("runs", [])
    order = {name: i for i, name in enumerate(CLAIM_NAMES)}
    rows = sorted([*kept, *rows], key=lambda r: order.get(r.claim, len(order)))
    runs.append({"claims": args.only or list(CLAIMS), "seconds": total, "load_average_start": load_at_start,
                 "load_average_end": os.getloadavg(), "cores": os.cpu_count()})
    summary = {"quick": args.quick, "runs": runs, "rows": [asdict(r) for r in rows]}
    (args.out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    (args.out / "table.md").write_text(table(rows))
    print(table(rows))
    print(f"total {total:.0f} s on {os.cpu_count()} cores; load average {load_at_start[0]:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
