"""Learned joins: which touching pieces of an over-segmentation are one object, from the FFN's mutual claims and
what the image shows between the two pieces, weighed by a logistic model fitted on a labelled volume.

The mutual bare-seed claims (``agglomeration.mutual_claims``) alone mistake a faint membrane for a continuation:
near one the FFN claims the other piece from both sides (measured: docs/ffn_log.md). What lies between the two
pieces says more: two pieces of one object that a bounded flood cut apart touch face to face, with nothing darker
between them, while two objects are kept apart by a membrane that even where it is faint leaves a gap the floods
did not take and a dip in brightness; and two objects' insides are rarely equally bright. Each scored pair gets
the features of ``FEATURES``; a logistic regression fitted on the pieces of a labelled volume (the training
volume: the labels every FFN user has) turns them into the probability that the pair is one object, which replaces
the claim as the pair's score (``join_groups`` joins as before, its threshold now a probability). This is the
learned agglomeration of connectomics pipelines (GALA, NeuroProof: boundary and region features of each pair of
supervoxels, a classifier fitted on ground truth) with the FFN's claim as one feature.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_inference import JOIN_FEATURES, join_model_problem
from hpctrain.errors import ConfigError
from hpctrain.ffn.inference.agglomeration import Box, axis_neighbours, object_boxes

Pair = tuple[int, int]

FEATURES = JOIN_FEATURES
"""What each pair is described by. claim: the mutual bare-seed claim (the smaller share, ``mutual_claims``); gap:
the share of the voxels within ``reach`` of both pieces that belong to neither (a membrane the floods left, or a
third piece between them); brightness_difference: the pieces' median brightness apart (grey levels; each piece shrunk
by a voxel, away from its edge); log_contact: log(1 + the voxels within ``reach`` of both); touch: of the two pieces'
voxel pairs up to ``reach`` apart along an axis, the share that are face neighbours; membrane_dip: across the pairs
exactly ``reach`` apart, how much darker the darkest voxel between them is than their mean (lightly smoothed image:
a membrane dips, a cut through one object does not)."""


def _boundary_features(image: np.ndarray, pieces: np.ndarray, reach: int) -> dict[Pair, tuple[float, float]]:
    """(a, b) -> (touch, membrane_dip) for every two pieces with voxels up to ``reach`` apart along an axis."""
    from scipy import ndimage

    smooth = ndimage.gaussian_filter(image.astype(np.float32), 0.7)
    n = int(pieces.max(initial=0)) + 1
    near: dict[int, int] = {}
    total: dict[int, int] = {}
    dip_sum: dict[int, float] = {}
    dip_count: dict[int, int] = {}
    for axis, d, lo, touching, keys in axis_neighbours(pieces, reach):
        found, index, counts = np.unique(keys, return_inverse=True, return_counts=True)
        for key, count in zip(found.tolist(), counts.tolist(), strict=True):
            total[key] = total.get(key, 0) + count
            if d == 1:
                near[key] = near.get(key, 0) + count
        if d == reach and reach > 1 and len(found):
            ends = 0.5 * (smooth[lo] + smooth[_shifted(lo, axis, d)])
            between = np.min([smooth[_shifted(lo, axis, m)] for m in range(1, d)], axis=0)
            sums = np.bincount(index, weights=(ends - between)[touching], minlength=len(found))
            for key, s, count in zip(found.tolist(), sums.tolist(), counts.tolist(), strict=True):
                dip_sum[key] = dip_sum.get(key, 0.0) + s
                dip_count[key] = dip_count.get(key, 0) + count
    return {(key // n, key % n): (near.get(key, 0) / count,
                                  dip_sum[key] / dip_count[key] if dip_count.get(key) else 0.0)
            for key, count in total.items()}


def _shifted(box: tuple[slice, ...], axis: int, by: int) -> tuple[slice, ...]:
    """``box`` moved by ``by`` voxels along ``axis``."""
    moved = list(box)
    moved[axis] = slice(box[axis].start + by, box[axis].stop + by)
    return tuple(moved)


def _median_brightness(image: np.ndarray, pieces: np.ndarray, boxes: Mapping[int, Box]) -> dict[int, float]:
    """piece -> median image value of its voxels more than one voxel from its edge (all of them when fewer than
    20 are)."""
    from scipy import ndimage

    out = {}
    for i, box in boxes.items():
        mask = pieces[box] == i
        inner = ndimage.binary_erosion(mask)
        values = image[box][inner if int(inner.sum()) >= 20 else mask]
        out[i] = float(np.median(values))
    return out


def pair_features(image: np.ndarray, pieces: np.ndarray, claims: Mapping[Pair, float],
                  reach: int = 3) -> dict[Pair, np.ndarray]:
    """(a, b) -> the ``FEATURES`` of each pair that has a claim, as one float64 vector."""
    from scipy import ndimage

    if not claims:
        return {}
    boundary = _boundary_features(image, pieces, reach)
    boxes = object_boxes(pieces)
    brightness = _median_brightness(image, pieces, boxes)
    ball = ndimage.generate_binary_structure(3, 1)
    out = {}
    for (a, b), claim in claims.items():
        box_a, box_b = boxes[a], boxes[b]
        box = tuple(slice(max(0, min(p.start, q.start) - reach), min(n, max(p.stop, q.stop) + reach))
                    for p, q, n in zip(box_a, box_b, pieces.shape, strict=True))
        local = pieces[box]
        in_a, in_b = local == a, local == b
        zone = (ndimage.binary_dilation(in_a, ball, iterations=reach)
                & ndimage.binary_dilation(in_b, ball, iterations=reach))
        size = int(zone.sum())
        gap = float((zone & ~in_a & ~in_b).sum() / size) if size else 1.0
        touch, dip = boundary.get((min(a, b), max(a, b)), (0.0, 0.0))
        out[(a, b)] = np.array([claim, gap, abs(brightness[a] - brightness[b]), np.log1p(size), touch, dip])
    return out


def same_object(pieces: np.ndarray, labels: np.ndarray, pairs: Iterable[Pair]) -> dict[Pair, bool]:
    """(a, b) -> whether the two pieces' most common true objects (label > 0) are the same one; a piece over
    label 0 alone is nobody's and joins nothing."""
    owner: dict[int, int] = {}
    for i, box in object_boxes(pieces).items():
        truth = labels[box][(pieces[box] == i) & (labels[box] > 0)]
        owner[i] = int(np.bincount(truth.astype(np.int64)).argmax()) if truth.size else 0
    return {(a, b): owner.get(a, 0) > 0 and owner.get(a, 0) == owner.get(b, -1) for a, b in pairs}


