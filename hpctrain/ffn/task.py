"""The FFN as a training task of the runtime: data preparation once, sharded FOV-movement examples.

Rank 0 prepares the training data into ``RUN_DIR/data/`` (a synthetic volume when the spec asks for one,
partitions, balanced coordinates) exactly once; every rank then streams its own shard of the coordinates.
``data`` keys: ``train`` ({synthetic: {shape, seed}} or {image: SPEC, labels: SPEC}), optional
``coordinates`` (a prepared .npz), ``partitions`` ({thresholds, min_size}), ``margin``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.errors import ConfigError, DataError
from hpctrain.ffn.examples import (
    DEFAULT_THRESHOLDS,
    build_coordinates,
    compute_partitions,
    lom_radius_for,
    read_coordinates,
    write_coordinates,
)
from hpctrain.ffn.model import ConvStack3D
from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5
from hpctrain.ffn.training import (
    ExampleStream,
    StreamConfig,
    clip_gradients_,
    epoch_coordinates,
    fov_loss,
)
from hpctrain.ffn.volume import load_image_and_labels
from hpctrain.models.task import TaskContext, TrainingTask

MODEL_KEYS = ("depth", "features", "fov", "deltas")
# Training-example options (google/ffn train.py flags of the same meaning): model_args key -> StreamConfig field.
STREAM_KEYS = {"fov_policy": "policy", "fov_moves": "fov_moves", "faces_only": "faces_only",
               "move_threshold": "threshold", "permutable_axes": "permutable_axes",
               "reflectable_axes": "reflectable_axes"}
# Not in the reference: the first N steps train on bare-seed FOVs only (StreamConfig.single_fov_examples).
SCHEDULE_KEYS = ("single_fov_steps",)
GRADIENT_CLIP = 0.7  # google/ffn max_gradient_entry_mag


def _triple(value: Any, key: str) -> tuple[int, int, int]:
    if isinstance(value, int):
        return (value, value, value)
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]), int(value[2]))
    raise ConfigError(f"{value!r} is not a size; give one integer or [z, y, x]", key=f"model_args.{key}")


def model_config(model_args: dict[str, Any]) -> dict[str, Any]:
    """ConvStack3D arguments from the spec's model_args (unknown keys are errors)."""
    extra = ("image_mean", "image_stddev", "clip", *SCHEDULE_KEYS)
    unknown = set(model_args) - set(MODEL_KEYS) - set(STREAM_KEYS) - set(extra)
    if unknown:
        raise ConfigError(f"unknown FFN model_args {sorted(unknown)}", key="model_args",
                          hint="valid: " + ", ".join([*MODEL_KEYS, *STREAM_KEYS, *extra]))
    return {"depth": int(model_args.get("depth", 9)), "features": int(model_args.get("features", 32)),
            "fov": _triple(model_args.get("fov", 33), "fov"), "deltas": _triple(model_args.get("deltas", 8), "deltas")}


def stream_options(model_args: dict[str, Any], batch_per_rank: int = 1) -> dict[str, Any]:
    """StreamConfig fields set by the spec's model_args (fov_policy, fov_moves, faces_only, move_threshold,
    permutable_axes, reflectable_axes, single_fov_steps), checked; absent keys keep the reference's defaults.
    ``single_fov_steps`` becomes ``single_fov_examples`` = steps × ``batch_per_rank`` (one FOV per example)."""
    out: dict[str, Any] = {}
    if "single_fov_steps" in model_args:
        steps = model_args["single_fov_steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ConfigError(f"single_fov_steps must be an integer >= 0, got {steps!r}",
                              key="model_args.single_fov_steps",
                              hint="the number of first training steps whose examples are one bare-seed FOV each")
        out["single_fov_examples"] = steps * batch_per_rank
    for key, field_name in STREAM_KEYS.items():
        if key not in model_args:
            continue
        value = model_args[key]
        if key == "fov_policy" and value not in ("fixed", "max_pred_moves"):
            raise ConfigError(f"fov_policy {value!r} is not a policy", key="model_args.fov_policy",
                              hint="use fixed or max_pred_moves")
        if key == "fov_moves" and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"fov_moves must be an integer >= 1, got {value!r}", key="model_args.fov_moves")
        if key == "faces_only" and not isinstance(value, bool):
            raise ConfigError(f"faces_only must be true or false, got {value!r}", key="model_args.faces_only")
        if key == "move_threshold" and not (isinstance(value, (int, float)) and 0 < value < 1):
            raise ConfigError(f"move_threshold must lie strictly between 0 and 1, got {value!r}",
                              key="model_args.move_threshold")
        if key.endswith("_axes"):
            if not (isinstance(value, list) and all(v in (0, 1, 2) for v in value) and len(set(value)) == len(value)):
                raise ConfigError(f"{key} must be a list of distinct axes 0 (z), 1 (y), 2 (x); got {value!r}",
                                  key=f"model_args.{key}")
            value = tuple(value)
        out[field_name] = value
    return out


