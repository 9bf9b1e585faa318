"""Seeded permutations of ``range(n)`` evaluated at any index, so a rank computes only its own share of an epoch.

A balanced Feistel network over the smallest even number of bits that covers ``n``, made a bijection of
``[0, n)`` by cycle walking (an image outside the range is encrypted again until it falls inside). Cost per
index: a few vectorised integer rounds; nothing of size ``n`` is ever built, unlike ``randperm(n)``.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6  # Luby-Rackoff: 4 rounds of a pseudo-random function already give a pseudo-random permutation
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic): a well-spread 64-bit hash."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def derive_key(*parts: int) -> int:
    """One 64-bit key from several non-negative integers (seed, epoch, ...), order-sensitive."""
    state = np.zeros(1, dtype=np.uint64)
    for part in parts:
        state = _mix(state ^ np.array([int(part) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
                     + np.uint64(0x9E3779B97F4A7C15))
    return int(state[0])


class IndexPermutation:
    """A bijection of ``[0, n)`` fixed by ``key``; ``perm[i]`` for an array (or int) of positions ``i``.

    ``inverse`` maps images back to positions. Both run in time proportional to the number of indices asked.
    """

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError(f"a permutation needs at least one element, got n={n}")
        self.n = int(n)
        self._half = max(1, ((self.n - 1).bit_length() + 1) // 2)
        self._mask = np.uint64((1 << self._half) - 1)
        keys = np.arange(ROUNDS, dtype=np.uint64) + np.uint64(1)
        self._keys = _mix(keys * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(int(key) & 0xFFFFFFFFFFFFFFFF))

    def _round(self, half: np.ndarray, i: int) -> np.ndarray:
        return _mix(half ^ self._keys[i]) & self._mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self._half)
        left, right = x >> shift, x & self._mask
        for i in range(ROUNDS):
            left, right = right, left ^ self._round(right, i)
        return (left << shift) | right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self._half)
        left, right = x >> shift, x & self._mask
        for i in reversed(range(ROUNDS)):
            left, right = right ^ self._round(left, i), left
        return (left << shift) | right

    def _walk(self, positions: np.ndarray | int, step: object) -> np.ndarray:
        given = np.asarray(positions, dtype=np.int64)
        x = given.reshape(-1)  # 1-d even for one position: numpy scalars neither wrap silently nor take assignment
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        out = step(x.astype(np.uint64))  # type: ignore[operator]
        outside = out >= np.uint64(self.n)
        while outside.any():  # the domain has fewer than 4n points: under 4 walks expected
            out[outside] = step(out[outside])  # type: ignore[operator]
            outside = out >= np.uint64(self.n)
        return out.astype(np.int64).reshape(given.shape)

    def __getitem__(self, positions: np.ndarray | int) -> np.ndarray:
        return self._walk(positions, self._encrypt)

    def inverse(self, images: np.ndarray | int) -> np.ndarray:
        return self._walk(images, self._decrypt)


def epoch_permutation(n: int, seed: int, epoch: int) -> IndexPermutation:
    """The permutation of epoch ``epoch`` of ``n`` samples under ``seed`` (the same on every rank)."""
    return IndexPermutation(n, derive_key(seed, epoch))
