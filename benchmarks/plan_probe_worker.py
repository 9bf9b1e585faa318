"""One rank of ``benchmarks/plan.py``'s machine probe (started by torch.distributed.run): times a training step of a
small 3-D convolution network, alone or beside other ranks, and gloo all-reduces after such a step.

``compute``: every rank times ``ITERATIONS`` training steps of the kernel at once; rank 0 prints one JSON line
with the mean step time over all ranks. ``collectives``: each round runs one kernel step, a barrier, then the
timed all-reduce, so the all-reduce starts from a rank that has just computed (as in training, where the
first one after backward pays for waking gloo's threads); rank 0 prints the mean time per size.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

ITERATIONS = 60
ROUNDS = 200
SIZES = (8, 1 << 18, 1 << 20)


def kernel() -> callable:
    """One training step of a plain 3-D convolution stack (2 -> 24 -> 24 -> 24 -> 1 channels, 3^3 kernels, a batch
    of 2 of 20^3): ~25 ms on one core. Not any job's model: a machine figure is measured with a fixed kernel."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv3d(2, 24, 3, padding=1), nn.ReLU(), nn.Conv3d(24, 24, 3, padding=1), nn.ReLU(),
                        nn.Conv3d(24, 24, 3, padding=1), nn.ReLU(), nn.Conv3d(24, 1, 1))
    opt = torch.optim.SGD(net.parameters(), 1e-3)
    x = torch.randn(2, 2, 20, 20, 20)

    def step() -> None:
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()

    return step


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step = kernel()
    for _ in range(5):
        step()
    out: dict = {"ranks": world}
    if sys.argv[1] == "compute":
        dist.barrier()
        times = []
        for _ in range(ITERATIONS):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        means: list = [None] * world
        dist.all_gather_object(means, (statistics.mean(times), statistics.stdev(times)))
        out["step_s"] = statistics.mean(m for m, _ in means)
        out["rank_step_s"] = [m for m, _ in means]
        out["rank_std_s"] = [s for _, s in means]
    else:
        out["allreduce_s"] = {}
        for nbytes in SIZES:
            t = torch.ones(max(1, nbytes // 4))
            for _ in range(3):
                dist.all_reduce(t)
            times = []
            for _ in range(ROUNDS):
                step()
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - start)
            out["allreduce_s"][str(nbytes)] = statistics.mean(times)
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.barrier()
    # Leave without tearing gloo down: its threads' teardown can abort a process that is done (std::terminate),
    # which would fail the probe after its result is printed.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
