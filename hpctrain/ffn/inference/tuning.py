"""Inference thresholds chosen for one trained model on a labelled volume (a validation volume, or its training
volume).

How confident a trained FFN is inside an object differs from one training run to the next (another seed, another
CPU's float summation order): a move threshold that lets one model's floods grow stops another's at its seed,
and a join threshold that separates one model's pair scores merges another's. So, as the watershed baseline's
parameters are, the thresholds are chosen per model on labelled data: every candidate segments (a central crop
of) a labelled volume — a validation volume in the condition the model will segment, or its training volume (the
demo's, with the join model fitted there too) — and the lowest VOI against its labels wins. Candidates that
differ only in how the pieces are joined (``agglomerate_threshold``) share one flood and one set of pair scores, so
they cost no model calls; and where the join model is fitted on the same volume the thresholds are chosen on, the
fit's flood is the candidates' too.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_inference import STAGE_OF, InferenceConfig
from hpctrain.errors import ConfigError, DataError
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
from hpctrain.ffn.inference.canvas import Canvas
from hpctrain.ffn.inference.runner import flooded_canvas, join_and_fill, pair_scores, pieces_and_claims
from hpctrain.memory_budget import RAISE_HINT, MemoryBudget

TUNABLE = ("move_threshold", "segment_threshold", "agglomerate_threshold")
FLOOD_KEYS = tuple(k for k in TUNABLE if STAGE_OF[k] == "flood")  # each value floods the crop again
JOIN_KEYS = tuple(k for k in TUNABLE if STAGE_OF[k] == "joins")  # applied to one flood's pieces and scores


@dataclasses.dataclass(frozen=True)
class Flood:
    """One flood of a labelled volume: the settings it ran with, its pieces and the mutual claim of each pair."""

    cfg: InferenceConfig
    pieces: np.ndarray
    claims: dict[tuple[int, int], float]
    ffn_calls: int
    seconds: float

    def serves(self, cfg: InferenceConfig) -> bool:
        """Whether a flood with ``cfg`` would give these pieces and claims: the same flood and seeds, the same
        pieces and pairs (any join threshold > 0 computes the claims), the same device and arithmetic; how the
        pairs are joined and the rest filled, and how the FOVs are batched, do not change them."""
        def pieces_part(c: InferenceConfig) -> tuple[Any, ...]:
            return (c.flood, c.seeds, c.joins.split_pieces, c.joins.min_contact, c.joins.agglomerate_threshold > 0,
                    c.execution.device, c.execution.precision)

        return pieces_part(self.cfg) == pieces_part(cfg)


def central_crop(shape: Sequence[int], crop: Sequence[int] | None) -> tuple[slice, ...]:
    """The box of ``crop`` voxels (z, y, x) at the centre of a volume of ``shape`` (all of an axis shorter
    than the crop)."""
    if crop is None:
        return tuple(slice(0, int(s)) for s in shape)
    return tuple(slice(max(0, (int(s) - int(c)) // 2), max(0, (int(s) - int(c)) // 2) + min(int(c), int(s)))
                 for s, c in zip(shape, crop, strict=True))


def candidates(grid: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
    """Every combination of ``grid``'s values (keys from ``TUNABLE``), in ``TUNABLE``'s order of keys."""
    unknown = sorted(set(grid) - set(TUNABLE))
    if unknown:
        raise ConfigError(f"cannot tune {unknown}", key="data.eval.tune", hint=f"tunable: {', '.join(TUNABLE)}")
    keys = [k for k in TUNABLE if grid.get(k)]
    values = [list(grid[k]) for k in keys]
    if not keys:
        return [{}]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def flood_pieces(model: Any, image: np.ndarray,
                 cfg: InferenceConfig) -> tuple[np.ndarray, dict[tuple[int, int], float], Canvas]:
    """One segmentation's floods of ``image``: (its pieces, the mutual claim of each pair in contact, the canvas)."""
    canvas = flooded_canvas(model, image, cfg)
    pieces, claims = pieces_and_claims(canvas, cfg.joins)
    return pieces, claims, canvas


