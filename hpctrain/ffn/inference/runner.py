"""FFN inference from a checkpoint: the model chosen by name, the settings resolved for it, and the stages of
one segmentation, each taking its settings group whole: seeds and floods (``canvas``), pieces and joins
(``agglomeration``, ``join_model``), the fill of what is left; then the labels written with what made them
(google/ffn ``ffn/inference/runner.py`` and ``inference.py``'s ``segment_all``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.numbers import NumberError, check_threads
from hpctrain.config.plugins.ffn_inference import FillSettings, InferenceConfig, JoinSettings, SeedSettings
from hpctrain.errors import CheckpointError, ConfigError
from hpctrain.ffn.inference.agglomeration import agglomerate, contact_pairs, mutual_claims, watershed_fill
from hpctrain.ffn.inference.batching import FovBatches, flood_together
from hpctrain.ffn.inference.canvas import Canvas, make_canvas
from hpctrain.ffn.inference.seeds import make_seeds, within_margin
from hpctrain.ffn.inference.settings import checkpoint_settings
from hpctrain.ffn.segmentation import make_labels_contiguous, split_disconnected, write_segmentation_hdf5
from hpctrain.memory_budget import RAISE_HINT, MemoryBudget
from hpctrain.runtime.precision import resolve_precision

Settings = InferenceConfig | Mapping[str, Any] | None
# Bytes per voxel that flooding and finishing a volume hold besides its image: the canvas's float32 normalised
# image, seed logits and int32 labels, then the pieces, claims and fill of finishing (the peak of the numpy
# allocations of ``segment_volume`` at the default settings, measured with tracemalloc on 48^3 and 80^3: 70).
FLOOD_BYTES_PER_VOXEL = 72
PIECES_HINT = ("segment it in pieces: --subvolumes Z Y X reads and floods each piece on its own (with --ranks, on "
               f"several processes), or {RAISE_HINT}")


def as_config(cfg: Settings) -> InferenceConfig:
    """``cfg`` as an InferenceConfig (flat keys are checked; None: the defaults)."""
    return cfg if isinstance(cfg, InferenceConfig) else InferenceConfig.from_mapping(cfg or {})


# ------------------------------------------------------------------------------------------------ the stages
def seeded_floods(canvas: Canvas, seeds_cfg: SeedSettings, seeds: np.ndarray | None = None) -> FovBatches:
    """Every flood of one segmentation: the policy's seeds (or ``seeds``), then ``reseed_passes`` passes of the
    peaks policy over the voxels still unsegmented."""
    image = canvas.image
    if seeds is None:
        seeds = make_seeds(seeds_cfg.seed_policy, image, **seeds_cfg.seed_args)
    yield from canvas.flood(within_margin(seeds, canvas.shape, canvas.margin))
    peak_args = seeds_cfg.seed_args if seeds_cfg.seed_policy == "peaks" else {}
    for _ in range(seeds_cfg.reseed_passes):
        before = len(canvas.origins)
        more = make_seeds("peaks", image, **{**peak_args, "mask": canvas.segmentation > 0})
        yield from canvas.flood(within_margin(more, canvas.shape, canvas.margin))
        if len(canvas.origins) == before:
            break


def pieces_and_claims(canvas: Canvas, joins: JoinSettings) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """The flooded canvas's objects (ids 1..N; split into connected pieces where ``joins.split_pieces``) and,
    when the pieces are joined, the mutual bare-seed claim of every two of them in contact (``mutual_claims``)."""
    labels = canvas.labels()
    if joins.split_pieces:
        labels = split_disconnected(labels, canvas.settings.min_segment_size)
    if joins.agglomerate_threshold <= 0:
        return labels, {}
    pairs = sorted(contact_pairs(labels, min_voxels=joins.min_contact))
    canvas.counters["agglomeration_pairs"] = len(pairs)
    return labels, mutual_claims(labels, canvas.predict_bare, canvas.fov, canvas.segment_logit, pairs)


def pair_scores(image: np.ndarray, pieces: np.ndarray, claims: Mapping[tuple[int, int], float],
                joins: JoinSettings) -> dict[tuple[int, int], float]:
    """The score each claimed pair is joined by: its claim, or ``joins.join_model``'s probability."""
    if joins.join_model is None:
        return dict(claims)
    from hpctrain.ffn.inference.join_model import JoinModel, join_scores

    return join_scores(image, pieces, claims, JoinModel.from_mapping(joins.join_model))


