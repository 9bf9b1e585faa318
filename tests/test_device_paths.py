"""Device-side reduction and backends by device (issue 14, items 2 and 4), as far as a CPU-only machine can show.

No GPU and no NCCL/RCCL/XCCL exist on CI (the CPU wheel of torch has neither nccl nor xccl). What is checked:

- the refusal a GPU site gets from this torch: one line naming the site, the backend and what to install, from
  ``make_communicator`` and through ``hpctrain run``;
- the device paths of the combiners, run over an in-process group of ranks (threads sharing a rendezvous, a
  stand-in for NCCL: it reduces the tensors it is handed where they are) under a guard that records every host
  transfer (``.numpy()``, ``.cpu()``, ``.to('cpu')``) and every tensor created without a device (which would land
  on the CPU beside a GPU bucket). On a GPU these are the copies and device mix-ups that would fail or cost.

On a machine whose torch sees a CUDA GPU (``benchmarks/device_check.py`` runs this file there) the buckets and the
rank group live on that GPU, so a CPU tensor mixed into a device bucket fails for real; the refusal tests, which
are about a torch without the backend, do not apply there and say so.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.overrides import TorchFunctionMode

from hpctrain.config.job import CombinerConfig
from hpctrain.errors import ConfigError
from hpctrain.runtime import combine, devices
from hpctrain.runtime.combiners import GradBucket, build_combiner
from hpctrain.runtime.comm.backends import make_communicator
from hpctrain.runtime.comm.base import Communicator, Handle
from hpctrain.runtime.reducer import _make_buckets
from hpctrain_bench.in_process import run_ranks as in_process

ROOT = Path(__file__).resolve().parents[1]
# Where the buckets of the combiner tests live: the GPU when this torch sees one (a device machine), else the CPU.
DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
needs_cpu_only_torch = pytest.mark.skipif(
    torch.cuda.is_available(), reason="about a torch without GPU backends; this one sees a CUDA GPU")

# --- backends by device ---------------------------------------------------------------------------------------


@needs_cpu_only_torch
@pytest.mark.parametrize(("backend", "site", "kind", "install"), [
    ("nccl", "polaris", "nvidia", "a CUDA build of torch"),
    ("nccl", "frontier", "amd", "a ROCm build of torch"),
    ("xccl", "aurora", "intel", "torch built for Intel GPUs"),
])
def test_a_torch_without_the_sites_backend_is_refused_in_one_line(backend: str, site: str, kind: str,
                                                                  install: str) -> None:
    environ = {"HPCTRAIN_SITE": site, "HPCTRAIN_GPU_KIND": kind}
    with pytest.raises(ConfigError) as info:
        make_communicator(backend, 30.0, environ)
    text = str(info.value)
    assert "\n" not in text
    assert f"site {site!r} reduces over {backend} on {kind} GPUs" in text
    assert f"torch {torch.__version__} has no {backend}" in text and install in text


@needs_cpu_only_torch
def test_backend_and_device_follow_the_gpu_kind() -> None:
    assert devices.DEVICE_TYPE == {"nccl": "cuda", "xccl": "xpu"}  # ROCm builds call AMD GPUs cuda
    assert devices.gpu_kind("xccl", {}) == "intel" and devices.gpu_kind("nccl", {"HPCTRAIN_GPU_KIND": "amd"}) == "amd"
    # No GPU here: every backend and any GPU request computes on the CPU, none fails.
    for backend in ("mpi", "gloo", "nccl", "xccl", "none"):
        assert devices.pick_device(1, backend, 3) == torch.device("cpu")
    assert not devices.backend_in_torch("nccl") and not devices.backend_in_torch("xccl")


@pytest.mark.processes
@needs_cpu_only_torch
def test_hpctrain_run_on_a_site_whose_backend_this_torch_lacks_exits_2_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "xccl-here", "model": "tests.mp_helpers.trainer_models:logged",
        "model_args": {"log_dir": str(tmp_path / "log"), "conv": False, "batch_per_rank": 2, "seed": 0},
        "train": {"steps": 1, "batch_per_rank": 2, "lr": 0.1}, "resources": {"gpus_per_rank": 1}}))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HPCTRAIN_SITE": "aurora", "HPCTRAIN_GPU_KIND": "intel",
           "HPCTRAIN_COMM_BACKEND": "xccl"}
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == ConfigError.exit_code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpctrain: error:")]
    assert len(errors) == 1 and "site 'aurora' reduces over xccl" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_device_bucket_is_reduced_where_it_is() -> None:
    """``on_device`` hands a contiguous tensor already on the backend's device over as it is (no copy)."""
    t = torch.arange(6.0)
    assert devices.on_device(t, "cpu") is t
    strided = torch.arange(12.0).reshape(3, 4).t()
    moved = devices.on_device(strided, "cpu")
    assert moved is not strided and moved.is_contiguous() and torch.equal(moved, strided)


# --- an in-process group of ranks and a guard against host copies ------------------------------------------------