def fit_joins(model: Any, image: np.ndarray, labels: np.ndarray, base: InferenceConfig, *,
              say: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict[str, Any], Flood]:
    """Flood ``image`` with ``base``'s settings, label each claimed pair of pieces one object or two from
    ``labels`` and fit ``join_model.fit_join_model`` to them: (the model as ``JoinModel.as_dict``, a record, the
    flood — ``tune_inference`` reuses it where it tries the same settings on the same volume)."""
    from hpctrain.ffn.inference.join_model import fit_join_model, training_pairs

    if image.shape != labels.shape:
        raise DataError(f"join-fitting image {image.shape} and labels {labels.shape} differ in shape")
    t0 = time.perf_counter()
    # any join threshold > 0 makes the floods' pairs scored; the fit is of the claims, not an earlier join model
    cfg = base.replace(agglomerate_threshold=max(base.joins.agglomerate_threshold, 0.5), join_model=None)
    pieces, claims, canvas = flood_pieces(model, image, cfg)
    flood = Flood(cfg, pieces, claims, canvas.counters.get("ffn_calls", 0), time.perf_counter() - t0)
    x, y, w = training_pairs(image, pieces, labels, claims)
    try:
        fitted = fit_join_model(x, y, w)
    except ValueError as e:
        raise DataError(f"cannot fit the join model on this volume: {e}",
                        hint="fit on a larger labelled volume (data.eval.tune.fit_joins.crop) with several "
                             "objects") from e
    record = {"pairs": len(y), "one_object": int(y.sum()), "pieces": int(pieces.max(initial=0)),
              "coef": dict(zip(fitted.features, [round(c, 3) for c in fitted.coef], strict=True)),
              "seconds": round(time.perf_counter() - t0, 1)}
    if say:
        say(f"join model fitted on {record['pairs']} pairs of {record['pieces']} pieces "
            f"({record['one_object']} one object) in {record['seconds']:.0f} s; weights {record['coef']}")
    return fitted.as_dict(), record, flood


def tune_inference(model: Any, image: np.ndarray, labels: np.ndarray, base: InferenceConfig,
                   grid: Mapping[str, Sequence[float]], *, say: Callable[[str], None] | None = None,
                   floods: Sequence[Flood] = ()) -> tuple[InferenceConfig, list[dict[str, Any]]]:
    """Segment ``image`` with every candidate of ``grid`` over ``base`` and score each against ``labels``
    (0 = not scored); returns (the candidate with the lowest VOI — the first of equals —, every row tried).
    ``floods``: floods of this same image already run (``fit_joins``'); a candidate one of them ``serves`` is not
    flooded again."""
    if image.shape != labels.shape:
        raise DataError(f"tuning image {image.shape} and labels {labels.shape} differ in shape")
    if not np.any(labels > 0):
        raise DataError("the tuning volume's labels are all 0: nothing to score the candidates against")
    model.eval()
    rows: list[dict[str, Any]] = []
    flood_settings = candidates({k: v for k, v in grid.items() if k in FLOOD_KEYS})
    joins = [float(v) for v in grid.get("agglomerate_threshold") or []]
    for settings_tried in flood_settings:
        cfg = base.replace(**settings_tried)
        scoring = cfg.replace(agglomerate_threshold=max([cfg.joins.agglomerate_threshold, *joins]))
        t0 = time.perf_counter()
        done = next((f for f in floods if f.serves(scoring)), None)
        if done is None:
            pieces, claims, canvas = flood_pieces(model, image, scoring)
            ffn_calls = canvas.counters.get("ffn_calls", 0)
        else:
            pieces, claims, ffn_calls = done.pieces, done.claims, done.ffn_calls
        scores = pair_scores(image, pieces, claims, scoring.joins)
        flood_seconds = time.perf_counter() - t0 + (done.seconds if done is not None else 0.0)
        for join in joins or [cfg.joins.agglomerate_threshold]:
            settings = {**settings_tried, **({"agglomerate_threshold": join} if joins else {})}
            seg = join_and_fill(image, pieces, scores, cfg.replace(agglomerate_threshold=join).joins, cfg.fill)
            m = evaluate_segmentation(seg, labels)
            rows.append({"settings": settings, "voi": m["voi_split"] + m["voi_merge"], "voi_split": m["voi_split"],
                         "voi_merge": m["voi_merge"], "adapted_rand_error": m["adapted_rand_error"],
                         "segments": int(seg.max(initial=0)), "ffn_calls": ffn_calls,
                         "flood_seconds": round(flood_seconds, 1), "reused_flood": done is not None})
            if say:
                r = rows[-1]
                say(f"  {settings}: VOI {r['voi']:.3f} ({r['voi_split']:.2f}/{r['voi_merge']:.2f}), "
                    f"adapted Rand {r['adapted_rand_error']:.3f}")
    best = min(rows, key=lambda r: r["voi"])  # min keeps the first of equal rows
    return base.replace(**best["settings"]), rows


