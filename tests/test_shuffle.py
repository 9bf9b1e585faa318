"""models/shuffle.py and the rank streams built on it: a bijection evaluated at one rank's positions only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpctrain.models import shuffle
from hpctrain.models.shuffle import IndexPermutation, derive_key, epoch_permutation
from hpctrain.models.task import ShardedIndexStream


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 17, 64, 1000, 4097])
def test_permutation_is_a_bijection_with_an_inverse(n: int) -> None:
    perm = epoch_permutation(n, seed=11, epoch=2)
    images = perm[np.arange(n)]
    assert sorted(images.tolist()) == list(range(n))
    assert np.array_equal(perm.inverse(images), np.arange(n))
    assert int(perm[n - 1]) == int(images[-1])  # a scalar position gives the same image as in the array


def test_permutation_depends_on_seed_and_epoch_and_is_reproducible() -> None:
    n = 500
    base = epoch_permutation(n, 1, 0)[np.arange(n)]
    assert np.array_equal(base, epoch_permutation(n, 1, 0)[np.arange(n)])
    assert not np.array_equal(base, epoch_permutation(n, 1, 1)[np.arange(n)])
    assert not np.array_equal(base, epoch_permutation(n, 2, 0)[np.arange(n)])
    assert derive_key(1, 2) != derive_key(2, 1)


def test_positions_are_spread_evenly_over_many_epochs() -> None:
    """Each (position, image) pair of an 8-element permutation is about equally frequent over 8000 epochs."""
    n, epochs = 8, 8000
    counts = np.zeros((n, n))
    for epoch in range(epochs):
        counts[np.arange(n), epoch_permutation(n, 3, epoch)[np.arange(n)]] += 1
    expected = epochs / n
    # 5 standard deviations of a binomial(8000, 1/8) count: fixed seeds, so this is a fixed outcome anyway
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected * (1 - 1 / n))


def test_out_of_range_positions_are_refused() -> None:
    perm = IndexPermutation(10, 0)
    with pytest.raises(IndexError):
        perm[np.array([10])]
    with pytest.raises(ValueError):
        IndexPermutation(0, 0)


def test_the_streams_deal_the_epoch_permutation() -> None:
    count, world, b = 60, 3, 4
    ranks = [ShardedIndexStream(count, b, r, world, seed=5) for r in range(world)]
    dealt = torch.stack([torch.cat([s.next() for s in ranks]) for _ in range(count // (world * b))])
    # step s takes the positions s*W*b .. (s+1)*W*b of epoch 0's permutation, each rank every W-th of them
    order = epoch_permutation(count, 5, 0)[np.arange(count)]  # the whole of epoch 0's permutation
    for s, row in enumerate(dealt):
        assert sorted(row.tolist()) == sorted(order[s * world * b:(s + 1) * world * b].tolist())
    assert sorted(dealt.flatten().tolist()) == list(range(count))


def test_a_rank_evaluates_only_its_own_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """O(count / world) per rank per epoch: the permutation is never asked for more than a batch at once."""
    asked: list[int] = []
    original = shuffle.IndexPermutation.__getitem__

    def spy(self: IndexPermutation, positions: np.ndarray | int) -> np.ndarray:
        asked.append(int(np.asarray(positions).size))
        return original(self, positions)

    monkeypatch.setattr(shuffle.IndexPermutation, "__getitem__", spy)
    count, world, b = 10_000, 8, 5
    stream = ShardedIndexStream(count, b, 3, world, seed=0)
    taken = [int(i) for _ in range(count // (world * b)) for i in stream.next()]
    assert len(taken) == len(set(taken)) == count // world
    assert asked and max(asked) == b and sum(asked) == count // world