def join_and_fill(image: np.ndarray, pieces: np.ndarray, scores: Mapping[tuple[int, int], float],
                  joins: JoinSettings, fill: FillSettings, counters: dict[str, int] | None = None) -> np.ndarray:
    """``pieces`` joined where their score reaches ``joins.agglomerate_threshold``, then watershed-filled where
    ``fill`` says."""
    labels = pieces
    if joins.agglomerate_threshold > 0:
        joined = agglomerate(pieces, scores, joins.agglomerate_threshold, joins.linkage)
        if counters is not None:
            counters["agglomeration_joins"] = (len(np.unique(pieces[pieces > 0]))
                                               - len(np.unique(joined[joined > 0])))
        labels = make_labels_contiguous(joined)
    if fill.watershed_fill:
        labels = watershed_fill(image, labels)
    return labels


def finish(canvas: Canvas, cfg: InferenceConfig) -> np.ndarray:
    """A flooded canvas's objects as labels: pieces, scored, joined and filled as ``cfg`` says."""
    pieces, claims = pieces_and_claims(canvas, cfg.joins)
    scores = pair_scores(canvas.image, pieces, claims, cfg.joins)
    return join_and_fill(canvas.image, pieces, scores, cfg.joins, cfg.fill, canvas.counters)


def flooded_canvas(model: Any, image: np.ndarray, cfg: InferenceConfig, seeds: np.ndarray | None = None) -> Canvas:
    """A canvas of ``image`` flooded from ``cfg``'s seeds (or ``seeds``)."""
    canvas = make_canvas(model, image, cfg)
    flood_together(model, [(canvas, seeded_floods(canvas, cfg.seeds, seeds))])
    return canvas


# ------------------------------------------------------------------------------------------------ a volume
def segment_volume(model: Any, image: np.ndarray, cfg: Settings = None, *, seeds: np.ndarray | None = None,
                   return_canvas: bool = False) -> np.ndarray | tuple[np.ndarray, Canvas]:
    """Segment ``image`` with ``model``: seeds → floods → pieces → joins → fill."""
    cfg = as_config(cfg)
    model.eval()
    canvas = flooded_canvas(model, image, cfg, seeds)
    labels = finish(canvas, cfg)
    return (labels, canvas) if return_canvas else labels


def segment_volumes_together(model: Any, images: Sequence[np.ndarray], cfg: Settings = None) -> list[np.ndarray]:
    """``segment_volume`` of several images (e.g. subvolumes), their FOVs batched into shared model calls.

    Each result equals ``segment_volume`` of that image alone up to the float32 summation order of a batched
    convolution."""
    cfg = as_config(cfg)
    model.eval()
    canvases = [make_canvas(model, image, cfg) for image in images]
    flood_together(model, [(c, seeded_floods(c, cfg.seeds)) for c in canvases])
    return [finish(c, cfg) for c in canvases]


