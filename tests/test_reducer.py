"""Tests of runtime/reducer.py: real multi-rank training under MPICH's mpiexec and torchrun (gloo).

Each worker (tests/mp_helpers/train_worker.py) itself asserts that the first step's combined gradient equals
the pure combiner (combine.mean / adasum_reduce / AdaComp decode-mean) on every rank's local gradient and
the same combiner launched on every rank simulated in one process, and that all ranks end in sync;
here we also compare ``mean`` with a single-process run on the whole batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.errors import ConfigError
from hpctrain.runtime.comm.base import SingleProcessCommunicator
from hpctrain.runtime.reducer import Reducer, broadcast_model, check_sync
from hpctrain.submission.launchers.local_launch import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mp_helpers"))
from train_worker import BATCH_PER_RANK, LR, global_batch, tiny_model  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
MPIEXEC = str(ROOT / ".venv" / "bin" / "mpiexec")
TORCHRUN = str(ROOT / ".venv" / "bin" / "torchrun")
WORKER = str(ROOT / "tests" / "mp_helpers" / "train_worker.py")
STEPS = 4


def _clean_env() -> dict[str, str]:
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "TORCHELASTIC")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _train(launcher: str, n: int, backend: str, combiner: str, out: Path, compression: str = "none",
           bucket_mb: float = 0.001) -> dict[str, torch.Tensor]:
    args = [WORKER, backend, combiner, str(STEPS), str(out), compression, str(bucket_mb)]
    if launcher == "mpiexec":
        argv = [MPIEXEC, "-n", str(n), PY, *args]
    else:
        argv = [TORCHRUN, "--nproc-per-node", str(n), "--master-port", str(free_port()), *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=_clean_env(), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stdout.count(f"{backend} {combiner} {compression} OK") == n, res.stdout
    return torch.load(out)


def _single_process_reference(n: int) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    model = tiny_model(seed=0)
    for step in range(STEPS):
        x, y = global_batch(step, n)  # the concatenation of every rank's slice
        assert x.shape[0] == n * BATCH_PER_RANK
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
    return model.state_dict()


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], tol: float) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=tol, atol=tol), (k, (got[k] - want[k]).abs().max())


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_mean_mpi_equals_single_process_on_concatenated_batch(n: int, tmp_path: Path) -> None:
    _assert_close(_train("mpiexec", n, "mpi", "mean", tmp_path / "p.pt"), _single_process_reference(n), 1e-5)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_prescaled_mean_mpi_equals_single_process_on_concatenated_batch(n: int, tmp_path: Path) -> None:
    """The trainer's mean: loss scaled by 1/n before backward, the reducer only sums (no divide pass)."""
    got = _train("mpiexec", n, "mpi", "mean_prescaled", tmp_path / "p.pt")
    _assert_close(got, _single_process_reference(n), 1e-5)


@pytest.mark.processes
def test_prescaled_mean_gloo_with_fp16_wire_stays_close(tmp_path: Path) -> None:
    got = _train("torchrun", 2, "gloo", "mean_prescaled", tmp_path / "p.pt", compression="fp16", bucket_mb=4.0)
    _assert_close(got, _single_process_reference(2), 5e-3)


@pytest.mark.processes
def test_mean_gloo_equals_single_process_on_concatenated_batch(tmp_path: Path) -> None:
    _assert_close(_train("torchrun", 2, "gloo", "mean", tmp_path / "p.pt", bucket_mb=4.0),
                  _single_process_reference(2), 1e-5)


@pytest.mark.mpi
def test_mean_with_fp16_wire_stays_close(tmp_path: Path) -> None:
    got = _train("mpiexec", 2, "mpi", "mean", tmp_path / "p.pt", compression="fp16")
    _assert_close(got, _single_process_reference(2), 5e-3)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_adasum_equals_adasum_reduce_of_gathered_grads(n: int, tmp_path: Path) -> None:
    # 2 and 4 ranks: recursive doubling (sendrecv); 3 ranks: gather-based.
    # The worker asserts bitwise equality with combine.adasum_reduce.
    _train("mpiexec", n, "mpi", "adasum", tmp_path / "p.pt")


@pytest.mark.processes
def test_adasum_gloo_two_ranks(tmp_path: Path) -> None:
    _train("torchrun", 2, "gloo", "adasum", tmp_path / "p.pt")


@pytest.mark.mpi
def test_adacomp_mpi_matches_decoded_mean(tmp_path: Path) -> None:
    _train("mpiexec", 3, "mpi", "adacomp", tmp_path / "p.pt")