class _Rendezvous:
    """What the ranks of a ThreadGroup share: one slot per rank and a barrier."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)
        self.seen: list[tuple[str, torch.device, int]] = []  # (collective, device, data_ptr) of what ranks hand in
        self.lock = threading.Lock()

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.barrier.wait()
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()
        return values


class ThreadGroup(Communicator):
    """Rank ``rank`` of an in-process group: collectives meet at a shared rendezvous and reduce the tensors they
    are given where those live (as NCCL does on the GPU); every tensor handed in is recorded."""

    def __init__(self, shared: _Rendezvous, rank: int) -> None:
        self.shared, self.rank, self.size, self.local_rank = shared, rank, shared.size, rank
        self.backend, self.timeout_s = "threads", 60.0

    def _see(self, kind: str, tensor: torch.Tensor) -> None:
        with self.shared.lock:
            self.shared.seen.append((kind, tensor.device, tensor.data_ptr()))

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        self._see("allreduce", tensor)
        values = self.shared.exchange(self.rank, tensor.clone())
        total = values[0].clone()
        for v in values[1:]:
            total.add_(v)
        tensor.copy_(total if op == "sum" else total / self.size)
        return Handle(lambda: None)

    def broadcast_(self, tensor: torch.Tensor, root: int = 0, label: str = "") -> torch.Tensor:
        tensor.copy_(self.shared.exchange(self.rank, tensor.clone())[root])
        return tensor

    def allgather(self, tensor: torch.Tensor, label: str = "") -> list[torch.Tensor]:
        self._see("allgather", tensor)
        return [v.clone() for v in self.shared.exchange(self.rank, tensor.clone())]

    def sendrecv(self, tensor: torch.Tensor, peer: int, label: str = "") -> torch.Tensor:
        self._see("sendrecv", tensor)
        return self.shared.exchange(self.rank, tensor.clone())[peer].clone()

    def barrier(self, label: str = "") -> None:
        self.shared.exchange(self.rank, None)

    def close(self) -> None:
        return None


FACTORIES = {"zeros", "ones", "empty", "full", "tensor", "arange", "rand", "randn", "as_tensor", "linspace"}


class HostGuard(TorchFunctionMode):
    """Records host transfers and tensors created without a device while it is active (in this thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in ("numpy", "cpu"):
            self.problems.append(f".{name}()")
        elif name == "to" and any(_is_cpu(a) for a in [*args[1:], kwargs.get("device")]):
            self.problems.append(".to(cpu)")
        elif name in FACTORIES and "device" not in kwargs:
            self.problems.append(f"torch.{name}() without device=")
        return func(*args, **kwargs)


def _is_cpu(value: Any) -> bool:
    return value == "cpu" or (isinstance(value, torch.device) and value.type == "cpu")


def run_ranks(size: int, body: Callable[[Communicator], Any]) -> tuple[list[Any], list[str], _Rendezvous]:
    """``body(comm)`` on ``size`` threads, each its own rank under a HostGuard: (results, problems, rendezvous)."""
    shared = _Rendezvous(size)
    results: list[Any] = [None] * size
    problems: list[str] = []
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        guard = HostGuard()
        try:
            with guard:
                results[r] = body(ThreadGroup(shared, r))
        except BaseException as exc:  # reported below, with the rank
            errors.append(exc)
            shared.barrier.abort()
        problems.extend(f"rank {r}: {p}" for p in guard.problems)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results, problems, shared


# --- the combiners on "device" buckets -------------------------------------------------------------------------


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    return list(net.to(DEVICE).parameters())


def _bucket(params: Sequence[torch.nn.Parameter], rank: int) -> GradBucket:
    """One bucket of all parameters, filled with rank-specific gradients (every rank the same layout)."""
    (bucket,) = _make_buckets([(f"layer{i}.weight" if p.dim() > 1 else f"layer{i}.bias", p)
                               for i, p in enumerate(params)], 2**30)
    generator = torch.Generator().manual_seed(100 + rank)
    with torch.no_grad():
        # Drawn on the CPU (the generator's device) and copied into the bucket: the same numbers on any device.
        bucket.flat.copy_(torch.randn(bucket.flat.numel(), generator=generator, device="cpu"))
    return bucket


def _reduce(name: str, size: int, **config: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], list[str],
                                                          _Rendezvous]:
    """Every rank's bucket before and after its combiner's ``launch`` (completed), and what the guard saw."""
    params = _params()
    inputs = [_bucket(params, r).flat.clone() for r in range(size)]

    def body(comm: Communicator) -> torch.Tensor:
        bucket = _bucket(params, comm.rank)
        combiner = build_combiner(CombinerConfig(name=name, **config), comm, params)
        handle = combiner.launch(bucket, blocking=False)
        if handle is not None:
            handle.wait()
        return bucket.flat

    outputs, problems, shared = run_ranks(size, body)
    return inputs, outputs, problems, shared


