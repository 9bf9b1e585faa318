"""Data-parallel runtime benchmark: one run prints a table of ratios against the targets of issue 4.

Run: ``python benchmarks/runtime.py [--reps N]`` (it re-launches itself under ``.venv/bin/mpiexec -n 2``).
Compared variants are measured interleaved (every round runs each once, in an order shuffled per round), so
load from other jobs hits them alike; each ratio is the median of the per-round ratios, with its interquartile range.

On a node with two or more CUDA (or ROCm) GPUs the same command then runs a device section, one rank per GPU:
hpctrain's reducer over NCCL (RCCL on ROCm) against torch DDP on the same GPUs, fused against raw all-reduce, and
NCCL's bus bandwidth as nccl-tests defines it (busbw = algbw x 2(n-1)/n). ``--device cpu`` runs that section's
code on the CPU over gloo (a check of the code, not a measurement of anything a GPU does).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FEATURES, DEPTH, EDGE, BATCH = 32, 8, 17, 1
BUCKET_MB = 4.0
WARMUP = 2
CALLS = 10  # reductions per timed call in the bandwidth comparison


def ffn_like():
    import torch
    from torch import nn

    class Res(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv3d(FEATURES, FEATURES, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.conv(torch.relu(x))

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(2, FEATURES, 3, padding=1), *[Res() for _ in range(DEPTH)],
                         nn.Conv3d(FEATURES, 1, 1))


def interleaved(variants: dict[str, Callable[[], None]], reps: int, barrier: Callable[[], None],
                prime: bool = False) -> dict[str, list[float]]:
    """Seconds per call of every variant, ``reps`` rounds, variants interleaved; warm-up excluded.

    Each round runs the variants in a fresh order (seeded by the round, so every rank runs the same
    collectives in the same order): a fixed cyclic order would always put the same variant after the same
    neighbour, e.g. the 0.85 MB reduction after the 16 MB one that flushed the caches. ``prime``: one
    untimed call right before each timed one, so every variant is timed warm (steady-state bandwidth).
    """
    names = list(variants)
    for name in names:
        for _ in range(WARMUP):
            variants[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names[:]
        random.Random(1000 + r).shuffle(order)
        for name in order:
            if prime:
                variants[name]()
            barrier()
            t0 = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def _repeat(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` CALLS times back to back: one timing then spans many reductions, so the few-ms skew with which
    ranks leave the barrier under load does not dominate a sub-millisecond all-reduce."""
    def run() -> None:
        for _ in range(CALLS):
            fn()
    return run


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def worker(reps: int) -> None:
    import torch
    import torch.distributed as dist

    from hpctrain.config.job import CombinerConfig
    from hpctrain.runtime import combine
    from hpctrain.runtime.combiners import MeanCombiner, build_combiner
    from hpctrain.runtime.comm.mpi import MPICommunicator
    from hpctrain.runtime.comm.mpi_env import import_mpi
    from hpctrain.runtime.comm.torch_dist import TorchDistCommunicator
    from hpctrain.runtime.reducer import Reducer, broadcast_model

    MPI = import_mpi()  # with the settings the runtime uses (one node: no UCX)

    torch.set_num_threads(1)
    gloo = TorchDistCommunicator("gloo", timeout_s=300)
    mpi = MPICommunicator(timeout_s=300)
    rank, world = gloo.rank, MPI.COMM_WORLD
    x = torch.randn(BATCH, 2, EDGE, EDGE, EDGE)
    y = torch.randn(BATCH, 1, EDGE, EDGE, EDGE)
    out: dict[str, list[float]] = {}
    info: dict[str, object] = {}

    def barrier() -> None:
        dist.barrier()  # gloo: a blocking socket read, does not spin a core

    def plain_step(model, opt):
        def step() -> None:
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return step

    def reducer_step(comm, combiner: str, bucket_mb: float = BUCKET_MB):
        m = ffn_like()
        broadcast_model(m, comm)
        strategy = build_combiner(CombinerConfig(name=combiner, adasum_on="gradient"), comm, list(m.parameters()))
        red = Reducer(m, comm, strategy, bucket_mb=bucket_mb)  # as the trainer (the mean prescaled)
        o = torch.optim.SGD(m.parameters(), lr=1e-3)

        def step() -> None:
            if red.timeline is not None:
                red.timeline.append(("step start", -1, time.perf_counter()))
            red.zero_grad()
            (torch.nn.functional.mse_loss(m(x), y) * red.loss_scale).backward()
            if red.timeline is not None:
                red.timeline.append(("backward end", -1, time.perf_counter()))
            red.finish()
            o.step()
        return step, red

    # -- training steps: 1 rank alone (rank 1 waits in a gloo barrier), hpctrain gloo/mpi mean/adasum, DDP.
    solo_model = ffn_like()
    solo = plain_step(solo_model, torch.optim.SGD(solo_model.parameters(), lr=1e-3))
    steps, reducers = {}, []
    for name, comm in (("gloo", gloo), ("mpi", mpi)):
        for combiner in ("mean", "adasum"):
            steps[f"hp_{name}_{combiner}"], red = reducer_step(comm, combiner)
            reducers.append(red)
    ddp = torch.nn.parallel.DistributedDataParallel(ffn_like(), bucket_cap_mb=BUCKET_MB)
    steps["ddp_gloo"] = plain_step(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
    steps["t_1rank"] = solo if rank == 0 else (lambda: None)
    # Both ranks compute alone, no reduction: the ceiling of weak scaling on this machine (two processes
    # share the caches, memory bandwidth and clock boost that one process had to itself).
    steps["t_2rank_nocomm"] = solo
    out.update(interleaved(steps, reps, barrier))
    info["buckets"] = len(reducers[0].buckets)
    for red in reducers:
        red.close()

    # -- overlap: when buckets launch and complete relative to the end of backward (small buckets).
    timelines = {}
    for name, comm in (("gloo", gloo), ("mpi", mpi)):
        step, red = reducer_step(comm, "mean", bucket_mb=0.125)
        step()
        red.timeline = []
        for _ in range(3):
            barrier()
            step()
        timelines[name] = (len(red.buckets), red.timeline)
        red.close()

    # -- fused reduction (no compute) vs one raw all-reduce of the same bytes on the same back-end.
    micro: dict[str, Callable[[], None]] = {}
    for name, comm in (("gloo", gloo), ("mpi", mpi)):
        for tag, model in (("", ffn_like()), ("16", torch.nn.ParameterList(
                [torch.nn.Parameter(torch.zeros(2**20)) for _ in range(4)]))):
            red = Reducer(model, comm, MeanCombiner(comm, list(model.parameters()), prescaled=True),
                          bucket_mb=BUCKET_MB)
            nbytes = sum(b.flat.numel() * 4 for b in red.buckets)
            info[f"mb{tag}"] = nbytes / 2**20
            flat = torch.ones(nbytes // 4)
            micro[f"fused{tag}_{name}"] = _repeat(red.finish)
            if name == "gloo":
                micro[f"raw{tag}_{name}"] = _repeat(lambda f=flat: dist.all_reduce(f))
            else:
                buf = flat.numpy()
                micro[f"raw{tag}_{name}"] = _repeat(lambda b=buf: world.Allreduce(MPI.IN_PLACE, b))
    out.update(interleaved(micro, 2 * reps, barrier, prime=True))

    # -- AdaComp encode + decode of every layer, on one rank's gradients.
    m = ffn_like()
    torch.nn.functional.mse_loss(m(x), y).backward()
    named = [(n, p.grad.clone()) for n, p in m.named_parameters()]
    residues = {n: torch.zeros_like(g) for n, g in named}

    def adacomp_codec() -> None:
        for n, g in named:
            msg, residues[n] = combine.adacomp_encode(residues[n], g, combine.default_bin_len(n, g.dim()))
            combine.adacomp_decode(msg)
    out.update(interleaved({"adacomp_codec": adacomp_codec}, reps, barrier))

    gathered = world.gather(out, root=0)
    if rank == 0:
        # A round's time is the slowest rank's (a step is not done until every rank is); 1-rank: rank 0's.
        merged = {k: [max(g[k][i] for g in gathered) for i in range(len(out[k]))] for k in out}
        merged["t_1rank"] = gathered[0]["t_1rank"]
        report(merged, info, timelines, reps)
    mpi.close()
    gloo.close()


def _ratio(r: dict[str, list[float]], num: str, den: str, invert: bool = False) -> tuple[float, float, float]:
    """Median and IQR of the per-round ratios ``num/den`` (or ``den/num``) of interleaved measurements."""
    pairs = [(b / a if invert else a / b) for a, b in zip(r[num], r[den], strict=True)]
    return quartiles(pairs)


def _overlap_lines(timelines: dict) -> list[str]:
    lines = []
    for name, (nb, tl) in timelines.items():
        if not any(e[0] == "launch" for e in tl):
            lines.append(f"  {name}: this reducer records no timeline")
            continue
        starts = [i for i, e in enumerate(tl) if e[0] == "step start"] + [len(tl)]
        early, lead, waited = [], [], []
        for lo, hi in zip(starts, starts[1:], strict=False):
            ev = tl[lo:hi]
            t_end = next(e[2] for e in ev if e[0] == "backward end")
            launches = [e[2] for e in ev if e[0] == "launch"]
            waits = {e[1]: e[2] for e in ev if e[0] == "wait"}
            done = {e[1]: e[2] for e in ev if e[0] == "done"}
            early.append(sum(t < t_end for t in launches))
            lead.append((t_end - min(launches)) * 1e3)
            waited.append(sum(done[b] - waits[b] for b in done) * 1e3)
        lines.append(f"  {name}: {nb} buckets of <= 0.125 MB; per step (median of {len(early)}): "
                     f"{statistics.median(early):.0f} launched before backward ended, the first "
                     f"{statistics.median(lead):.0f} ms before; finish() then waited "
                     f"{statistics.median(waited):.2f} ms in all for their results")
    return lines


def report(r: dict[str, list[float]], info: dict, timelines: dict, reps: int) -> None:
    rows = [
        ("hpctrain step / DDP step (gloo, mean)", _ratio(r, "hp_gloo_mean", "ddp_gloo"), "<= 0.95"),
        ("hpctrain step / DDP step (mpi, mean)", _ratio(r, "hp_mpi_mean", "ddp_gloo"), "<= 0.95"),
        ("fused / raw allreduce bw, model grads (gloo)", _ratio(r, "fused_gloo", "raw_gloo", True), ">= 0.95"),
        ("fused / raw allreduce bw, model grads (mpi)", _ratio(r, "fused_mpi", "raw_mpi", True), ">= 0.95"),
        ("fused / raw allreduce bw, 16 MB (gloo)", _ratio(r, "fused16_gloo", "raw16_gloo", True), ">= 0.95"),
        ("fused / raw allreduce bw, 16 MB (mpi)", _ratio(r, "fused16_mpi", "raw16_mpi", True), ">= 0.95"),
        ("Adasum step / mean step (gloo)", _ratio(r, "hp_gloo_adasum", "hp_gloo_mean"), "<= 1.15"),
        ("Adasum step / mean step (mpi)", _ratio(r, "hp_mpi_adasum", "hp_mpi_mean"), "<= 1.15"),
        ("weak scaling 2 vs 1 rank (hpctrain gloo)", _ratio(r, "hp_gloo_mean", "t_1rank", True), ">= 0.95"),
        ("weak scaling 2 vs 1 rank (hpctrain mpi)", _ratio(r, "hp_mpi_mean", "t_1rank", True), ">= 0.95"),
        ("weak scaling 2 vs 1 rank (torch DDP gloo)", _ratio(r, "ddp_gloo", "t_1rank", True), "(reference)"),
        ("weak scaling 2 vs 1 rank, no reduction at all", _ratio(r, "t_2rank_nocomm", "t_1rank", True),
         "(ceiling)"),
        ("hpctrain mpi step / 2 ranks without reduction", _ratio(r, "hp_mpi_mean", "t_2rank_nocomm"),
         "(overhead)"),
    ]
    med = {k: statistics.median(v) * 1e3 for k, v in r.items()}
    codec = med["adacomp_codec"] / med["hp_mpi_mean"]
    print(f"model: {DEPTH} residual conv3d, {FEATURES} features, input {BATCH}x2x{EDGE}^3, {info['mb']:.2f} MB "
          f"of gradients in {info['buckets']} bucket(s) of <= {BUCKET_MB:g} MB; DDP bucket_cap_mb={BUCKET_MB:g}")
    print(f"2 ranks x 1 intra-op thread (mpiexec -n 2); 1-rank baseline: 1 process x 1 thread, the other "
          f"rank idle in a barrier. {reps} interleaved rounds of steps, {2 * reps} of reductions "
          f"({CALLS} back to back per timing); warm-up excluded; a round's time is the slower rank's")
    print("median step ms: " + " | ".join(f"{k} {med[k]:.0f}" for k in
                                          ("t_1rank", "t_2rank_nocomm", "hp_gloo_mean", "hp_mpi_mean",
                                                                "ddp_gloo")))
    print("median reduction ms (one call): " + " | ".join(f"{k} {med[k] / CALLS:.2f}" for k in (
        "fused_gloo", "raw_gloo", "fused_mpi", "raw_mpi", "fused16_gloo", "raw16_gloo", "fused16_mpi",
        "raw16_mpi")))
    print(f"{'ratio (median of per-round ratios)':<46} {'value':>6}  {'IQR':>13}  target")
    for name, (q1, m, q3), target in rows:
        print(f"{name:<46} {m:6.3f}  [{q1:5.3f},{q3:5.3f}]  {target}")
    print(f"{'AdaComp encode+decode / step (mpi mean)':<46} {codec:6.3f}  {'':>13}  (report)")
    print("overlap (timeline of bucket launch vs end of backward, 3 steps):")
    for line in _overlap_lines(timelines):
        print(line)


# Collectives section: hpctrain's point-to-point all-reduce and all-gather over gloo against gloo's ring all-reduce
# and torch's ring all-gather, on the same group in the same run.
COLLECTIVE_KB = (1, 16, 256, 1024, 16384)


def collectives_worker(reps: int) -> None:
    """p2p / ring time ratios per size: all-reduce blocking (caller's thread) and asynchronous (helper thread),
    all-gather of that many bytes per rank; interleaved, each timing ``CALLS`` calls back to back."""
    import torch
    import torch.distributed as dist

    from hpctrain.runtime.comm.mpi_env import import_mpi
    from hpctrain.runtime.comm.torch_dist import TorchDistCommunicator

    MPI = import_mpi()
    torch.set_num_threads(1)
    gloo = TorchDistCommunicator("gloo", timeout_s=300)
    assert gloo.p2p is not None and gloo.p2p_gather is not None
    p2p, size = gloo.p2p, gloo.size
    out: dict[str, list[float]] = {}
    for kb in COLLECTIVE_KB:
        flat = torch.ones(kb * 256)
        outs = [torch.empty_like(flat) for _ in range(size)]
        variants = {
            f"ar_p2p_{kb}": _repeat(lambda f=flat: p2p.allreduce_(f, "sum")),
            f"ar_async_{kb}": _repeat(lambda f=flat: p2p.start(f, "sum").wait()),
            f"ar_ring_{kb}": _repeat(lambda f=flat: dist.all_reduce(f)),
            f"ag_p2p_{kb}": _repeat(lambda f=flat: p2p.allgather(f)),
            f"ag_ring_{kb}": _repeat(lambda f=flat, o=outs: dist.all_gather(o, f)),
        }
        # the sums overflow to inf after a few hundred calls: an x86 add takes as long on inf as on a number
        out.update(interleaved(variants, reps, dist.barrier, prime=True))
    gathered = MPI.COMM_WORLD.gather(out, root=0)
    if gloo.rank == 0:
        merged = {k: [max(g[k][i] for g in gathered) for i in range(len(out[k]))] for k in out}
        collectives_report(merged, size, reps)
    gloo.close()


def collectives_report(r: dict[str, list[float]], size: int, reps: int) -> None:
    print(f"{size} ranks x 1 intra-op thread; {reps} interleaved rounds, {CALLS} calls back to back per timing, "
          "each timed warm; a round's time is the slowest rank's; ratio = median of per-round ratios [IQR]")
    print(f"{'per rank':>9} | {'ring all-reduce ms':>18} | {'p2p / ring':>19} | {'p2p async / ring':>19} | "
          f"{'ring all-gather ms':>18} | {'p2p / ring':>19}")
    for kb in COLLECTIVE_KB:
        cells = [f"{statistics.median(r[f'ar_ring_{kb}']) * 1e3 / CALLS:18.3f}"]
        for num in ("ar_p2p", "ar_async"):
            q1, m, q3 = _ratio(r, f"{num}_{kb}", f"ar_ring_{kb}")
            cells.append(f"{m:5.2f} [{q1:4.2f},{q3:5.2f}]")
        cells.append(f"{statistics.median(r[f'ag_ring_{kb}']) * 1e3 / CALLS:18.3f}")
        q1, m, q3 = _ratio(r, f"ag_p2p_{kb}", f"ag_ring_{kb}")
        cells.append(f"{m:5.2f} [{q1:4.2f},{q3:5.2f}]")
        label = f"{kb} kB" if kb < 1024 else f"{kb // 1024} MB"
        print(f"{label:>9} | " + " | ".join(f"{c:>19}" if i != 0 and i != 3 else c for i, c in enumerate(cells)))


# Device section: a larger input than the CPU section's (a GPU finishes the small one in microseconds).
DEVICE_BATCH, DEVICE_EDGE = 4, 33
BUS_MB = (1, 16, 256)


def device_worker(reps: int, device_type: str) -> None:
    """hpctrain's mean reduction on the ranks' devices against torch DDP, and the all-reduce bus bandwidth."""
    import torch
    import torch.distributed as dist

    from hpctrain.runtime.combiners import MeanCombiner
    from hpctrain.runtime.comm.torch_dist import TorchDistCommunicator
    from hpctrain.runtime.devices import pick_device
    from hpctrain.runtime.reducer import Reducer, broadcast_model

    backend = "nccl" if device_type == "cuda" else "gloo"
    comm = TorchDistCommunicator(backend, timeout_s=300)  # nccl: makes the rank's own GPU current
    device = pick_device(1, backend, comm.local_rank) if device_type == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(comm.rank)
    x = torch.randn(DEVICE_BATCH, 2, DEVICE_EDGE, DEVICE_EDGE, DEVICE_EDGE, device=device)
    y = torch.randn(DEVICE_BATCH, 1, DEVICE_EDGE, DEVICE_EDGE, DEVICE_EDGE, device=device)

    def barrier() -> None:
        sync()
        dist.barrier()

    def timed(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            step()
            sync()  # a step is done when its kernels and collectives are
        return run

    model = ffn_like().to(device)
    broadcast_model(model, comm)
    red = Reducer(model, comm, MeanCombiner(comm, list(model.parameters()), prescaled=True), bucket_mb=BUCKET_MB)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def hp_step() -> None:
        red.zero_grad()
        (torch.nn.functional.mse_loss(model(x), y) * red.loss_scale).backward()
        red.finish()
        opt.step()

    ddp = torch.nn.parallel.DistributedDataParallel(
        ffn_like().to(device), device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=BUCKET_MB)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def ddp_step() -> None:
        ddp_opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        ddp_opt.step()

    out = interleaved({"hp_mean": timed(hp_step), "ddp": timed(ddp_step)}, reps, barrier)
    grads = torch.ones(sum(b.flat.numel() for b in red.buckets), device=device)
    micro: dict[str, Callable[[], None]] = {
        "fused": timed(_repeat(red.finish)),
        "raw": timed(_repeat(lambda: dist.all_reduce(grads))),
    }
    for mb in BUS_MB:
        buf = torch.ones(mb * 2**20 // 4, device=device)
        micro[f"bus{mb}"] = timed(_repeat(lambda b=buf: dist.all_reduce(b)))
    out.update(interleaved(micro, 2 * reps, barrier, prime=True))
    info = {"mb": grads.numel() * 4 / 2**20, "buckets": len(red.buckets), "device": str(device),
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))
            if device.type == "cuda" else "-"}
    gathered: list[dict[str, list[float]] | None] = [None] * comm.size
    dist.all_gather_object(gathered, out)
    if comm.rank == 0:
        merged = {k: [max(g[k][i] for g in gathered if g) for i in range(len(out[k]))] for k in out}
        device_report(merged, info, comm.size, reps, backend)
    red.close()
    comm.close()


def device_report(r: dict[str, list[float]], info: dict, ranks: int, reps: int, backend: str) -> None:
    med = {k: statistics.median(v) for k, v in r.items()}
    print(f"device section: {ranks} ranks, one {info['name']} each ({backend}; torch {info['torch']}, NCCL "
          f"{info['nccl']}); input {DEVICE_BATCH}x2x{DEVICE_EDGE}^3, {info['mb']:.2f} MB of gradients in "
          f"{info['buckets']} bucket(s); {reps} interleaved rounds of steps, {2 * reps} of reductions")
    print(f"median step ms: hp_mean {med['hp_mean'] * 1e3:.2f} | ddp {med['ddp'] * 1e3:.2f}")
    rows = [("hpctrain step / DDP step (mean)", _ratio(r, "hp_mean", "ddp"), "<= 1.00"),
            ("fused / raw allreduce bw, model grads", _ratio(r, "fused", "raw", True), ">= 0.95")]
    for name, (q1, m, q3), target in rows:
        print(f"{name:<46} {m:6.3f}  [{q1:5.3f},{q3:5.3f}]  {target}")
    factor = 2 * (ranks - 1) / ranks  # nccl-tests: all-reduce bus bandwidth = algorithm bandwidth x 2(n-1)/n
    for mb in BUS_MB if ranks > 1 else ():  # one rank moves nothing between GPUs: no bandwidth to report
        seconds = med[f"bus{mb}"] / CALLS
        algbw = mb * 2**20 / seconds / 1e9
        print(f"all-reduce {mb:>4} MB: {seconds * 1e3:8.3f} ms, algbw {algbw:7.2f} GB/s, busbw {algbw * factor:7.2f}"
              " GB/s")


def _gpus() -> int:
    """CUDA/ROCm devices this node has (0 without a GPU build of torch)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _load(tag: str) -> float:
    one, five, fifteen = os.getloadavg()
    print(f"load average at {tag}: {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores", flush=True)
    return one


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=12, help="interleaved rounds of training steps")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="run only the device section (cpu: its code over gloo, as a check)")
    ap.add_argument("--collectives", type=int, default=0, metavar="RANKS",
                    help="run only the collectives section on RANKS ranks: hpctrain's p2p all-reduce and all-gather "
                         "over gloo against gloo's and torch's rings")
    args = ap.parse_args()
    if "PMI_RANK" in os.environ:
        if args.collectives:
            collectives_worker(args.reps)
        elif args.device:
            device_worker(args.reps, args.device)
        else:
            worker(args.reps)
        return
    if args.device:
        sys.exit(_device_section(args.reps, args.device, 2 if args.device == "cpu" else _gpus()))
    if args.collectives:
        env = dict(os.environ, OMP_NUM_THREADS="1", MPICH_ASYNC_PROGRESS="0")
        cmd = [str(ROOT / ".venv/bin/mpiexec"), "-n", str(args.collectives), sys.executable, __file__, "--reps",
               str(args.reps), "--collectives", str(args.collectives)]
        sys.exit(subprocess.run(cmd, env=env).returncode)
    cores = os.cpu_count() or 1
    if _load("start") > 0.5 * cores:
        print(f"WARNING: the machine is busy before the benchmark starts (load > {0.5 * cores:g}): the 2 ranks "
              "share cores with other jobs; ratios are paired per round but absolute times are inflated",
              flush=True)
    if os.environ.get("MPICH_ASYNC_PROGRESS", "0") not in ("", "0"):
        print("WARNING: MPICH_ASYNC_PROGRESS is on: a progress thread per rank busy-polls a core", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MPICH_ASYNC_PROGRESS="0")
    cmd = [str(ROOT / ".venv/bin/mpiexec"), "-n", "2", sys.executable, __file__, "--reps", str(args.reps)]
    rc = subprocess.run(cmd, env=env).returncode
    if _load("end") > 0.5 * cores + 2:
        print("WARNING: the machine was busy during the benchmark (load includes its own 2 ranks)", flush=True)
    gpus = _gpus()
    if gpus >= 2:
        rc = rc or _device_section(args.reps, "cuda", gpus)
    else:
        print(f"device section not run: {gpus} CUDA/ROCm GPU(s) visible, it needs one per rank for 2 ranks or more")
    sys.exit(rc)


def _device_section(reps: int, device: str, ranks: int) -> int:
    """The device section under mpiexec, one rank per GPU (at most 8)."""
    ranks = min(ranks, 8)
    if ranks == 1 and device == "cuda":  # NCCL refuses two ranks on one GPU: one rank, in this process
        print("device section on ONE GPU: one rank, so NCCL's all-reduce is a local copy; the rows show the "
              "reducer's own cost on the device against DDP's, not the network's", flush=True)
        device_worker(reps, device)
        return 0
    if ranks < 2:
        print(f"device section not run: {ranks} {device} device(s) visible, it needs 2 or more")
        return 1
    env = dict(os.environ, OMP_NUM_THREADS="1", MPICH_ASYNC_PROGRESS="0")
    cmd = [str(ROOT / ".venv/bin/mpiexec"), "-n", str(ranks), sys.executable, __file__, "--reps", str(reps),
           "--device", device]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    main()
