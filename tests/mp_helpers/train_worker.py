"""Worker for tests/test_reducer.py, run under mpiexec or torchrun.

``python train_worker.py BACKEND COMBINER STEPS OUT [COMPRESSION] [BUCKET_MB]``: trains ``tiny_model()``
with the Reducer on this rank's slice of a fixed global batch, checks the first step's combined gradient
against the pure combiner applied to every rank's local gradient, checks the ranks stay in sync, and rank 0
saves the final parameters to OUT. COMBINER ``mean_prescaled`` is the mean with ``prescaled=True``: the loss
is scaled by ``reducer.loss_scale`` before backward and the reducer only sums (what the trainer does).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.runtime import combine  # noqa: E402
from hpctrain.runtime.comm import make_communicator  # noqa: E402
from hpctrain.runtime.reducer import Reducer, broadcast_model, check_sync  # noqa: E402

BATCH_PER_RANK = 4
LR = 0.1


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size * BATCH_PER_RANK, 6, generator=g, dtype=torch.float64).float()
    y = torch.randn(size * BATCH_PER_RANK, 3, generator=g, dtype=torch.float64).float()
    return x, y


def main(backend: str, combiner: str, steps: int, out: str, compression: str, bucket_mb: float) -> None:
    torch.set_num_threads(1)
    comm = make_communicator(backend, timeout_s=60)
    r, n = comm.rank, comm.size
    model = tiny_model(seed=r)  # different on purpose: broadcast_model must fix it
    assert n == 1 or check_sync(model, comm), "ranks start different, check_sync must see it"
    broadcast_model(model, comm)
    assert check_sync(model, comm) == [], "after broadcast_model the ranks must agree"
    prescaled = combiner == "mean_prescaled"
    reducer = Reducer(model, comm, combiner="mean" if prescaled else combiner, compression=compression,
                      bucket_mb=bucket_mb, prescaled=prescaled)
    assert reducer.loss_scale == (1.0 / n if prescaled else 1.0)
    assert bucket_mb > 0.01 or len(reducer.buckets) > 1, "tiny bucket_mb must give several buckets"
    params = [p for p in model.parameters()]
    names = [name for name, _ in model.named_parameters()]
    for step in range(steps):
        x, y = global_batch(step, n)
        mine = slice(r * BATCH_PER_RANK, (r + 1) * BATCH_PER_RANK)
        xs, ys = x[mine], y[mine]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        if step == 0:  # local gradients without touching .grad (no hooks fire), for the reference
            local = torch.autograd.grad(loss, params, retain_graph=True)
            per_rank = [comm.allgather(g) for g in local]  # per_rank[layer][rank]
            if combiner == "adasum":
                expected = [combine.adasum_reduce(layer) for layer in per_rank]
            elif combiner == "adacomp":
                expected = [combine.mean([combine.adacomp_decode(combine.adacomp_encode(
                    torch.zeros_like(g), g, combine.default_bin_len(name, g.dim()))[0]) for g in layer])
                    for name, layer in zip(names, per_rank, strict=True)]
            elif combiner in ("mean", "mean_prescaled") and compression == "none":
                expected = [combine.mean(layer) for layer in per_rank]
            else:
                expected = None
        (loss * reducer.loss_scale).backward()
        reducer.finish()
        if step == 0 and expected is not None:
            for name, p, e in zip(names, params, expected, strict=True):
                tol = 1e-6 if combiner.startswith("mean") else 0.0  # mean: MPI's sum order may differ from ours
                assert torch.allclose(p.grad, e, rtol=tol, atol=tol), (name, (p.grad - e).abs().max())
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-LR)
        reducer.zero_grad()
    bad = check_sync(model, comm)
    if combiner != "none":
        assert bad == [], f"rank {r}: out of sync after {steps} steps: {bad}"
    else:
        assert n == 1 or bad, "combiner none must leave the ranks' parameters different"
    if r == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
    comm.close()
    print(f"rank {r}/{n} {backend} {combiner} {compression} OK", flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), a[3], a[4] if len(a) > 4 else "none", float(a[5]) if len(a) > 5 else 4.0)
