"""Tests of runtime/combiners/: the strategies on K ranks in one process (hpctrain_bench/in_process.py), as a
simulation of K workers drives them.

Each rank's ``launch`` must give what the pure maths (runtime/combine.py, tested against float64 references in
tests/test_combine.py) gives on the same per-rank gradients; tests/mp_helpers/train_worker.py checks that real
ranks give what the in-process ranks give.
"""

from __future__ import annotations

import typing

import pytest
import torch

from hpctrain.config.job import CombinerConfig
from hpctrain.errors import CheckpointError, RuntimeFailure
from hpctrain.runtime import combine
from hpctrain.runtime.combiners import (
    COMBINERS,
    AdaCompCombiner,
    Combiner,
    DaSGDCombiner,
    GradBucket,
    build_combiner,
)
from hpctrain.runtime.comm.base import Handle, SingleProcessCommunicator
from hpctrain.runtime.reducer import Reducer
from hpctrain_bench.in_process import InProcessComm, InProcessGroup


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 3, 3)
        self.fc = torch.nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


def _layout() -> tuple[list[torch.Tensor], list[GradBucket]]:
    """Parameters and bucket layouts of _Net (several buckets), from a single-process reducer."""
    net = _Net()
    reducer = Reducer(net, SingleProcessCommunicator(), bucket_mb=100 / 2**20)
    assert len(reducer.buckets) > 1
    return reducer.params, list(reducer.buckets)


def _workers(name: str, k: int, params: list[torch.Tensor], **config: typing.Any) -> list[Combiner]:
    """One combiner per rank of a fresh in-process group of ``k``."""
    group = InProcessGroup(k)
    return [build_combiner(CombinerConfig(name=name, **config), InProcessComm(group, r), params) for r in range(k)]


def _launch(combiner: Combiner, bucket: GradBucket) -> None:
    handle = combiner.launch(bucket, blocking=True)
    if handle is not None:
        handle.wait()


def _combine(workers: list[Combiner], buckets: list[GradBucket]) -> None:
    """Every rank launches its bucket (``buckets[r]``), as the reducer does: it ends holding what rank r's would."""
    comm = workers[0].comm
    assert isinstance(comm, InProcessComm)
    comm.group.run(lambda r: _launch(workers[r], buckets[r]))


def _random_buckets(template: GradBucket, k: int, seed: int) -> list[GradBucket]:
    gen = torch.Generator().manual_seed(seed)
    return [template.with_flat(torch.randn(template.flat.shape, generator=gen)) for _ in range(k)]


def test_registry_is_the_job_schema() -> None:
    assert set(COMBINERS) == {"mean", "adasum", "adacomp", "dasgd"}
    assert all(cls.name == name for name, cls in COMBINERS.items())
    assert CombinerConfig(name="adasum").name == "adasum"
    with pytest.raises(ValueError, match="no gradient combiner named 'adam'; known: adacomp, adasum, dasgd, mean"):
        CombinerConfig(name="adam")


@pytest.mark.parametrize("k", [1, 3, 4])
def test_simulated_workers_equal_the_pure_combiners(k: int) -> None:
    params, layout = _layout()
    for seed, template in enumerate(layout):
        given = _random_buckets(template, k, seed)
        per_layer = [[b.views[i].clone() for b in given] for i in range(len(template.params))]

        mean = [b.with_flat(b.flat.clone()) for b in given]
        # the trainer's prescaled mean: each worker's bucket is its share of the mean already
        for b in mean:
            b.flat.div_(k)
        _combine(_workers("mean", k, params), mean)
        for i, layer in enumerate(per_layer):
            for b in mean:
                torch.testing.assert_close(b.views[i], combine.mean(layer), rtol=1e-6, atol=1e-6)

        adasum = [b.with_flat(b.flat.clone()) for b in given]
        workers = _workers("adasum", k, params, adasum_on="gradient")
        _combine(workers, adasum)
        for i, layer in enumerate(per_layer):
            assert all(torch.equal(b.views[i], combine.adasum_reduce(layer)) for b in adasum)

        adacomp = [b.with_flat(b.flat.clone()) for b in given]
        workers = _workers("adacomp", k, params, bin_len={"conv": 3, "linear": 5})
        _combine(workers, adacomp)
        for i, (name, p) in enumerate(zip(template.names, template.params, strict=True)):
            bin_len = 3 if combine.layer_kind(name, p.dim()) == "conv" else 5
            decoded = [combine.adacomp_decode(combine.adacomp_encode(torch.zeros_like(g), g, bin_len)[0])
                       for g in per_layer[i]]
            assert all(torch.equal(b.views[i], combine.mean(decoded)) for b in adacomp)

        local = [b.with_flat(b.flat.clone()) for b in given]
        workers = _workers("dasgd", k, params)
        _combine(workers, local)
        assert all(torch.equal(a.flat, b.flat) for a, b in zip(local, given, strict=True))


def test_ranks_that_make_different_collective_calls_fail_with_a_message() -> None:
    params, layout = _layout()
    group = InProcessGroup(2)
    workers = [build_combiner(CombinerConfig(name=name), InProcessComm(group, r), params)
               for r, name in enumerate(("mean", "adacomp"))]
    with pytest.raises(RuntimeFailure, match="rank 1 called allgather where another called allreduce"):
        _combine(workers, _random_buckets(layout[0], 2, 0))


