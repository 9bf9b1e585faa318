"""The FFN as a training task of the runtime: data preparation once, sharded FOV-movement examples.

Rank 0 prepares the training data into ``RUN_DIR/data/`` (a synthetic volume when the spec asks for one,
partitions, balanced coordinates) exactly once; every rank then streams its own shard of the coordinates.
``model_args`` and ``data`` are read through their schema (hpctrain/config/plugins/ffn.py), the one the
laptop checks a job against before it is submitted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.config.plugin import validate_sections
from hpctrain.config.plugins.ffn import SCHEMA, FFNData, FFNModelArgs, training_margin
from hpctrain.errors import DataError
from hpctrain.ffn.model import ConvStack3D
from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5
from hpctrain.ffn.training.coordinates import (
    DEFAULT_THRESHOLDS,
    build_coordinates,
    compute_partitions,
    lom_radius_for,
    write_coordinates,
)
from hpctrain.ffn.training.loss import clip_gradients_, fov_loss
from hpctrain.ffn.training.node_volume import node_volumes
from hpctrain.ffn.training.shards import CoordinateTable, coordinate_stream, table_path, write_table
from hpctrain.ffn.training.stream import ExampleStream, StreamConfig
from hpctrain.ffn.volume import load_image_and_labels
from hpctrain.files import write_atomic
from hpctrain.models.task import TaskContext, TrainingTask
from hpctrain.runtime.counting import work_counts

# Training volumes up to this size are held in memory (image + labels) instead of read box by box.
IN_MEMORY_BYTES = 512 * 2**20
# model_args key -> StreamConfig field, for the training-example options of google/ffn train.py
STREAM_FIELDS = {"fov_policy": "policy", "fov_moves": "fov_moves", "faces_only": "faces_only",
                 "move_threshold": "threshold", "permutable_axes": "permutable_axes",
                 "reflectable_axes": "reflectable_axes", "single_fov_size": "single_fov"}


def _args(model_args: Mapping[str, Any] | FFNModelArgs) -> FFNModelArgs:
    return model_args if isinstance(model_args, FFNModelArgs) else SCHEMA.parse_model_args(model_args)


def model_config(model_args: Mapping[str, Any] | FFNModelArgs) -> dict[str, Any]:
    """ConvStack3D arguments (depth, features, fov, deltas; dilations when given) from the spec's model_args,
    validated."""
    args = _args(model_args)
    cfg: dict[str, Any] = {"depth": args.depth, "features": args.features, "fov": args.fov, "deltas": args.deltas}
    if args.dilations is not None:
        cfg["dilations"] = list(args.dilations)
    return cfg


def stream_options(model_args: Mapping[str, Any] | FFNModelArgs, batch_per_rank: int = 1) -> dict[str, Any]:
    """StreamConfig fields set by the spec's model_args (absent keys keep StreamConfig's defaults, the
    reference's). ``single_fov_steps`` becomes ``single_fov_examples`` = steps x ``batch_per_rank``."""
    args = _args(model_args)
    given = args.model_fields_set
    out: dict[str, Any] = {field: getattr(args, key) for key, field in STREAM_FIELDS.items() if key in given}
    if "single_fov_steps" in given:
        out["single_fov_examples"] = args.single_fov_steps * batch_per_rank
    return out


def _volume(spec: str | Any) -> str | dict[str, Any]:
    return spec if isinstance(spec, str) else spec.model_dump(exclude_none=True)


def prepare_training_data(data: Mapping[str, Any] | FFNData, fov: Sequence[int], deltas: Sequence[int],
                          out_dir: Path, *, margin: Sequence[int] | None = None) -> dict[str, Any]:
    """Materialise the training volume (if synthetic), partitions and coordinates into ``out_dir`` once.

    ``margin``: training centres' distance from the border (default ``data.margin``, else fov // 2 + deltas,
    half the fixed policy's training box). Returns the prepared description (volume specs, coordinate file,
    image statistics), also written to ``out_dir/prepared.json``; a second call reuses it.
    """
    return prepare_and_hold(data, fov, deltas, out_dir, margin=margin)[0]