def read_labelled(image_spec: Any, labels_spec: Any, crop: Sequence[int] | None,
                  budget: MemoryBudget | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(image, labels) of a central ``crop`` of a labelled volume; only the crop is read, once their dtypes and
    shapes are checked and the crop, its labels and its flood are known to fit ``budget`` (default:
    ``memory_budget()``)."""
    from hpctrain.config.plugins.ffn_volumes import check_pair
    from hpctrain.ffn.inference.runner import FLOOD_BYTES_PER_VOXEL
    from hpctrain.ffn.volume import open_volume, selection_shape

    with open_volume(image_spec, budget) as image_volume, open_volume(labels_spec, budget) as labels_volume:
        check_pair(image_volume, labels_volume)
        box = central_crop(image_volume.shape, crop)
        shape = selection_shape(image_volume.shape, box)
        image_volume.check_fits("choosing settings on", FLOOD_BYTES_PER_VOXEL + labels_volume.dtype.itemsize,
                                shape=shape, hint=f"choose them on a smaller central crop (--crop Z Y X), or "
                                                  f"{RAISE_HINT}")
        return np.asarray(image_volume[box]), np.asarray(labels_volume[box])


def tune_checkpoint(checkpoint: str | Path, image_spec: Any, labels_spec: Any, settings: Mapping[str, Any] | None,
                    grid: Mapping[str, Sequence[float]], crop: Sequence[int] | None, *, threads: int | None = None,
                    say: Callable[[str], None] | None = None,
                    fit_on: tuple[Any, Any, Sequence[int] | None] | None = None,
                    fit_settings: Mapping[str, Any] | None = None,
                    fit_required: bool = True,
                    check_fit: Callable[[Mapping[str, Any]], None] | None = None,
                    budget: MemoryBudget | None = None) -> dict[str, Any]:
    """``tune_inference`` for a checkpoint on a central ``crop`` of a labelled volume (only the crop is read):
    {"chosen": {key: value}, "crop": [z, y, x], "rows": every candidate's scores, "seconds": wall time}.
    ``settings``: the base inference settings (a job's ``data.eval.inference``). ``fit_on`` = (image spec, labels
    spec, crop) of a labelled volume (the training volume): a join model is fitted there first (``fit_joins``),
    used for every candidate and returned as ``chosen["join_model"]``; "join_fit" records the fit.
    ``fit_settings``: settings of ``base`` the fit's flood changes (``data.eval.tune.fit_joins.inference``); where the
    thresholds are chosen on the fit's volume they are chosen on that flood too, and only the chosen values and the
    join model are returned, never these settings. A volume whose
    floods leave no pairs of both kinds to fit on is an error, or with ``fit_required`` False (a quick demo run's
    barely trained model) a message, and the pairs are joined by their claims. ``check_fit`` sees the fit's record
    (``{"not_fitted": why}`` where there was none) before any candidate is tried, and may refuse it."""
    from hpctrain.ffn.inference.runner import prepare_inference

    t0 = time.perf_counter()
    model, base, _ = prepare_inference(checkpoint, dict(settings) if settings else None, threads=threads)
    fitted: dict[str, Any] = {}
    floods: list[Flood] = []
    same_volume = fit_on is not None and tuple(fit_on) == (image_spec, labels_spec, crop)
    if fit_on is not None:
        fit_image, fit_labels = read_labelled(*fit_on, budget=budget)
        if say:
            changed = f" flooded with {dict(fit_settings)}" if fit_settings else ""
            say(f"fitting the join model on {'x'.join(map(str, fit_image.shape))} voxels of {fit_on[0]}{changed}:")
        fit_base = base.replace(**dict(fit_settings or {}))
        try:
            join_model, fitted, flood = fit_joins(model, fit_image, fit_labels, fit_base, say=say)
            # on the fit's own volume the candidates are chosen on the fit's flood: its settings, its pieces
            base = (fit_base if same_volume else base).replace(join_model=join_model)
            if same_volume:
                floods.append(flood)
        except DataError as e:
            if fit_required:
                raise
            fitted = {"not_fitted": e.message}
            if say:
                say(f"no join model: {e.message}; pairs are joined by their mutual claims")
        if check_fit is not None:
            check_fit(fitted)
    image, labels = (fit_image, fit_labels) if same_volume else read_labelled(image_spec, labels_spec, crop, budget)
    shape = list(image.shape)
    if say:
        say(f"choosing the inference thresholds on {'x'.join(map(str, shape))} voxels at the volume's centre, "
            f"candidates {dict(grid)}{' (the join fit flooded it already)' if floods else ''}:")
    chosen, rows = tune_inference(model, image, labels, base, grid, say=say, floods=floods)
    picked = {key: chosen.flat()[key] for key in grid}
    if chosen.joins.join_model is not None:
        picked["join_model"] = chosen.joins.join_model
    return {"chosen": picked, "crop": shape, "rows": rows, "seconds": round(time.perf_counter() - t0, 1),
            **({"join_fit": fitted} if fitted else {})}