@dataclass(frozen=True)
class JoinModel:
    """P(one object) = sigmoid(intercept + coef · (x − mean) / scale) over ``features``."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float

    def probability(self, x: np.ndarray) -> np.ndarray:
        standard = (np.atleast_2d(x) - np.asarray(self.mean)) / np.asarray(self.scale)
        z = self.intercept + standard @ np.asarray(self.coef)
        return 1.0 / (1.0 + np.exp(-z))

    def as_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "mean": list(self.mean), "scale": list(self.scale),
                "coef": list(self.coef), "intercept": self.intercept}

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "join_model") -> JoinModel:
        """From ``as_dict``'s mapping; one that is not whole, or over other features than ``FEATURES``, is
        refused naming ``where``."""
        problem = join_model_problem(data)
        if problem:
            raise ConfigError(problem[0], key=where, hint=problem[1])
        return cls(tuple(data["features"]), *(tuple(float(v) for v in data[k]) for k in ("mean", "scale", "coef")),
                   float(data["intercept"]))


def fit_join_model(x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None, *,
                   l2: float = 1.0, iterations: int = 50) -> JoinModel:
    """L2-regularised logistic regression of ``y`` (1 = one object) on the standardised features ``x`` by
    Newton's method; ``weight``s are rescaled to mean 1. Minimises
    ``0.5 l2 |coef|² + Σ wᵢ log(1 + exp(−sᵢ zᵢ))`` (sᵢ = ±1): scikit-learn's objective with C = 1 / l2."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[1] != len(FEATURES):
        raise ValueError(f"x must be (pairs, {len(FEATURES)}) and y (pairs,), got {x.shape} and {y.shape}")
    if not (0 < y.sum() < len(y)):
        raise ValueError(f"fitting joins needs pairs of pieces of both kinds (one object, two objects); the "
                         f"floods left {len(y)} scored pairs, {int(y.sum())} of them one object")
    w = np.ones(len(y)) if weight is None else np.asarray(weight, dtype=np.float64)
    w = w / w.mean()
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    design = np.hstack([np.ones((len(y), 1)), (x - mean) / scale])
    beta = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2)
    penalty[0] = 0.0  # the intercept is not penalised
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(design @ beta)))
        gradient = design.T @ (w * (p - y)) + penalty * beta
        hessian = (design * (w * p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.solve(hessian + 1e-9 * np.eye(len(beta)), gradient)
        beta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return JoinModel(FEATURES, tuple(mean.tolist()), tuple(scale.tolist()), tuple(beta[1:].tolist()), float(beta[0]))


def feature_matrix(image: np.ndarray, pieces: np.ndarray,
                   claims: Mapping[Pair, float]) -> tuple[list[Pair], np.ndarray]:
    """(the claimed pairs, their ``pair_features`` as rows of a (pairs, len(FEATURES)) array, in that order)."""
    features = pair_features(image, pieces, claims)
    pairs = list(features)
    return pairs, np.array([features[p] for p in pairs]).reshape(len(pairs), len(FEATURES))


def training_pairs(image: np.ndarray, pieces: np.ndarray, labels: np.ndarray,
                   claims: Mapping[Pair, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, one object or not, weight) of every claimed pair of a labelled volume's pieces: what
    ``fit_join_model`` takes. A pair weighs the square root of its smaller piece's voxels: the wrong joins and
    splits of large pieces are what VOI and the adapted Rand error count."""
    pairs, x = feature_matrix(image, pieces, claims)
    truth = same_object(pieces, labels, pairs)
    sizes = np.bincount(pieces.ravel().astype(np.int64))
    y = np.array([truth[p] for p in pairs], dtype=np.float64)
    w = np.array([np.sqrt(min(sizes[a], sizes[b])) for a, b in pairs], dtype=np.float64)
    return x, y, w


def join_scores(image: np.ndarray, pieces: np.ndarray, claims: Mapping[Pair, float],
                model: JoinModel) -> dict[Pair, float]:
    """(a, b) -> the model's probability that the two claimed pieces are one object."""
    pairs, x = feature_matrix(image, pieces, claims)
    if not pairs:
        return {}
    return {k: float(v) for k, v in zip(pairs, model.probability(x), strict=True)}