@pytest.mark.mpi
def test_dasgd_leaves_gradients_local(tmp_path: Path) -> None:
    _train("mpiexec", 2, "mpi", "dasgd", tmp_path / "p.pt")


# ------------------------------------------------------------------------------------- single process


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 64)  # 16.6 KB of float32
        self.b = torch.nn.Linear(64, 64)
        self.unused = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_buckets_reverse_order_and_size_cap() -> None:
    net = _Net()
    # unused (24 B) + b (16640 B) fit under the cap, a.bias would not
    r = Reducer(net, SingleProcessCommunicator(), bucket_mb=16_700 / 2**20)
    assert [b.names for b in r.buckets] == [["unused.bias", "unused.weight", "b.bias", "b.weight"],
                                            ["a.bias", "a.weight"]]
    assert all(b.flat.is_contiguous() for b in r.buckets)


def test_grads_are_bucket_views_and_unused_param_gets_zeros() -> None:
    torch.manual_seed(0)
    net = _Net()
    ref = _Net()
    ref.load_state_dict(net.state_dict())
    r = Reducer(net, SingleProcessCommunicator(), bucket_mb=0.01)
    x = torch.randn(5, 64)
    for _ in range(2):  # second step: zero_grad keeps the views, autograd accumulates in place
        r.zero_grad()
        net(x).square().sum().backward()
        r.finish()
    ref(x).square().sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters(), strict=True):
        b, i = r._where[id(p)]
        assert p.grad.data_ptr() == b.view(i).data_ptr(), name
        if name.startswith("unused"):
            assert torch.count_nonzero(p.grad) == 0
        else:
            assert torch.allclose(p.grad, q.grad), name


def test_set_to_none_zero_grad_still_works() -> None:
    torch.manual_seed(0)
    net = _Net()
    r = Reducer(net, SingleProcessCommunicator())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(3, 64)
    opt.zero_grad(set_to_none=True)
    net(x).sum().backward()
    r.finish()
    expected = torch.autograd.grad(net(x).sum(), [net.a.weight])[0]
    assert torch.allclose(net.a.weight.grad, expected)


def test_config_errors_name_the_key() -> None:
    from hpctrain.config.job import CombinerConfig
    from hpctrain.runtime.combiners import COMBINERS, MeanCombiner, build_combiner

    net = _Net()
    c = SingleProcessCommunicator()
    params = list(net.parameters())
    with pytest.raises(ConfigError, match="train.combiner.name"):
        build_combiner(CombinerConfig.model_construct(name="sum", compression="none"), c, params)
    with pytest.raises(ConfigError, match="train.combiner.compression") as err:
        build_combiner(CombinerConfig(name="adasum", compression="fp16"), c, params)
    assert "use none with adasum" in str(err.value)
    with pytest.raises(ConfigError, match="train.combiner.compression"):
        MeanCombiner(c, params, compression="fp8")
    with pytest.raises(ConfigError, match="bucket_mb"):
        Reducer(net, c, bucket_mb=0)
    assert set(COMBINERS) == {"mean", "adasum", "adacomp", "dasgd"}


def test_broadcast_and_check_sync_single_process() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    c = SingleProcessCommunicator()
    broadcast_model(net, c)
    assert check_sync(net, c) == []


@pytest.mark.parametrize("bucket_numel", [100, 2**31])
def test_adacomp_wire_packing_round_trips_and_costs_one_integer_per_element(bucket_numel: int) -> None:
    from hpctrain.runtime import combine
    from hpctrain.runtime.combiners.adacomp import pack_adacomp, unpack_adacomp

    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(4, 6, generator=gen), torch.randn(30, generator=gen)]
    offsets, sizes = [0, 24], [24, 30]
    messages = [combine.adacomp_encode(torch.zeros_like(g), g, 5)[0] for g in grads]
    packed = pack_adacomp(messages, offsets, bucket_numel)
    assert packed.dtype == (torch.int32 if bucket_numel < 2**31 - 1 else torch.int64)
    scale_words = len(grads) * 8 // packed.element_size()
    assert packed.numel() == scale_words + sum(m.count for m in messages)
    for (pos, values), m, off, g in zip(unpack_adacomp(packed, 2, offsets, sizes), messages, offsets, grads,
                                        strict=True):
        dense = torch.zeros(g.numel(), dtype=g.dtype)
        dense[pos - off] = values.to(g.dtype)
        assert torch.equal(dense.view_as(g), combine.adacomp_decode(m))
