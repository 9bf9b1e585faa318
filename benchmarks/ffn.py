"""FFN speed on this CPU: FOVs/s for training and inference, eager PyTorch vs hpctrain.ffn.perf settings.

Sizes: the published model (depth 12, 32 features, 33³) and the demo (read from jobs/ffn-local.yaml: depth,
features, FOV and batch per rank). GFLOP/s counts the convolutions (2 FLOP per MAC; a training FOV =
forward + backward = 3 × forward), and is compared with the machine's own float32 matmul rate measured in the same run.
The "tuned bf16" training row is ``train.precision: bfloat16`` (autocast; fast only on CPUs with AMX).

    .venv/bin/python benchmarks/ffn.py            # full table, ~2-4 min on 2 cores
    .venv/bin/python benchmarks/ffn.py --quick    # ~30 s
    .venv/bin/python benchmarks/ffn.py --compile  # also torch.compile rows (adds its compile time)
    .venv/bin/python benchmarks/ffn.py --flood [--checkpoint CKPT]  # flood fill vs the batched forward rate

Timings are the best of interleaved rounds (warm-up excluded), which is what survives other processes on a
shared machine; the load average at start and end is printed with the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hpctrain.ffn import perf  # noqa: E402
from hpctrain.ffn.model import ConvStack3D  # noqa: E402
from hpctrain.runtime.precision import forward_context, native_bf16  # noqa: E402
from hpctrain_bench.ffn_counts import training_flops_per_fov  # noqa: E402
from hpctrain_bench.ffn_perf_checks import is_compiled, num_threads  # noqa: E402


@dataclass(frozen=True)
class Size:
    name: str
    depth: int
    features: int
    fov: int
    train_batch: int
    infer_batch: int


PUBLISHED = Size("published d12 f32 33³", 12, 32, 33, train_batch=1, infer_batch=1)


DEMO_JOB = Path(__file__).resolve().parent.parent / "jobs" / "ffn-local.yaml"


def demo_size(job: Path = DEMO_JOB) -> Size:
    """The demo job's model (cubic FOV) and batch per rank, so the benchmark follows the job."""
    import yaml

    spec = yaml.safe_load(job.read_text())
    args = spec["model_args"]
    fov = args["fov"] if isinstance(args["fov"], int) else args["fov"][0]
    depth, features = int(args["depth"]), int(args["features"])
    return Size(f"demo d{depth} f{features} {fov}³", depth, features, int(fov),
                train_batch=int(spec["train"]["batch_per_rank"]), infer_batch=1)


DEMO = demo_size()


@dataclass
class Row:
    size: str
    mode: str
    variant: str
    batch: int
    seconds: float  # best time of one step (one batch)
    fovs_per_s: float
    gflops: float
    frac_matmul: float = 0.0
    vs_eager: float = 1.0
    setup_s: float = 0.0  # tracing / compilation time, excluded from the step time