def prepare_training_data(data: dict[str, Any], fov: tuple[int, int, int], deltas: tuple[int, int, int],
                          out_dir: Path) -> dict[str, Any]:
    """Materialise the training volume (if synthetic), partitions and coordinates into ``out_dir`` once.

    Returns the prepared description (volume specs, coordinate file, image statistics), also written to
    ``out_dir/prepared.json``; a second call reuses it.
    """
    manifest = out_dir / "prepared.json"
    if manifest.exists():
        return json.loads(manifest.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    train = data.get("train")
    if not isinstance(train, dict):
        raise ConfigError("the FFN needs data.train: {synthetic: {...}} or {image: FILE:DATASET, labels: ...}",
                          key="data.train")
    if train.get("synthetic"):
        synth = dict(train["synthetic"])
        shape = tuple(int(v) for v in synth.pop("shape", (48, 96, 96)))
        image, labels = make_synthetic_volume(shape, int(synth.pop("seed", 0)), **synth)  # type: ignore[arg-type]
        path = write_hdf5(out_dir / "train.h5", image, labels)
        image_spec, labels_spec = f"{path}:image", f"{path}:labels"
    elif "image" in train and "labels" in train:
        image_spec, labels_spec = str(train["image"]), str(train["labels"])
    else:
        raise ConfigError("data.train needs 'synthetic' or both 'image' and 'labels'", key="data.train")
    image_vol, labels_vol = load_image_and_labels(image_spec, labels_spec)
    try:
        if data.get("coordinates"):
            coords_path = Path(str(data["coordinates"]))
            if not coords_path.exists():
                raise DataError(f"coordinates file {coords_path} does not exist",
                                hint="remove data.coordinates to have them prepared from the labels")
        else:
            options = dict(data.get("partitions", {}))
            labels_array = labels_vol.read()
            partitions = compute_partitions(
                labels_array, thresholds=options.get("thresholds", DEFAULT_THRESHOLDS),
                lom_radius=lom_radius_for(fov, deltas), min_size=int(options.get("min_size", 1000)))
            margin = _triple(data.get("margin", [f // 2 + d for f, d in zip(fov, deltas, strict=True)]), "margin")
            coords = build_coordinates(partitions, margin, seed=int(options.get("seed", 0)))
            if len(coords) == 0:
                raise DataError("no training coordinates: the volume is smaller than the FOV plus margins",
                                hint=f"volume {labels_vol.shape}, fov {fov}, deltas {deltas}")
            coords_path = write_coordinates(out_dir / "coordinates.npz", coords)
        sample = image_vol.read().astype(np.float64)
        prepared = {"image": image_spec, "labels": labels_spec, "coordinates": str(coords_path),
                    "image_mean": float(sample.mean()), "image_stddev": float(sample.std() or 1.0)}
    finally:
        image_vol.close()
        labels_vol.close()
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps(prepared, indent=2))
    os.replace(tmp, manifest)
    return prepared


class FFNTask(TrainingTask):
    """One rank's FFN: ConvStack3D plus an ExampleStream over this rank's coordinate shard."""

    sample_unit = "FOVs"

    def __init__(self, ctx: TaskContext) -> None:
        cfg = model_config(ctx.model_args)
        self.fov, self.deltas = cfg["fov"], cfg["deltas"]
        data_dir = ctx.run_dir / "data"
        if ctx.rank == 0:
            prepare_training_data(ctx.data, self.fov, self.deltas, data_dir)
        ctx.barrier()
        prepared = prepare_training_data(ctx.data, self.fov, self.deltas, data_dir)
        self.image_mean = float(ctx.model_args.get("image_mean", prepared["image_mean"]))
        self.image_stddev = float(ctx.model_args.get("image_stddev", prepared["image_stddev"]))
        self.clip = float(ctx.model_args.get("clip", GRADIENT_CLIP))
        torch.manual_seed(ctx.seed)
        self.model = ConvStack3D(depth=cfg["depth"], features=cfg["features"], fov=self.fov)
        if ctx.device.type == "cpu":
            # Channels-last weights + oneDNN convolutions: ~15-40 % faster steps, the same float32 sums up to
            # their order (docs/ffn_speed.md); state_dict keys and checkpoints are unchanged.
            from hpctrain.ffn.perf import tune_for_cpu

            tune_for_cpu(self.model)
        self.model_args = {**cfg, "fov": list(self.fov), "deltas": list(self.deltas),
                           "image_mean": self.image_mean, "image_stddev": self.image_stddev}
        self.image, self.labels = load_image_and_labels(prepared["image"], prepared["labels"])
        self.coords = read_coordinates(prepared["coordinates"])
        if len(self.coords) < ctx.world_size:
            raise DataError(f"{len(self.coords)} training coordinates cannot be shared by {ctx.world_size} ranks")
        self.rank, self.world_size, self.seed = ctx.rank, ctx.world_size, ctx.seed
        self.batch = ctx.batch_per_rank
        self._stream_config = StreamConfig(fov=self.fov, deltas=self.deltas, batch_size=self.batch,
                                           image_mean=self.image_mean, image_stddev=self.image_stddev,
                                           seed=ctx.seed + ctx.rank,
                                           **stream_options(ctx.model_args, ctx.batch_per_rank))
        self._open_stream(0)

    def _open_stream(self, consumed: int) -> None:
        self._consumed_at_open = consumed
        coords = epoch_coordinates(self.coords, self.rank, self.world_size, self.seed, start=consumed)
        self.stream = ExampleStream(self.image, self.labels, coords, self._stream_config, examples_before=consumed)

    @property
    def samples_per_step(self) -> int:
        return self.batch

    def next_batch(self) -> Any:
        return self.stream.next_batch()

    def forward_loss(self, batch: Any) -> tuple[torch.Tensor, Any]:
        logits = self.model(batch.inputs())
        return fov_loss(logits, batch.labels), logits.detach()

    def clip_gradients(self) -> None:
        """Per-element clipping as in google/ffn, applied by the runtime after the reduction."""
        clip_gradients_(self.model, self.clip)

    def observe(self, batch: Any, aux: Any) -> dict[str, float]:
        self.stream.update(aux)
        return {}

    def interval_metrics(self) -> dict[str, float]:
        counts = self.stream.reset_counts()
        return {**counts.metrics(), "examples": float(counts.examples)}

    def state_dict(self) -> dict[str, Any]:
        # Examples in flight are not saved: a resumed run restarts at the next unstarted coordinate.
        return {"coordinates_consumed": self._consumed_at_open + self.stream.examples_started,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position; one saved by another world size keeps the epoch and the fraction of it done."""
        consumed = int(state["coordinates_consumed"])
        world = int(state.get("world_size", self.world_size))
        if world != self.world_size:
            consumed = resharded_start(consumed, len(self.coords), world, self.world_size)
        self._open_stream(consumed)


def resharded_start(consumed: int, count: int, old_world: int, new_world: int) -> int:
    """A rank's ``start`` for ``epoch_coordinates`` on ``new_world`` ranks from one rank's count on ``old_world``:
    the same epoch, and the same share of it done (shards are drawn anew per world size, so not exact)."""
    old_per_rank, new_per_rank = count // old_world, count // new_world
    if old_per_rank == 0 or new_per_rank == 0:
        return 0
    epoch, within = divmod(consumed, old_per_rank)
    return epoch * new_per_rank + min(new_per_rank, within * new_per_rank // old_per_rank)
