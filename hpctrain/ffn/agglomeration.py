"""Joining the pieces of an over-segmentation where the FFN itself says they are one object.

A flood records, for every earlier object whose voxels its FOVs predicted, how many of those voxels it
called its own (``Canvas.contacts``). Two pieces of one neurite, cut apart by a bounded flood, claim each
other's voxels near their contact; two neurites apart from a leak do not. Pieces are joined (transitively)
where that fraction reaches a threshold chosen on a training volume.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class UnionFind:
    """Disjoint sets of integer ids; the smallest id of a set is its root."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, a: int) -> int:
        root = a
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while self.parent.get(a, a) != root:  # path compression
            self.parent[a], a = root, self.parent[a]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def contact_scores(contacts: Mapping[int, Mapping[int, tuple[int, int]]],
                   min_contact: int = 100) -> dict[tuple[int, int], float]:
    """(earlier id, later id) -> the share of the earlier object's voxels seen by the later one's FOVs that it
    predicted as its own; pairs seen over fewer than ``min_contact`` voxels are left out (too little evidence)."""
    return {(int(a), int(b)): above / seen for b, seen_by in contacts.items()
            for a, (above, seen) in seen_by.items() if seen >= min_contact}


def agglomerate(seg: np.ndarray, scores: Mapping[tuple[int, int], float], threshold: float) -> np.ndarray:
    """``seg`` with the objects of every pair scoring ``>= threshold`` joined under the smallest id."""
    union = UnionFind()
    for (a, b), score in scores.items():
        if score >= threshold:
            union.union(a, b)
    if not union.parent:
        return seg
    ids = np.unique(seg)
    table = np.array([union.find(int(i)) if i > 0 else int(i) for i in ids], dtype=np.int64)
    return table[np.searchsorted(ids, seg)].astype(seg.dtype)