def prepare_and_hold(data: Mapping[str, Any] | FFNData, fov: Sequence[int], deltas: Sequence[int],
                     out_dir: Path, *, margin: Sequence[int] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``prepare_training_data``, and the volumes it read whole (``image``, and ``labels`` where it computed the
    partitions; none when ``prepared.json`` already existed): the node copy is written from these, so the shared
    path is read once."""
    if not isinstance(data, FFNData):
        data = validate_sections({"data": (FFNData, data)})["data"]
    manifest = out_dir / "prepared.json"
    if manifest.exists():
        return json.loads(manifest.read_text()), {}
    out_dir.mkdir(parents=True, exist_ok=True)
    synth = data.train.synthetic
    if synth is not None:
        image, labels = make_synthetic_volume(synth.shape, synth.seed, **synth.options())
        path = write_hdf5(out_dir / "train.h5", image, labels)
        image_spec, labels_spec = f"{path}:image", f"{path}:labels"
    else:  # the schema guarantees image and labels when there is no synthetic volume
        image_spec, labels_spec = _volume(data.train.image), _volume(data.train.labels)
    image_vol, labels_vol = load_image_and_labels(image_spec, labels_spec)
    held: dict[str, Any] = {}
    counts = work_counts.active()
    try:
        if data.coordinates:
            coords_path = Path(data.coordinates)
            if not coords_path.exists():
                raise DataError(f"coordinates file {coords_path} does not exist",
                                hint="remove data.coordinates to have them prepared from the labels")
        else:
            options = data.partitions
            labels_array = held["labels"] = labels_vol.read()
            if counts is not None:
                counts.add_input("volume", labels_array.nbytes)
            partitions = compute_partitions(
                labels_array, thresholds=options.thresholds or DEFAULT_THRESHOLDS,
                lom_radius=lom_radius_for(fov, deltas), min_size=options.min_size)
            if margin is None:
                margin = data.margin or lom_radius_for(fov, deltas)
            coords = build_coordinates(partitions, margin, seed=options.seed)
            if len(coords) == 0:
                raise DataError("no training coordinates: the volume is smaller than the FOV plus margins",
                                hint=f"volume {labels_vol.shape}, fov {fov}, deltas {deltas}")
            coords_path = write_coordinates(out_dir / "coordinates.npz", coords)
        image_array = held["image"] = image_vol.read()
        if counts is not None:
            counts.add_input("volume", image_array.nbytes)
        sample = image_array.astype(np.float64)
        # The table every rank reads at its own offsets (ffn/training/shards.py). Its name goes into the manifest: a
        # rank on another node sees its own staged copy of the coordinates, whose time differs from this one's.
        table = write_table(coords_path, out_dir)
        prepared = {"image": image_spec, "labels": labels_spec, "coordinates": str(coords_path),
                    "coordinates_table": table.name,
                    "image_mean": float(sample.mean()), "image_stddev": float(sample.std() or 1.0)}
    finally:
        image_vol.close()
        labels_vol.close()
    write_atomic(manifest, json.dumps(prepared, indent=2))
    return prepared, held


class FFNTask(TrainingTask):
    """One rank's FFN: ConvStack3D plus an ExampleStream over this rank's coordinate shard."""

    sample_unit = "FOVs"

    def __init__(self, ctx: TaskContext) -> None:
        args, data = SCHEMA.parse(ctx.model_args, ctx.data)
        cfg = model_config(args)
        self.fov, self.deltas = args.fov, args.deltas
        data_dir = ctx.run_dir / "data"
        # Centres far enough from the border for the policy's whole training box (max_pred_moves loads more).
        margin = training_margin(args, data)
        error: Exception | None = None
        held: dict[str, Any] = {}  # the volumes rank 0 read while preparing: its node's copy is written from them
        if ctx.rank == 0:
            try:
                held = prepare_and_hold(data, self.fov, self.deltas, data_dir, margin=margin)[1]
            except Exception as exc:  # reported to every rank below, which then all raise it
                error = exc
        ctx.agree(error)  # the others wait here for rank 0: its error (a dataset not found, ...) is theirs too
        prepared = prepare_training_data(data, self.fov, self.deltas, data_dir, margin=margin)
        self.image_mean = args.image_mean if args.image_mean is not None else float(prepared["image_mean"])
        self.image_stddev = args.image_stddev if args.image_stddev is not None else float(prepared["image_stddev"])
        self.clip = args.clip
        self.boundary_weight, self.boundary_radius = args.boundary_weight, args.boundary_radius
        torch.manual_seed(ctx.seed)
        self.model = ConvStack3D(depth=args.depth, features=args.features, fov=self.fov, dilations=args.dilations)
        if ctx.device.type == "cpu":
            # Channels-last weights + oneDNN convolutions: ~15-40 % faster steps, the same float32 sums up to
            # their order (docs/ffn_speed.md); state_dict keys and checkpoints are unchanged. In bfloat16 the
            # convolutions stay torch's own (autocast casts them; the oneDNN wrapper would run them in float32).
            from hpctrain.ffn.perf import tune_for_cpu

            tune_for_cpu(self.model, onednn=ctx.precision == "float32")
        self.model_args = {**cfg, "fov": list(self.fov), "deltas": list(self.deltas),
                           "image_mean": self.image_mean, "image_stddev": self.image_stddev}
        # One process per node reads the volumes from the shared path; the node's ranks map its copy.
        self.image, self.labels = node_volumes(prepared["image"], prepared["labels"], local_rank=ctx.local_rank,
                                               run_dir=ctx.run_dir, barrier=ctx.barrier,
                                               in_memory_bytes=IN_MEMORY_BYTES,
                                               held=held if ctx.local_rank == 0 else None)
        del held
        # Runs prepared before the manifest named the table find it by the coordinates' path, size and time.
        table = prepared.get("coordinates_table") or table_path(prepared["coordinates"], data_dir).name
        self.coords = CoordinateTable(data_dir / table)
        if self.coords.count < ctx.world_size:
            raise DataError(f"{self.coords.count} training coordinates cannot be shared by {ctx.world_size} ranks")
        self.rank, self.world_size, self.seed = ctx.rank, ctx.world_size, ctx.seed
        self.device = ctx.device
        self.batch = ctx.batch_per_rank
        self._stream_config = StreamConfig(fov=self.fov, deltas=self.deltas, batch_size=self.batch,
                                           image_mean=self.image_mean, image_stddev=self.image_stddev,
                                           seed=ctx.seed + ctx.rank,
                                           **stream_options(args, ctx.batch_per_rank))
        self._open_stream(0)

    def _open_stream(self, consumed: int) -> None:
        self._consumed_at_open = consumed
        coords = coordinate_stream(self.coords, self.rank, self.world_size, self.seed, start=consumed)
        self.stream = ExampleStream(self.image, self.labels, coords, self._stream_config, examples_before=consumed)

    @property
    def samples_per_step(self) -> int:
        return self.batch

    def next_batch(self) -> Any:
        """The stream's next FOVs, on the rank's device (the examples themselves stay numpy on the CPU)."""
        batch = self.stream.next_batch()
        return batch if self.device.type == "cpu" else batch.to(self.device)

    def forward_loss(self, batch: Any) -> tuple[torch.Tensor, Any]:
        logits = self.model(batch.inputs()).float()  # float32 under bfloat16 autocast too: the canvas keeps it
        return fov_loss(logits, batch.labels, self.boundary_weight, self.boundary_radius), logits.detach()

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
        # The examples in flight are saved too (canvas, move position, augmentation): a resumed run continues
        # them and ends bit-identical to an uninterrupted one.
        return {"coordinates_consumed": self._consumed_at_open + self.stream.examples_started,
                "world_size": self.world_size, "stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position and the examples in flight. A state saved by another world size keeps the epoch
        and the fraction of it done, and starts fresh examples (its in-flight ones belong to another shard)."""
        consumed = int(state["coordinates_consumed"])
        world = int(state.get("world_size", self.world_size))
        if world != self.world_size:
            self._open_stream(resharded_start(consumed, self.coords.count, world, self.world_size))
            return
        self._open_stream(consumed)
        saved = state.get("stream")
        if saved is not None and len(saved["slots"]) == self.batch:  # another batch size starts fresh examples
            self.stream.load_state_dict(saved)


def resharded_start(consumed: int, count: int, old_world: int, new_world: int) -> int:
    """A rank's ``start`` for ``epoch_coordinates`` on ``new_world`` ranks from one rank's count on ``old_world``:
    the same epoch, and the same share of it done (shards are drawn anew per world size, so not exact)."""
    old_per_rank, new_per_rank = count // old_world, count // new_world
    if old_per_rank == 0 or new_per_rank == 0:
        return 0
    epoch, within = divmod(consumed, old_per_rank)
    return epoch * new_per_rank + min(new_per_rank, within * new_per_rank // old_per_rank)
