"""Data-parallel runtime benchmark: one run prints a table of ratios against the targets of issue 4.

Run: ``python benchmarks/runtime.py`` (it re-launches itself under ``.venv/bin/mpiexec -n 2``). Every rank
uses one intra-op thread (2 ranks on 2 cores). Model: FFN-shaped stack of residual 3D convolutions.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FEATURES, DEPTH, EDGE, BATCH = 32, 8, 17, 1
WARMUP, STEPS = 2, 8


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


def _median_time(fn, barrier) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(STEPS):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker() -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from hpctrain.runtime import combine
    from hpctrain.runtime.comm import MPICommunicator, TorchDistCommunicator
    from hpctrain.runtime.reducer import Reducer, broadcast_model

    torch.set_num_threads(1)
    gloo = TorchDistCommunicator("gloo", timeout_s=300)
    mpi = MPICommunicator(timeout_s=300)
    rank, world = gloo.rank, MPI.COMM_WORLD
    x = torch.randn(BATCH, 2, EDGE, EDGE, EDGE)
    y = torch.randn(BATCH, 1, EDGE, EDGE, EDGE)
    rows: dict[str, float] = {}

    def barrier() -> None:
        dist.barrier()  # gloo: blocking socket read, does not spin a core

    def plain_step(model, opt):
        def step() -> None:
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return step

    # 1 rank alone (the other core idle in a gloo barrier): the weak-scaling baseline.
    model = ffn_like()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if rank == 0:
        t1 = _median_time(plain_step(model, opt), lambda: None)
        rows["t_1rank"] = t1
    dist.barrier()

    def reducer_step(comm, combiner: str):
        m = ffn_like()
        broadcast_model(m, comm)
        red = Reducer(m, comm, combiner=combiner, bucket_mb=4.0)
        o = torch.optim.SGD(m.parameters(), lr=1e-3)

        def step() -> None:
            red.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            red.finish()
            o.step()
        return step, red, m

    for name, comm in (("gloo", gloo), ("mpi", mpi)):
        for combiner in ("mean", "adasum"):
            step, red, _ = reducer_step(comm, combiner)
            rows[f"hp_{name}_{combiner}"] = _median_time(step, barrier)
            red.close()

    ddp = torch.nn.parallel.DistributedDataParallel(ffn_like(), bucket_cap_mb=4.0)
    rows["ddp_gloo"] = _median_time(plain_step(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)), barrier)

    # Fused reduction of all gradients (no compute) vs one raw allreduce of the same bytes.
    for name, comm in (("gloo", gloo), ("mpi", mpi)):
        m = ffn_like()
        red = Reducer(m, comm, combiner="mean", bucket_mb=4.0)
        nbytes = sum(b.flat.numel() * 4 for b in red.buckets)
        rows[f"fused_{name}"] = _median_time(red.finish, barrier)
        flat = torch.ones(nbytes // 4)
        if name == "gloo":
            rows[f"raw_{name}"] = _median_time(lambda f=flat: dist.all_reduce(f), barrier)
        else:
            buf = flat.numpy()
            rows[f"raw_{name}"] = _median_time(lambda b=buf: world.Allreduce(MPI.IN_PLACE, b), barrier)
        rows["grad_mb"] = nbytes / 2**20
        red.close()
        # Same at 16 MB (4 buckets of 4 MB), where bandwidth rather than per-call latency decides.
        big = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2**20)) for _ in range(4)])
        red = Reducer(big, comm, combiner="mean", bucket_mb=4.0)
        rows[f"fused16_{name}"] = _median_time(red.finish, barrier)
        flat16 = torch.ones(4 * 2**20)
        if name == "gloo":
            rows[f"raw16_{name}"] = _median_time(lambda f=flat16: dist.all_reduce(f), barrier)
        else:
            b16 = flat16.numpy()
            rows[f"raw16_{name}"] = _median_time(lambda b=b16: world.Allreduce(MPI.IN_PLACE, b), barrier)
        red.close()

    # AdaComp encode + decode of every layer, on one rank's gradients.
    m = ffn_like()
    torch.nn.functional.mse_loss(m(x), y).backward()
    named = [(n, p.grad.clone()) for n, p in m.named_parameters()]
    residues = {n: torch.zeros_like(g) for n, g in named}

    def adacomp_codec() -> None:
        for n, g in named:
            msg, residues[n] = combine.adacomp_encode(residues[n], g, combine.default_bin_len(n, g.dim()))
            combine.adacomp_decode(msg)
    rows["adacomp_codec"] = _median_time(adacomp_codec, barrier)

    gathered = MPI.COMM_WORLD.gather(rows, root=0)
    if rank == 0:
        report({k: float(np.mean([g[k] for g in gathered if k in g])) for k in gathered[0]})
    mpi.close()
    gloo.close()


def report(r: dict[str, float]) -> None:
    t1 = r["t_1rank"]
    lines = [
        ("hpctrain step / DDP step (gloo, mean)", r["hp_gloo_mean"] / r["ddp_gloo"], "<= 0.95"),
        ("hpctrain step / DDP step (mpi, mean)", r["hp_mpi_mean"] / r["ddp_gloo"], "<= 0.95"),
        ("fused / raw allreduce bw, model grads (gloo)", r["raw_gloo"] / r["fused_gloo"], ">= 0.95"),
        ("fused / raw allreduce bw, model grads (mpi)", r["raw_mpi"] / r["fused_mpi"], ">= 0.95"),
        ("fused / raw allreduce bw, 16 MB (gloo)", r["raw16_gloo"] / r["fused16_gloo"], ">= 0.95"),
        ("fused / raw allreduce bw, 16 MB (mpi)", r["raw16_mpi"] / r["fused16_mpi"], ">= 0.95"),
        ("Adasum step / mean step (gloo)", r["hp_gloo_adasum"] / r["hp_gloo_mean"], "<= 1.15"),
        ("Adasum step / mean step (mpi)", r["hp_mpi_adasum"] / r["hp_mpi_mean"], "<= 1.15"),
        ("AdaComp encode+decode / step (mpi mean)", r["adacomp_codec"] / r["hp_mpi_mean"], "(report)"),
        ("weak scaling 2 vs 1 rank (hpctrain gloo)", t1 / r["hp_gloo_mean"], ">= 0.95"),
        ("weak scaling 2 vs 1 rank (hpctrain mpi)", t1 / r["hp_mpi_mean"], ">= 0.95"),
        ("weak scaling 2 vs 1 rank (torch DDP gloo)", t1 / r["ddp_gloo"], "(reference)"),
    ]
    print(f"model: {DEPTH} residual conv3d, {FEATURES} features, input {BATCH}x2x{EDGE}^3, "
          f"{r['grad_mb']:.2f} MB of gradients; 2 ranks x 1 thread; median of {STEPS} steps")
    print(f"1-rank step {t1 * 1e3:.0f} ms | hpctrain gloo {r['hp_gloo_mean'] * 1e3:.0f} ms | hpctrain mpi "
          f"{r['hp_mpi_mean'] * 1e3:.0f} ms | DDP gloo {r['ddp_gloo'] * 1e3:.0f} ms")
    print(f"{'ratio':<48} {'value':>7}  target")
    for name, value, target in lines:
        print(f"{name:<48} {value:7.3f}  {target}")


def main() -> None:
    if "PMI_RANK" in os.environ:
        worker()
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [str(ROOT / ".venv/bin/mpiexec"), "-n", "2", sys.executable, __file__]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
