"""Joining the pieces of an over-segmentation where the FFN itself says, from both sides, that they are one object.

Floods bounded in size (``max_seed_distance``) cut a neurite into pieces, and a flood that leaks through a faint
membrane takes only a piece of the neighbour. For every two pieces A and B that come within a few voxels of each
other, the FFN is run from a bare seed inside A close to B, and from a bare seed inside B close to A (google/ffn's
agglomeration runs the FFN from both segments of a pair in the same way). Each run says which share of the other
piece's voxels in its FOV it claims; the pair is joined (transitively) when both shares reach a threshold. Two
pieces of one neurite claim each other nearly whole; two neurites apart claim little, and a leak that goes one way
is not a join. The bare-seed answer is the FFN's best-trained skill (docs/ffn.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from hpctrain.ffn.movement import Position


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


def axis_neighbours(seg: np.ndarray, reach: int,
                    counted: Sequence[int] | None = None) -> Iterator[tuple[int, int, tuple[slice, ...],
                                                                             np.ndarray, np.ndarray]]:
    """Every two voxels of different objects (> 0) ``d`` = 1 … ``reach`` apart along an axis: for each axis and
    ``d``, (axis, d, the lower voxels' box, the touching mask over it, the keys ``min(a, b) · n + max(a, b)`` with
    n = seg.max() + 1). The upper voxels' box is the lower one moved by ``d`` along ``axis``. ``counted`` (a shape):
    only pairs whose lower voxel lies in ``seg[:counted[0], :counted[1], :counted[2]]``."""
    n = int(seg.max(initial=0)) + 1
    limit = [int(c) for c in counted] if counted is not None else list(seg.shape)
    for axis in range(3):
        for d in range(1, reach + 1):
            if seg.shape[axis] <= d:
                continue
            lo = [slice(0, min(c, s)) for c, s in zip(limit, seg.shape, strict=True)]
            hi = list(lo)
            stop = min(limit[axis], seg.shape[axis] - d)
            lo[axis], hi[axis] = slice(0, stop), slice(d, stop + d)
            a, b = seg[tuple(lo)], seg[tuple(hi)]
            touch = (a > 0) & (b > 0) & (a != b)
            a, b = a[touch].astype(np.int64), b[touch].astype(np.int64)
            yield axis, d, tuple(lo), touch, np.minimum(a, b) * n + np.maximum(a, b)


def contact_pairs(seg: np.ndarray, reach: int = 3, min_voxels: int = 20,
                  counted: Sequence[int] | None = None) -> dict[tuple[int, int], int]:
    """(smaller id, larger id) -> how many voxel pairs of the two objects lie within ``reach`` voxels of each
    other along an axis (a membrane is 2 voxels: neighbours across it count); pairs under ``min_voxels`` left out.
    ``counted`` (a shape): only voxel pairs whose first (lower) voxel lies in ``seg[:counted[0], :counted[1],
    :counted[2]]`` count, so pieces that each pass their core plus ``reach`` voxels beyond it count every voxel
    pair of the whole volume exactly once between them."""
    n = int(seg.max(initial=0)) + 1
    keys = [k for *_, k in axis_neighbours(seg, reach, counted)]
    if not keys:
        return {}
    found, counts = np.unique(np.concatenate(keys), return_counts=True)
    return {(int(k // n), int(k % n)): int(c) for k, c in zip(found, counts, strict=True) if c >= min_voxels}


Box = tuple[slice, ...]


def object_boxes(seg: np.ndarray) -> dict[int, Box]:
    """id -> the bounding box of that object of ``seg`` (ids > 0 that occur), from one pass over the volume."""
    from scipy import ndimage

    return {i: box for i, box in enumerate(ndimage.find_objects(seg), start=1) if box is not None}


DistanceCache = dict[tuple[int, int], tuple[Box, np.ndarray]]


def _distance_to(seg: np.ndarray, target: int, far: int, boxes: Mapping[int, Box],
                 cache: DistanceCache | None) -> tuple[Box, np.ndarray] | None:
    """(the box of ``target`` grown by ``far`` + 1, each voxel's distance to ``target`` there); ``cache`` keeps it
    for every other pair with the same target (each piece is the target of as many pairs as it has neighbours)."""
    from scipy import ndimage

    if cache is not None and (target, far) in cache:
        return cache[(target, far)]
    target_box = boxes.get(target)
    if target_box is None:
        return None
    grow = far + 1
    box = tuple(slice(max(s.start - grow, 0), min(s.stop + grow, n)) for s, n in zip(target_box, seg.shape,
                                                                                        strict=True))
    found = (box, ndimage.distance_transform_edt(seg[box] != target))
    if cache is not None:
        cache[(target, far)] = found
    return found


def seed_positions(seg: np.ndarray, source: int, target: int, margin: Sequence[int], *, count: int = 3,
                   near: int = 2, far: int = 5, boxes: Mapping[int, Box] | None = None,
                   distances: DistanceCache | None = None) -> list[Position]:
    """Up to ``count`` voxels of object ``source`` between ``near`` and ``far`` voxels from object ``target``,
    closest to where the two meet and spread apart, whose FOV (``margin`` = fov // 2) lies inside the volume.
    ``boxes``: ``object_boxes(seg)`` when the caller asks for many pairs (computed here otherwise); ``distances``:
    a dict kept between calls on the same ``seg``, so each target's distance transform is computed once."""
    found = _distance_to(seg, target, far, boxes if boxes is not None else object_boxes(seg), distances)
    if found is None:
        return []
    box, dist = found
    local = seg[box]
    candidates = np.argwhere((local == source) & (dist >= near) & (dist <= far))
    if len(candidates) == 0:
        return []
    candidates += np.array([s.start for s in box])
    m = np.asarray(margin)
    inside = np.all((candidates >= m) & (candidates < np.asarray(seg.shape) - m), axis=1)
    candidates = candidates[inside]
    if len(candidates) == 0:
        return []
    centre = candidates.mean(axis=0)
    candidates = candidates[np.argsort(((candidates - centre) ** 2).sum(axis=1), kind="stable")[: 20 * count]]
    picked = [candidates[0]]
    while len(picked) < min(count, len(candidates)):  # the farthest from those picked: spread along the contact
        gap = np.min([((candidates - p) ** 2).sum(axis=1) for p in picked], axis=0)
        picked.append(candidates[int(np.argmax(gap))])
    return [(int(p[0]), int(p[1]), int(p[2])) for p in picked]


def mutual_claims(seg: np.ndarray, predict_bare: Callable[[list[Position]], np.ndarray], fov: Sequence[int],
                  claim_logit: float, pairs: Sequence[tuple[int, int]], *, positions: int = 4,
                  min_seen: int = 30) -> dict[tuple[int, int], float]:
    """(a, b) -> the smaller of the two shares: of b's voxels in the FOV of a bare seed inside a, those the FFN
    claims (logit >= ``claim_logit``), averaged over up to ``positions`` seeds near b; and the same from b. A
    direction with no seed position, or whose FOVs hold fewer than ``min_seen`` voxels of the other, gives the
    pair no score (it is not joined). ``predict_bare(positions)`` returns the FFN's logits, (n, *fov)."""
    margin = [f // 2 for f in fov]
    boxes = object_boxes(seg) if pairs else {}
    distances: DistanceCache = {}
    jobs: list[tuple[int, int, Position]] = []  # (pair index, direction, seed position)
    for i, (a, b) in enumerate(pairs):
        for direction, (source, target) in enumerate(((a, b), (b, a))):
            jobs += [(i, direction, pos)
                     for pos in seed_positions(seg, source, target, margin, count=positions, boxes=boxes,
                                                distances=distances)]
    shares: dict[tuple[int, int], list[float]] = {}
    if jobs:
        logits = predict_bare([pos for _, _, pos in jobs])
        for (i, direction, pos), out in zip(jobs, logits, strict=True):
            box = tuple(slice(p - m, p + m + 1) for p, m in zip(pos, margin, strict=True))
            target = pairs[i][1 - direction]
            other = seg[box] == target
            if int(other.sum()) >= min_seen:
                shares.setdefault((i, direction), []).append(float(np.mean(out[other] >= claim_logit)))
    scores = {}
    for i, pair in enumerate(pairs):
        one, two = shares.get((i, 0)), shares.get((i, 1))
        if one and two:
            scores[(int(pair[0]), int(pair[1]))] = min(float(np.mean(one)), float(np.mean(two)))
    return scores


LINKAGES = ("single", "average")


def join_groups(scores: Mapping[tuple[int, int], float], threshold: float, linkage: str = "single") -> UnionFind:
    """Which pieces become one object, from the scores of the pairs in contact.

    ``single``: every pair scoring ``>= threshold`` is joined, transitively (one high score joins two objects
    whatever else their pieces say). ``average``: groups are joined best first while the *mean* score of the
    pairs between two groups is ``>= threshold`` (average-linkage agglomeration): a group is one object's pieces
    so far, and one leaky pair among several low-scoring ones between two large groups does not join them.
    """
    if linkage not in LINKAGES:
        raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
    union = UnionFind()
    if linkage == "single":
        for (a, b), score in scores.items():
            if score >= threshold:
                union.union(a, b)
        return union
    total: dict[tuple[int, int], float] = {}
    count: dict[tuple[int, int], int] = {}
    neighbours: dict[int, set[int]] = {}
    for (a, b), score in scores.items():
        if a == b:
            continue
        key = (min(a, b), max(a, b))
        total[key] = total.get(key, 0.0) + float(score)
        count[key] = count.get(key, 0) + 1
        neighbours.setdefault(key[0], set()).add(key[1])
        neighbours.setdefault(key[1], set()).add(key[0])
    # Best first: (-mean, pair); entries whose mean changed since they were pushed are skipped when popped.
    heap = [(-total[k] / count[k], k) for k in total]
    heapq.heapify(heap)
    while heap:
        negative_mean, key = heapq.heappop(heap)
        if key not in total or -negative_mean != total[key] / count[key]:
            continue
        if -negative_mean < threshold:
            break
        keep, gone = key  # the group of the smaller root id absorbs the other
        union.union(keep, gone)
        del total[key], count[key]
        neighbours[keep].discard(gone)
        for other in neighbours.pop(gone):
            if other == keep:
                continue
            old, new = (min(gone, other), max(gone, other)), (min(keep, other), max(keep, other))
            total[new] = total.get(new, 0.0) + total.pop(old)
            count[new] = count.get(new, 0) + count.pop(old)
            neighbours[other].discard(gone)
            neighbours[other].add(keep)
            neighbours[keep].add(other)
            heapq.heappush(heap, (-total[new] / count[new], new))
    return union


def agglomerate(seg: np.ndarray, scores: Mapping[tuple[int, int], float], threshold: float,
                linkage: str = "single") -> np.ndarray:
    """``seg`` with the objects that ``join_groups`` puts together joined under the smallest id."""
    union = join_groups(scores, threshold, linkage)
    if not union.parent:
        return seg
    ids = np.unique(seg)
    table = np.array([union.find(int(i)) if i > 0 else int(i) for i in ids], dtype=np.int64)
    return table[np.searchsorted(ids, seg)].astype(seg.dtype)


def watershed_fill(image: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Every unsegmented voxel (0) given to the object whose intensity watershed reaches it first: objects grow
    from their voxels through the brightest (cytoplasm) voxels first and meet on the dark membranes. The FFN's
    objects are kept as they are; a volume without objects stays empty."""
    from skimage.segmentation import watershed

    if not labels.any():
        return labels
    filled = watershed(255 - image.astype(np.int32) if image.dtype == np.uint8 else -image.astype(np.float32),
                       markers=labels.astype(np.int64))
    return filled.astype(labels.dtype)