@pytest.mark.parametrize("size", [2, 3])
def test_mean_reduces_the_bucket_itself_with_no_host_copy(size: int) -> None:
    inputs, outputs, problems, shared = _reduce("mean", size)
    assert problems == []
    assert {out.device.type for out in outputs} == {DEVICE.type}  # on a GPU machine the buckets are on the GPU
    want = sum(inputs[1:], inputs[0].clone())  # prescaled, as the trainer runs it: the loss was scaled by 1/ranks
    for out in outputs:
        torch.testing.assert_close(out, want)
    # The tensor handed to the collective is the bucket's own buffer: reduced in place, where it lives.
    handed = {ptr for kind, _, ptr in shared.seen if kind == "allreduce"}
    assert handed == {out.data_ptr() for out in outputs}


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_half_precision_wire_stays_on_the_buckets_device(wire: str) -> None:
    inputs, outputs, problems, shared = _reduce("mean", 2, compression=wire)
    assert problems == []
    assert {device for _, device, _ in shared.seen} == {outputs[0].device}
    assert {kind for kind, _, _ in shared.seen} == {"allreduce"}
    want = inputs[0] + inputs[1]  # prescaled: the sum of the ranks' shares
    for out in outputs:
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("size", [2, 4, 3])
def test_adasum_on_device_buckets_equals_the_pure_reduction(size: int) -> None:
    inputs, outputs, problems, _ = _reduce("adasum", size, adasum_on="gradient")
    assert problems == []
    params = _params()
    layers = [_bucket(params, 0).with_flat(t) for t in inputs]
    for i in range(len(params)):
        want = combine.adasum_reduce([b.views[i] for b in layers])
        for out in outputs:
            torch.testing.assert_close(layers[0].with_flat(out).views[i], want, rtol=1e-6, atol=1e-6)


def test_adacomp_messages_are_built_and_decoded_on_the_buckets_device() -> None:
    inputs, outputs, problems, shared = _reduce("adacomp", 2)
    assert problems == []  # the packed message, the gather's padding and the decoded mean: all on the device
    assert {device for _, device, _ in shared.seen} == {outputs[0].device}
    params = _params()
    buckets = [_bucket(params, r) for r in range(2)]  # the same ranks' buckets on the host, in one process
    in_process(2, lambda r, comm: build_combiner(CombinerConfig(name="adacomp"), comm, params).launch(buckets[r], True))
    for out in outputs:
        torch.testing.assert_close(out, buckets[0].flat)


def test_dasgd_average_stays_on_the_device() -> None:
    params = _params()

    def body(comm: Communicator) -> list[torch.Tensor]:
        mine = [torch.full_like(p, float(comm.rank)) for p in params]
        combiner = build_combiner(CombinerConfig(name="dasgd", period=1, delay=0), comm, mine)
        return list(combiner.averager.start_average([t.detach().clone() for t in mine]).wait())

    results, problems, _ = run_ranks(2, body)
    assert problems == []
    for tensors in results:
        assert all(torch.equal(t, torch.full_like(t, 0.5)) for t in tensors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run by benchmarks/device_check.py "
                    "on a device machine (CI has none)")
def test_nccl_reduces_a_device_bucket_in_place() -> None:
    """A real NCCL communicator (one rank: NCCL refuses two ranks on one GPU) through ``make_communicator``:
    the bucket's own device buffer is reduced where it is, synchronously and asynchronously."""
    comm = make_communicator("nccl", 60.0, {"HPCTRAIN_SITE": "polaris", "HPCTRAIN_GPU_KIND": "nvidia"})
    try:
        params = _params()
        bucket = _bucket(params, 0)
        before, pointer = bucket.flat.clone(), bucket.flat.data_ptr()
        comm.allreduce_(bucket.flat, "sum", "check")
        comm.allreduce_async_(bucket.flat, "sum", "check").wait()
        torch.cuda.synchronize()
        assert bucket.flat.device.type == "cuda" and bucket.flat.data_ptr() == pointer
        torch.testing.assert_close(bucket.flat, before)  # one rank: the sum is the rank's own
        combiner = build_combiner(CombinerConfig(name="mean", compression="bf16"), comm, params)
        handle = combiner.launch(bucket, blocking=False)
        if handle is not None:
            handle.wait()
        torch.testing.assert_close(bucket.flat, before, rtol=1e-2, atol=1e-2)
    finally:
        comm.close()


def test_the_guard_catches_what_it_is_for() -> None:
    """Not vacuous: the guard flags a host copy and a device-less allocation."""
    x, residue, grad = torch.ones(3), torch.zeros(3), torch.ones(3)
    guard = HostGuard()
    with guard:
        x.numpy()
        x.to("cpu")
        torch.zeros(2)
        combine.adacomp_decode(combine.adacomp_encode(residue, grad, 2)[0])  # device-clean: adds nothing
    assert guard.problems == [".numpy()", ".to(cpu)", "torch.zeros() without device="]
