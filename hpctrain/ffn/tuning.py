"""Inference thresholds chosen for one trained model on a labelled volume (a validation volume, or its training
volume).

How confident a trained FFN is inside an object differs from one training run to the next (another seed, another
CPU's float summation order): a move threshold that lets one model's floods grow stops another's at its seed,
and a join threshold that separates one model's pair scores merges another's. So, as the watershed baseline's
parameters are, the thresholds are chosen per model on labelled data: every candidate segments (a central crop
of) a labelled volume — best a validation volume in the condition the model will segment, else its training
volume — and the lowest VOI against its labels wins. Candidates that differ only in how the pieces are joined
(``agglomerate_threshold``) share one flood and one set of pair scores, so they cost no model calls.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.errors import ConfigError, DataError
from hpctrain.ffn.evaluate import evaluate_segmentation
from hpctrain.ffn.inference import (
    Canvas,
    InferenceConfig,
    _segmentation,
    join_and_fill,
    pieces_and_scores,
    run_requests,
)

FLOOD_KEYS = ("move_threshold", "segment_threshold")  # each value floods the crop again
JOIN_KEYS = ("agglomerate_threshold",)  # applied to one flood's pieces and scores
TUNABLE = FLOOD_KEYS + JOIN_KEYS


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


def tune_inference(model: Any, image: np.ndarray, labels: np.ndarray, base: InferenceConfig,
                   grid: Mapping[str, Sequence[float]], *,
                   say: Callable[[str], None] | None = None) -> tuple[InferenceConfig, list[dict[str, Any]]]:
    """Segment ``image`` with every candidate of ``grid`` over ``base`` and score each against ``labels``
    (0 = not scored); returns (the candidate with the lowest VOI — the first of equals —, every row tried)."""
    if image.shape != labels.shape:
        raise DataError(f"tuning image {image.shape} and labels {labels.shape} differ in shape")
    if not np.any(labels > 0):
        raise DataError("the tuning volume's labels are all 0: nothing to score the candidates against")
    model.eval()
    rows: list[dict[str, Any]] = []
    flood_settings = candidates({k: v for k, v in grid.items() if k in FLOOD_KEYS})
    joins = [float(v) for v in grid.get("agglomerate_threshold") or []]
    for flood in flood_settings:
        cfg = dataclasses.replace(base, **flood)
        scoring = dataclasses.replace(cfg, agglomerate_threshold=max([cfg.agglomerate_threshold, *joins]))
        t0 = time.perf_counter()
        canvas = Canvas(model, image, cfg.fov, cfg.deltas, **cfg.canvas_kwargs())
        run_requests(_segmentation(canvas, cfg, None), canvas.predict)
        pieces, scores = pieces_and_scores(canvas, scoring)
        flood_seconds = time.perf_counter() - t0
        for join in joins or [cfg.agglomerate_threshold]:
            settings = {**flood, **({"agglomerate_threshold": join} if joins else {})}
            seg = join_and_fill(image, pieces, scores, dataclasses.replace(cfg, agglomerate_threshold=join))
            m = evaluate_segmentation(seg, labels)
            rows.append({"settings": settings, "voi": m["voi_split"] + m["voi_merge"], "voi_split": m["voi_split"],
                         "voi_merge": m["voi_merge"], "adapted_rand_error": m["adapted_rand_error"],
                         "segments": int(seg.max(initial=0)), "ffn_calls": canvas.counters.get("ffn_calls", 0),
                         "flood_seconds": round(flood_seconds, 1)})
            if say:
                r = rows[-1]
                say(f"  {settings}: VOI {r['voi']:.3f} ({r['voi_split']:.2f}/{r['voi_merge']:.2f}), "
                    f"adapted Rand {r['adapted_rand_error']:.3f}")
    best = min(rows, key=lambda r: r["voi"])  # min keeps the first of equal rows
    return dataclasses.replace(base, **best["settings"]), rows


def tune_checkpoint(checkpoint: str | Path, image_spec: Any, labels_spec: Any, settings: Mapping[str, Any] | None,
                    grid: Mapping[str, Sequence[float]], crop: Sequence[int] | None, *, threads: int | None = None,
                    say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``tune_inference`` for a checkpoint on a central ``crop`` of a labelled volume (only the crop is read):
    {"chosen": {key: value}, "crop": [z, y, x], "rows": every candidate's scores, "seconds": wall time}.
    ``settings``: the base inference settings (a job's ``data.eval.inference``)."""
    from hpctrain.ffn.inference import prepare_inference
    from hpctrain.ffn.volume import open_volume

    t0 = time.perf_counter()
    model, base, _ = prepare_inference(checkpoint, dict(settings) if settings else None, threads=threads)
    with open_volume(image_spec) as image_volume, open_volume(labels_spec) as labels_volume:
        if tuple(image_volume.shape) != tuple(labels_volume.shape):
            raise DataError(f"tuning image {tuple(image_volume.shape)} and labels {tuple(labels_volume.shape)} "
                            "differ in shape")
        box = central_crop(image_volume.shape, crop)
        image, labels = np.asarray(image_volume[box]), np.asarray(labels_volume[box])
    shape = [b.stop - b.start for b in box]
    if say:
        say(f"choosing the inference thresholds on {'x'.join(map(str, shape))} voxels at the volume's centre, "
            f"candidates {dict(grid)}:")
    chosen, rows = tune_inference(model, image, labels, base, grid, say=say)
    return {"chosen": {key: getattr(chosen, key) for key in grid}, "crop": shape, "rows": rows,
            "seconds": round(time.perf_counter() - t0, 1)}