def test_adacomp_takes_the_bin_length_of_each_layer_kind_from_the_config() -> None:
    params, layout = _layout()
    mine = build_combiner(CombinerConfig(name="adacomp", bin_len={"conv": 4, "linear": 7}),
                          SingleProcessCommunicator(), params)
    paper = build_combiner(CombinerConfig(name="adacomp", bin_len={}), SingleProcessCommunicator(), params)
    assert isinstance(mine, AdaCompCombiner) and isinstance(paper, AdaCompCombiner)
    assert (mine.bin_len_for("conv.weight", 3), mine.bin_len_for("fc.weight", 2)) == (4, 7)
    assert (paper.bin_len_for("conv.weight", 3), paper.bin_len_for("fc.weight", 2)) == (50, 500)
    # what goes on the wire follows it: the packed message is what adacomp_encode makes with these lengths
    bucket = _random_buckets(layout[0], 1, 5)[0]
    packed = mine.encode(bucket.with_flat(bucket.flat.clone()))
    messages = [combine.adacomp_encode(torch.zeros_like(v), v.clone(), mine.bin_len_for(n, p.dim()))[0]
                for n, p, v in zip(bucket.names, bucket.params, bucket.views, strict=True)]
    from hpctrain.runtime.combiners.adacomp import pack_adacomp

    assert torch.equal(packed, pack_adacomp(messages, bucket.offsets, bucket.flat.numel()))


def test_adacomp_residues_resume_exactly_and_refuse_another_bucket_layout() -> None:
    params, layout = _layout()

    def steps(workers: list[Combiner], seeds: range) -> list[torch.Tensor]:
        out = []
        for seed in seeds:
            for template in layout:
                buckets = _random_buckets(template, len(workers), seed)
                _combine(workers, buckets)
                out.append(buckets[0].flat)
        return out

    straight = _workers("adacomp", 2, params)
    want = steps(straight, range(4))
    first = _workers("adacomp", 2, params)
    steps(first, range(2))
    saved = [w.state_dict() for w in first]
    assert len(saved[0]["residues"]) == len(layout) and any(t.abs().sum() > 0 for t in saved[0]["residues"][0])
    resumed = _workers("adacomp", 2, params)
    for w, state in zip(resumed, saved, strict=True):
        w.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(steps(resumed, range(2, 4)), want[2 * len(layout):], strict=True))

    net = _Net()
    other = build_combiner(CombinerConfig(name="adacomp"), SingleProcessCommunicator(), list(net.parameters()))
    other.load_state_dict(saved[0])
    with pytest.raises(CheckpointError, match=f"residues for {len(layout)} buckets, this run has 1"):
        Reducer(net, SingleProcessCommunicator(), other, bucket_mb=4.0)


def test_dasgd_workers_average_with_a_delay() -> None:
    """Period 2, delay 1, each worker r adds r + 1 per local step: sent after step 2, merged after step 3,
    sent again after step 4 and merged by flush(), where every worker holds that average exactly."""
    k, group = 3, InProcessGroup(3)
    params = [[torch.full((2,), float(r)), torch.full((3,), 10.0 * r)] for r in range(k)]
    workers = [DaSGDCombiner(InProcessComm(group, r), params[r], period=2, delay=1) for r in range(k)]

    def local_step(r: int) -> None:
        for p in params[r]:
            p.add_(r + 1.0)
        workers[r].after_step()

    for step in range(1, 5):
        group.run(local_step)
        if step == 3:  # merged: the average of step 2 (5 and 14) plus the progress since (r + 1)
            assert [float(params[r][0][0]) for r in range(k)] == [6.0, 7.0, 8.0]
            assert [float(params[r][1][0]) for r in range(k)] == [15.0, 16.0, 17.0]
    group.run(lambda r: workers[r].flush())
    assert all(torch.equal(params[r][0], torch.full((2,), 9.0)) for r in range(k))
    assert all(torch.equal(params[r][1], torch.full((3,), 18.0)) for r in range(k))
    assert not any(w.ranks_in_sync for w in workers)


def test_a_new_combiner_is_one_class_the_reducer_calls_per_bucket() -> None:
    class Halve(Combiner):
        """A toy: every bucket is halved, here and in a simulation alike."""

        name = "halve"
        launched: list[int] = []

        @classmethod
        def from_config(cls, config: typing.Any, comm: typing.Any, params: typing.Any) -> Combiner:
            return cls(comm, params)

        def launch(self, bucket: GradBucket, blocking: bool) -> Handle | None:
            self.launched.append(bucket.index)
            return Handle(lambda: bucket.flat.mul_(0.5))

    net = _Net()
    reducer = Reducer(net, SingleProcessCommunicator(), Halve(SingleProcessCommunicator(), net.parameters()),
                      bucket_mb=100 / 2**20)
    x = torch.randn(5, 2, 6)  # conv: 3 channels x 4 = the 12 inputs of fc
    net(x).square().sum().backward()
    reducer.finish()
    want = torch.autograd.grad(net(x).square().sum(), list(net.parameters()))
    assert all(torch.allclose(p.grad, 0.5 * g) for p, g in zip(net.parameters(), want, strict=True))
    assert Halve.launched == list(range(len(reducer.buckets)))
    # and the same class, unchanged, on simulated ranks
    group = InProcessGroup(2)
    buckets = _random_buckets(reducer.buckets[0], 2, 3)
    given = [b.flat.clone() for b in buckets]
    _combine([Halve(InProcessComm(group, r), net.parameters()) for r in range(2)], buckets)
    assert all(torch.equal(b.flat, 0.5 * g) for b, g in zip(buckets, given, strict=True))
