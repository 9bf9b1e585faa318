"""Worker for tests/test_reducer.py, run under mpiexec or torchrun.

``python train_worker.py BACKEND COMBINER STEPS OUT [COMPRESSION] [BUCKET_MB]``: trains ``tiny_model()`` with the
Reducer and a combiner strategy on this rank's slice of a fixed global batch. At the first step it checks the combined
gradient twice: against the pure combiner (combine.mean / adasum_reduce / AdaComp decode-mean) applied to every rank's
local gradient, and against the same strategy's ``launch`` on every rank simulated in this one process
(hpctrain_bench/in_process.py: the simulation equals the real ranks). It checks the ranks stay in sync, and rank 0 saves
the final parameters to OUT. COMBINER ``mean_prescaled`` is the mean as the trainer uses it: the loss is scaled by
``reducer.loss_scale`` before backward and the reducer only sums. ``dasgd`` with a period longer than the run leaves
every gradient local.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.config.job import CombinerConfig  # noqa: E402
from hpctrain.runtime import combine  # noqa: E402
from hpctrain.runtime.combiners import Combiner, GradBucket, MeanCombiner, build_combiner  # noqa: E402
from hpctrain.runtime.comm.backends import make_communicator  # noqa: E402
from hpctrain.runtime.comm.base import Communicator  # noqa: E402
from hpctrain.runtime.reducer import Reducer, broadcast_model, check_sync  # noqa: E402
from hpctrain_bench.in_process import InProcessComm, InProcessGroup  # noqa: E402

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


def make_combiner(name: str, comm: Communicator, params: list[torch.Tensor], compression: str) -> Combiner:
    if name.startswith("mean"):
        return MeanCombiner(comm, params, compression=compression, prescaled=name == "mean_prescaled")
    config = CombinerConfig(name=name, adasum_on="gradient", period=1000, delay=0)
    return build_combiner(config, comm, params)


def simulated(reducer: Reducer, combiner: str, compression: str, per_rank: list[list[torch.Tensor]],
              params: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every bucket launched by one simulated rank per rank, in one process: id(param) -> the gradient this
    rank's simulated twin ends with. ``per_rank[layer][rank]`` are the ranks' local gradients."""
    n = len(per_rank[0])
    group = InProcessGroup(n)
    workers = [make_combiner(combiner, InProcessComm(group, k), params, compression) for k in range(n)]
    grads = {id(p): layer for p, layer in zip(params, per_rank, strict=True)}
    mine: dict[int, torch.Tensor] = {}
    for b in reducer.buckets:
        buckets = [b.with_flat(torch.zeros_like(b.flat)) for _ in range(n)]
        for i, p in enumerate(b.params):
            for k in range(n):
                buckets[k].views[i].copy_(grads[id(p)][k])
        group.run(lambda k, buckets=buckets: _launch(workers[k], buckets[k]))
        for i, p in enumerate(b.params):
            mine[id(p)] = buckets[reducer.comm.rank].views[i].clone()
    return mine


def _launch(combiner: Combiner, bucket: GradBucket) -> None:
    handle = combiner.launch(bucket, blocking=True)
    if handle is not None:
        handle.wait()


def main(backend: str, combiner: str, steps: int, out: str, compression: str, bucket_mb: float) -> None:
    torch.set_num_threads(1)
    comm = make_communicator(backend, timeout_s=60)
    r, n = comm.rank, comm.size
    model = tiny_model(seed=r)  # different on purpose: broadcast_model must fix it
    assert n == 1 or check_sync(model, comm), "ranks start different, check_sync must see it"
    broadcast_model(model, comm)
    assert check_sync(model, comm) == [], "after broadcast_model the ranks must agree"
    prescaled = combiner == "mean_prescaled"
    params = [p for p in model.parameters()]
    names = [name for name, _ in model.named_parameters()]
    reducer = Reducer(model, comm, make_combiner(combiner, comm, params, compression), bucket_mb=bucket_mb)
    assert reducer.loss_scale == (1.0 / n if prescaled else 1.0)
    assert bucket_mb > 0.01 or len(reducer.buckets) > 1, "tiny bucket_mb must give several buckets"
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
            elif combiner == "dasgd":
                expected = list(local)  # each rank keeps its own gradient
            else:
                expected = None
            scaled = torch.autograd.grad(loss * reducer.loss_scale, params, retain_graph=True)
            simulation = simulated(reducer, combiner, compression, [comm.allgather(g) for g in scaled], params)
        (loss * reducer.loss_scale).backward()
        reducer.finish()
        if step == 0:
            tol = 1e-6 if combiner.startswith("mean") else 0.0  # mean: MPI's sum order may differ from ours
            for name, p in zip(names, params, strict=True):
                sim = simulation[id(p)]
                assert torch.allclose(p.grad, sim, rtol=tol, atol=tol), ("simulation", name, (p.grad - sim).abs().max())
            for name, p, e in zip(names, params, expected or [], strict=False):
                assert torch.allclose(p.grad, e, rtol=tol, atol=tol), (name, (p.grad - e).abs().max())
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-LR)
        reducer.zero_grad()
    bad = check_sync(model, comm)
    if combiner != "dasgd":
        assert bad == [], f"rank {r}: out of sync after {steps} steps: {bad}"
    else:
        assert n == 1 or bad, "dasgd before its first average must leave the ranks' parameters different"
    if r == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
    comm.close()
    print(f"rank {r}/{n} {backend} {combiner} {compression} OK", flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), a[3], a[4] if len(a) > 4 else "none", float(a[5]) if len(a) > 5 else 4.0)