# ------------------------------------------------------------------------------------------------ a checkpoint
def load_model(checkpoint_path: str | Path, device: str = "cpu") -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Load ``torch.save({'model': state_dict, 'model_args': {...}, 'model_name': ...})``; returns (model,
    model_args, ckpt). The network is the one ``model_name`` names (``hpctrain.ffn.model.NETWORKS``; the FFN's
    ConvStack3D where the checkpoint names none). A checkpoint directory written by training stands for the
    newest checkpoint whose shared file matches the manifest (``checkpoint.manifest.newest_shared_file``)."""
    import torch

    from hpctrain.checkpoint.manifest import newest_shared_file
    from hpctrain.ffn.model import build_network

    path = Path(checkpoint_path)
    if path.is_dir():  # a run's checkpoint directory: the newest checkpoint the manifest vouches for
        path, _ = newest_shared_file(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist", hint="pass the .pt file training wrote")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises pickle/zip/runtime errors for a bad file
        raise CheckpointError(f"checkpoint {path} could not be read: {e}") from e
    if not isinstance(ckpt, Mapping) or "model" not in ckpt or "model_args" not in ckpt:
        keys = sorted(ckpt) if isinstance(ckpt, Mapping) else type(ckpt).__name__
        raise CheckpointError(
            f"checkpoint {path} has {keys}; expected a mapping with 'model' (state_dict) and 'model_args'",
            hint="save with torch.save({'model': model.state_dict(), 'model_args': {...}}, path)",
        )
    model_args = dict(ckpt["model_args"])
    name = str(ckpt.get("model_name") or "ffn")
    try:
        model = build_network(name, model_args)
    except KeyError as e:
        raise CheckpointError(f"checkpoint {path}: {e.args[0]}", hint="segment with the FFN's own checkpoints") from e
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path} does not match its network {name!r} ({model_args}): {e}") from e
    model.to(device).eval()
    return model, model_args, dict(ckpt)


def prepare_inference(checkpoint_path: str | Path, config: Settings = None, *, threads: int | None = None,
                      tune: bool = True) -> tuple[Any, InferenceConfig, dict[str, Any]]:
    """The model (tuned for CPU inference unless ``tune`` is False), the settings and the checkpoint's
    ``model_args``. Flat settings take the FOV, deltas and image normalisation from the checkpoint unless they
    name them (``settings.checkpoint_settings``); an InferenceConfig is used as it is. The precision is
    resolved for the device: the settings returned are what ran."""
    import torch

    if threads:
        try:
            check_threads(threads, "threads")
        except NumberError as exc:
            raise ConfigError(str(exc)) from None
        torch.set_num_threads(threads)
    given = config if isinstance(config, InferenceConfig) else None
    device = given.execution.device if given else str(dict(config or {}).get("device", "cpu"))
    model, model_args, ckpt = load_model(checkpoint_path, device)
    cfg = given or InferenceConfig.from_mapping({**checkpoint_settings(model_args, ckpt), **dict(config or {})})
    precision = resolve_precision(cfg.execution.precision, torch.device(cfg.execution.device))
    cfg = cfg.replace(precision=precision)
    if tune and cfg.execution.device == "cpu":
        from hpctrain.ffn.perf import tune_for_inference

        model = tune_for_inference(model, torch.zeros((1, 2, *cfg.flood.fov), dtype=torch.float32),
                                   precision=precision)
    elif precision == "bfloat16":
        from hpctrain.ffn.perf import BFloat16Inference

        model = BFloat16Inference(model)
    return model, cfg, model_args


def run_segment(checkpoint_path: str | Path, volume_spec: Any, out_path: str | Path, *, config: Settings = None,
                threads: int | None = None, tune: bool = True,
                provenance: Mapping[str, Any] | None = None, budget: MemoryBudget | None = None) -> dict[str, Any]:
    """`hpctrain ffn segment`: checkpoint + image volume → segmentation HDF5; returns a summary dict.

    Settings as ``prepare_inference``; ``tune`` runs a copy of the model with the CPU inference settings of
    ``hpctrain.ffn.perf`` (oneDNN convolutions, channels-last; the same float32 sums up to their order). The
    segmentation's attributes record the checkpoint, the image, every setting that ran and ``provenance``
    (e.g. the model package the settings came from). The image's shape and dtype are checked, and the volume and
    its flood against ``budget`` (default: ``memory_budget()``), from its header before the model is loaded."""
    from hpctrain.config.plugins.ffn_volumes import check_image
    from hpctrain.ffn.volume import open_volume

    with open_volume(volume_spec, budget) as volume:
        check_image(volume)
        volume.check_fits("segmenting", FLOOD_BYTES_PER_VOXEL, hint=PIECES_HINT)
        model, cfg, model_args = prepare_inference(checkpoint_path, config, threads=threads, tune=tune)
        image = volume.read()
    t0 = time.perf_counter()
    labels, canvas = segment_volume(model, image, cfg, return_canvas=True)
    seconds = time.perf_counter() - t0
    attrs = {"checkpoint": str(checkpoint_path), "image": str(volume_spec), "config": cfg.flat(),
             "model_args": model_args, "seconds": round(seconds, 3), **dict(provenance or {})}
    written = write_segmentation_hdf5(out_path, labels, attrs)
    return {"out": str(written), "objects": int(labels.max(initial=0)),
            "segmented_fraction": float((labels > 0).mean()), "ffn_calls": canvas.counters.get("ffn_calls", 0),
            "seconds": seconds, "counters": dict(canvas.counters), "settings": cfg.flat()}