def matmul_gflops(n: int = 2048, reps: int = 3) -> float:
    """Best float32 ``torch.mm`` rate of n×n by n×n with the current threads, GFLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2 * n**3 / best / 1e9


def conv3d_gflops(features: int = 32, fov: int = 33, reps: int = 3) -> float:
    """Best forward rate of one 3³ conv (features → features) on a fov³ volume, channels-last, GFLOP/s."""
    conv = nn.Conv3d(features, features, 3, padding=1).to(memory_format=torch.channels_last_3d)
    x = torch.randn(1, features, fov, fov, fov).contiguous(memory_format=torch.channels_last_3d)
    with torch.inference_mode():
        conv(x)
        best = min(_timed(lambda: conv(x)) for _ in range(reps))
    return 2 * 27 * features * features * fov**3 / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _train_step(model: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    return step


def _train_step_bf16(model: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    """The training step under ``train.precision: bfloat16`` (the runtime's autocast around the forward)."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        with forward_context("bfloat16", torch.device("cpu")):
            out = model(x)
        out.float().sum().backward()

    return step


def _infer_step(model: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    def step() -> torch.Tensor:
        with torch.inference_mode():
            return model(x)

    return step


def build_cases(size: Size, threads: int, compile_: bool) -> list[tuple[Row, Callable[[], object]]]:
    """The (row, step) pairs for one model size; tracing/compilation happen here (timed into setup_s)."""
    torch.manual_seed(0)
    base = ConvStack3D(size.depth, size.features, (size.fov,) * 3)
    xt = torch.randn(size.train_batch, 2, size.fov, size.fov, size.fov)
    xi = torch.randn(size.infer_batch, 2, size.fov, size.fov, size.fov)
    cases: list[tuple[Row, Callable[[], object]]] = []

    def add(mode: str, variant: str, batch: int, step: Callable[[], object], setup: float) -> None:
        cases.append((Row(size.name, mode, variant, batch, 0.0, 0.0, 0.0, setup_s=setup), step))

    add("train", "eager", size.train_batch, _train_step(copy.deepcopy(base), xt), 0.0)
    t = time.perf_counter()
    tuned = perf.tune_for_cpu(copy.deepcopy(base), threads=threads)
    add("train", "tuned", size.train_batch, _train_step(tuned, xt), time.perf_counter() - t)
    # train.precision: bfloat16 (what the FFN task builds then: channels-last, torch's convolutions, autocast)
    half = perf.tune_for_cpu(copy.deepcopy(base), threads=threads, onednn=False)
    add("train", "tuned bf16", size.train_batch, _train_step_bf16(half, xt), 0.0)
    if compile_:
        t = time.perf_counter()
        comp = perf.tune_for_cpu(copy.deepcopy(base), threads=threads, compile=True, example_input=xt)
        label = "tuned+compile" if is_compiled(comp) else "tuned+compile(FAILED→eager)"
        add("train", label, size.train_batch, _train_step(comp, xt), time.perf_counter() - t)

    add("infer", "eager", size.infer_batch, _infer_step(copy.deepcopy(base).eval(), xi), 0.0)
    t = time.perf_counter()
    tuned_inf = perf.tune_for_inference(base, xi, threads=threads)
    add("infer", "tuned", size.infer_batch, _infer_step(tuned_inf, xi), time.perf_counter() - t)
    t = time.perf_counter()
    frozen = perf.tune_for_inference(base, xi, threads=threads, freeze=True)
    label = "tuned+frozen" if isinstance(frozen, perf.FrozenInference) else "tuned+frozen(FAILED)"
    add("infer", label, size.infer_batch, _infer_step(frozen, xi), time.perf_counter() - t)
    half_inf = perf.tune_for_inference(base, xi, threads=threads, precision="bfloat16")  # the inference setting's
    add("infer", "tuned bf16", size.infer_batch, _infer_step(half_inf, xi), 0.0)
    # Several FOVs per call (e.g. several canvases advanced together): what batching would buy.
    xb = torch.randn(4, 2, size.fov, size.fov, size.fov)
    add("infer", "tuned", 4, _infer_step(tuned_inf, xb), 0.0)
    return cases


def flood_model(size: Size, checkpoint: Path | None) -> tuple[nn.Module, tuple[int, int, int], dict]:
    """The model whose flood is timed: a trained checkpoint, or the demo size with random weights whose last
    bias makes every voxel object (each flood then visits every FOV it can reach: the loop's per-FOV cost)."""
    from hpctrain.ffn.inference.runner import load_model

    if checkpoint is not None:
        model, args, _ = load_model(checkpoint)
        return model, tuple(int(v) for v in args["deltas"]), {k: args[k] for k in ("image_mean", "image_stddev")
                                                                if k in args}
    torch.manual_seed(0)
    model = ConvStack3D(size.depth, size.features, (size.fov,) * 3)
    with torch.no_grad():
        model.conv_lom.bias.fill_(6.0)
    return model.eval(), (max(1, size.fov // 5),) * 3, {}


def flood_vs_forward(size: Size, threads: int, rounds: int, checkpoint: Path | None = None,
                     batch: int = 8) -> list[dict]:
    """Flood fill's FOVs per second (one canvas; four subvolume canvases in lock step) against the same
    model's forward rate at batch 1 and at ``batch``, measured in interleaved rounds of this run."""
    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.ffn.inference.canvas import make_canvas
    from hpctrain.ffn.inference.runner import segment_volumes_together
    from hpctrain.ffn.inference.seeds import make_seeds, within_margin
    from hpctrain.ffn.synthetic import make_synthetic_volume

    perf.set_threads(threads)
    base, deltas, norm = flood_model(size, checkpoint)
    fov = tuple(base.fov)
    model = perf.tune_for_inference(base, torch.zeros(1, 2, *fov))
    image, _ = make_synthetic_volume((48, 96, 96), 2)
    cfg = InferenceConfig(fov=fov, deltas=deltas, min_segment_size=100, **norm)
    seeds = within_margin(make_seeds("peaks", image), image.shape, [f // 2 for f in fov])
    pieces = [image[:, :56, :56], image[:, :56, 40:], image[:, 40:, :56], image[:, 40:, 40:]]

    def flood_once() -> tuple[int, float]:
        canvas = make_canvas(model, image, cfg)
        t = time.perf_counter()
        canvas.segment_all(seeds)
        return canvas.counters.get("ffn_calls", 0), time.perf_counter() - t

    def together_once() -> tuple[int, float]:
        counted = CountingModule(model)
        t = time.perf_counter()
        segment_volumes_together(counted, pieces, cfg)
        return counted.fovs, time.perf_counter() - t  # seeds of the pieces included: a small share

    def forward_rate(b: int) -> float:
        x = torch.randn(b, 2, *fov)
        with torch.inference_mode():
            model(x)
            n, t = 0, time.perf_counter()
            while n < 200 or time.perf_counter() - t < 1.0:
                model(x)
                n += b
        return n / (time.perf_counter() - t)

    best = {"flood": 0.0, "flood, 4 canvases together": 0.0, "forward batch 1": 0.0, f"forward batch {batch}": 0.0}
    fovs = {}
    for _ in range(rounds):
        n, t = flood_once()
        best["flood"], fovs["flood"] = max(best["flood"], n / t), n
        n, t = together_once()
        key = "flood, 4 canvases together"
        best[key], fovs[key] = max(best[key], n / t), n
        best["forward batch 1"] = max(best["forward batch 1"], forward_rate(1))
        best[f"forward batch {batch}"] = max(best[f"forward batch {batch}"], forward_rate(batch))
    batched = best[f"forward batch {batch}"]
    return [{"case": k, "fovs_per_s": v, "of_batched_forward": v / batched, "fovs": fovs.get(k)}
            for k, v in best.items()]


class CountingModule(nn.Module):
    """Counts the calls of a model and the FOVs it is asked for (benchmarks/flood_batching.py uses it too)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0
        self.fovs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.fovs += int(x.shape[0])
        return self.inner(x)


def _with_threads(threads: int, step: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with num_threads(threads):
            return step()

    return run


def build_ablation(size: Size) -> list[tuple[Row, Callable[[], object]]]:
    """Each setting alone, one thread, and other batch sizes: the rows behind docs/ffn_speed.md."""
    torch.manual_seed(0)
    base = ConvStack3D(size.depth, size.features, (size.fov,) * 3)
    fov = (size.fov,) * 3
    cases: list[tuple[Row, Callable[[], object]]] = []

    def add(mode: str, variant: str, batch: int, step: Callable[[], object]) -> None:
        cases.append((Row(size.name, mode, variant, batch, 0.0, 0.0, 0.0), step))

    xt = torch.randn(size.train_batch, 2, *fov)
    xi = torch.randn(size.infer_batch, 2, *fov)
    for label, kw in (("channels_last", {"onednn": False}), ("onednn", {"channels_last": False})):
        add("train", label, size.train_batch, _train_step(perf.tune_for_cpu(copy.deepcopy(base), **kw), xt))
        add("infer", label, size.infer_batch, _infer_step(perf.tune_for_inference(base, xi, **kw), xi))
    add("train", "eager 1 thread", size.train_batch, _with_threads(1, _train_step(copy.deepcopy(base), xt)))
    tuned = perf.tune_for_cpu(copy.deepcopy(base))
    add("train", "tuned 1 thread", size.train_batch, _with_threads(1, _train_step(tuned, xt)))
    inf = perf.tune_for_inference(base, xi)
    add("infer", "tuned 1 thread", size.infer_batch, _with_threads(1, _infer_step(inf, xi)))
    for batch in (1, 2, 8) if size.fov < 33 else (2,):
        if batch != size.train_batch:
            add("train", "tuned", batch, _train_step(tuned, torch.randn(batch, 2, *fov)))
            add("train", "eager", batch, _train_step(copy.deepcopy(base), torch.randn(batch, 2, *fov)))
    return cases


def measure(cases: list[tuple[Row, Callable[[], object], int]], rounds: int) -> tuple[list[Row], float, float]:
    """Warm every case up, then run ``rounds`` rounds over all cases (the matmul and conv3d rates, then each
    case its ``reps`` times), so that every case samples the whole run's load. Keeps the best step time per
    case and the best matmul and conv3d rates."""
    for _, step, _ in cases:
        step()
    best = [float("inf")] * len(cases)
    mm = conv = 0.0
    for _ in range(rounds):
        mm = max(mm, matmul_gflops())
        conv = max(conv, conv3d_gflops())
        for i, (_, step, reps) in enumerate(cases):
            for _ in range(reps):
                best[i] = min(best[i], _timed(step))
    rows = []
    for (row, _, _), seconds in zip(cases, best, strict=True):
        row.seconds = seconds
        rows.append(row)
    return rows, mm, conv


def finish(rows: list[Row], sizes: dict[str, Size], mm: float) -> list[Row]:
    """Fill FOVs/s, GFLOP/s, the fraction of the matmul rate and the ratio to the eager row."""
    for row in rows:
        s = sizes[row.size]
        flops = training_flops_per_fov(s.depth, s.features, (s.fov,) * 3)
        per_fov = flops["train"] if row.mode == "train" else flops["forward"]
        row.fovs_per_s = row.batch / row.seconds
        row.gflops = row.fovs_per_s * per_fov / 1e9
        row.frac_matmul = row.gflops / mm
    for row in rows:
        # per-FOV ratio to eager at the same batch, else to the first (default-batch) eager row
        eagers = [r for r in rows if (r.size, r.mode, r.variant) == (row.size, row.mode, "eager")]
        eager = next((r for r in eagers if r.batch == row.batch), eagers[0])
        row.vs_eager = row.fovs_per_s / eager.fovs_per_s
    return rows


def table(rows: list[Row]) -> str:
    head = (
        f"{'size':22s} {'mode':5s} {'variant':16s} {'batch':>5s} {'FOVs/s':>8s} {'GFLOP/s':>8s} "
        f"{'of mm':>6s} {'vs eager':>8s} {'setup s':>7s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.size:22s} {r.mode:5s} {r.variant:16s} {r.batch:5d} {r.fovs_per_s:8.2f} {r.gflops:8.1f} "
            f"{r.frac_matmul:6.2f} {r.vs_eager:8.2f} {r.setup_s:7.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds (~30 s)")
    ap.add_argument("--compile", action="store_true", help="add torch.compile training rows")
    ap.add_argument("--ablation", action="store_true", help="add each setting alone, 1 thread, batch sizes")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: all CPUs of this process)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 4, quick 2)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and machine facts here")
    ap.add_argument("--flood", action="store_true", help="only flood fill vs the batched forward rate (demo size)")
    ap.add_argument("--checkpoint", type=Path, default=None, help="trained checkpoint for --flood")
    args = ap.parse_args(argv)
    if args.flood:
        threads = args.threads or perf.available_cpus()
        load0 = os.getloadavg()
        rows = flood_vs_forward(DEMO, threads, args.rounds or 3, args.checkpoint)
        print(f"{DEMO.name}, {threads} threads, {'checkpoint ' + str(args.checkpoint) if args.checkpoint else 'random'}"
              " weights; synthetic 48x96x96 volume")
        print(f"{'case':28s} {'FOVs/s':>8s} {'of batched fwd':>15s} {'FOVs':>7s}")
        for r in rows:
            print(f"{r['case']:28s} {r['fovs_per_s']:8.1f} {r['of_batched_forward']:15.2f} {r['fovs'] or '':>7}")
        print(f"load average start {load0[0]:.2f}, end {os.getloadavg()[0]:.2f}")
        return 0

    warnings.simplefilter("ignore")  # TracerWarning etc.; failures are reported in the variant label
    threads = args.threads or perf.available_cpus()
    perf.set_threads(threads)
    rounds = args.rounds or (2 if args.quick else 4)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    sizes = {s.name: s for s in (PUBLISHED, DEMO)}
    cases = []
    for size in sizes.values():
        reps = {"train": 1, "infer": 2} if size is PUBLISHED else {"train": 3, "infer": 10}
        if args.quick:
            reps = {k: max(1, v // 2) for k, v in reps.items()}
        built = build_cases(size, threads, args.compile) + (build_ablation(size) if args.ablation else [])
        cases += [(row, step, reps[row.mode]) for row, step in built]
    rows, mm, conv = measure(cases, rounds)
    finish(rows, sizes, mm)
    load1 = os.getloadavg()
    wall = time.perf_counter() - t0

    flops = training_flops_per_fov()
    print(f"torch {torch.__version__}, {threads} threads, CPUs available {perf.available_cpus()}; bfloat16 in "
          f"hardware (AMX): {'yes' if native_bf16(torch.device('cpu')) else 'no (the bf16 rows are emulated)'}")
    print(f"published FOV: forward {flops['forward'] / 1e9:.1f} GFLOP, training {flops['train'] / 1e9:.1f} GFLOP")
    print(f"float32 matmul 2048² (best): {mm:.1f} GFLOP/s; one conv3d 32→32 3³ on 33³ fwd: {conv:.1f} GFLOP/s")
    print(table(rows))
    print(f"load average start {load0[0]:.2f}, end {load1[0]:.2f}; wall {wall:.0f} s")
    if max(load0[0], load1[0]) > perf.available_cpus() + 0.5:
        cpus = perf.available_cpus()
        print(f"WARNING: load above the {cpus} CPUs: other processes shared them; rerun when quiet")
    if args.json:
        facts = {
            "torch": torch.__version__,
            "threads": threads,
            "matmul_gflops": mm,
            "conv3d_gflops": conv,
            "load_start": load0,
            "load_end": load1,
            "wall_s": wall,
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
