"""The Flood-Filling Network's ``model_args`` and ``data`` (``model: ffn``), checked without torch or numpy.

``hpctrain.ffn.training.task`` builds the model and the training-example stream from these validated values; the
preflight uses the same models to refuse, on the laptop, a FOV that is even-sized, a policy that does not
exist or a training volume too small to hold one training box.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from hpctrain.config.common import FieldProblem, Strict
from hpctrain.config.job import JobSpec
from hpctrain.config.plugin import ModelSchema
from hpctrain.config.plugins.ffn_fields import FovSize, Fraction, Offsets, Shape, Zyx, deltas_problem
from hpctrain.config.plugins.ffn_inference import InferenceSettings
from hpctrain.config.plugins.ffn_volumes import VolumeRef, parse_volume_spec, reader_module, source_shape
from hpctrain.errors import ConfigError

GRADIENT_CLIP = 0.7  # google/ffn max_gradient_entry_mag
DEFAULT_SYNTHETIC_SHAPE: Zyx = (48, 96, 96)


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def _axes(axes: tuple[int, ...]) -> tuple[int, ...]:
    if any(a not in (0, 1, 2) for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"must be distinct axes 0 (z), 1 (y), 2 (x); got {list(axes)}")
    return axes


def _thresholds(values: tuple[float, ...]) -> tuple[float, ...]:
    if not values or any(not 0 < v < 1 for v in values) or list(values) != sorted(set(values)):
        raise ValueError("must be increasing fractions strictly between 0 and 1, e.g. [0.1, 0.5, 0.9]")
    return values


Axes = Annotated[tuple[int, ...], BeforeValidator(_as_tuple), AfterValidator(_axes)]


class FFNModelArgs(Strict):
    """``model_args`` of ``model: ffn``: the ConvStack3D and google/ffn train.py's training-example options."""

    depth: int = Field(9, ge=1, description="Convolution modules (ConvStack3D depth)")
    features: int = Field(32, ge=1, description="Feature maps per convolution")
    dilations: Annotated[tuple[int, ...], BeforeValidator(_as_tuple)] | None = Field(
        None, description="Dilation of each residual module's convolutions, depth - 1 values >= 1 (default: all 1, "
        "the reference); the receptive field grows by 4 x dilation per module at the same cost")
    fov: FovSize = Field((33, 33, 33), description="Field of view (z, y, x), odd sizes; one integer for a cube")
    deltas: Offsets = Field((8, 8, 8), description="FOV movement step (z, y, x)")
    fov_policy: Literal["fixed", "max_pred_moves"] = Field("fixed", description="--fov_policy")
    fov_moves: int = Field(1, ge=1, description="--fov_moves (max_pred_moves only)")
    faces_only: bool = Field(False, description="fixed policy: the 6 face shifts instead of all 26")
    move_threshold: Fraction = Field(0.9, description="--threshold: probability needed to move the FOV there")
    permutable_axes: Axes = Field((1, 2), description="--permutable_axes (0 = z, 1 = y, 2 = x)")
    reflectable_axes: Axes = Field((0, 1, 2), description="--reflectable_axes")
    single_fov_steps: int = Field(0, ge=0, description="First steps train on bare-seed FOVs only (no movement)")
    single_fov_size: FovSize | None = Field(None, description="FOV of those bare-seed steps (default: fov)")
    image_mean: float | None = Field(None, description="Image normalisation (default: the training volume's)")
    image_stddev: float | None = Field(None, gt=0, description="Image normalisation (default: the volume's)")
    clip: float = Field(GRADIENT_CLIP, gt=0, description="Per-element gradient clip after the reduction")
    boundary_weight: float = Field(0.0, ge=0, description="Loss weight added to voxels within boundary_radius of "
                                   "the seed object's edge in the FOV (0: google/ffn's unweighted loss)")
    boundary_radius: int = Field(2, ge=1, le=8, description="Voxels from the object's edge that boundary_weight "
                                 "weights, on either side")

    @model_validator(mode="after")
    def _dilations_match_depth(self) -> FFNModelArgs:
        if self.dilations is not None and (len(self.dilations) != self.depth - 1 or min(self.dilations, default=1) < 1):
            raise ValueError(f"dilations {list(self.dilations)} needs one value >= 1 per residual module: "
                             f"{self.depth - 1} values for depth {self.depth}")
        return self

    @model_validator(mode="after")
    def _deltas_inside_fov(self) -> FFNModelArgs:
        problem = deltas_problem(self.fov, self.deltas)
        if problem:
            raise FieldProblem(("deltas",), f"{problem}; use smaller deltas or a larger fov")
        return self

    @model_validator(mode="after")
    def _single_fov_fits(self) -> FFNModelArgs:
        if self.single_fov_size is not None and any(s > f for s, f in zip(self.single_fov_size, self.fov, strict=True)):
            raise ValueError(f"single_fov_size {list(self.single_fov_size)} must not exceed fov {list(self.fov)}")
        return self

    @model_validator(mode="after")
    def _permutable_axes_match(self) -> FFNModelArgs:
        box = self.training_box()
        for i, a in enumerate(self.permutable_axes):
            for b in self.permutable_axes[i + 1:]:
                if box[a] != box[b]:
                    raise ValueError(f"permutable_axes {a} and {b} need the same FOV and deltas on both axes "
                                     f"(training box {list(box)}); drop one of them from permutable_axes")
        return self

    def training_box(self) -> Zyx:
        """Box read per example: fov + 2 x deltas x moves (google/ffn train_image_size)."""
        moves = self.fov_moves + 1 if self.fov_policy == "max_pred_moves" else 1
        return tuple(f + 2 * d * moves for f, d in zip(self.fov, self.deltas, strict=True))  # type: ignore[return-value]

    def box_margin(self) -> Zyx:
        """Distance from the border a training centre needs so that its box stays inside the volume."""
        return tuple(s // 2 for s in self.training_box())  # type: ignore[return-value]

    def lom_radius(self) -> Zyx:
        """google/ffn's recommended partition radius: fov // 2 + deltas (z, y, x)."""
        return tuple(f // 2 + d for f, d in zip(self.fov, self.deltas, strict=True))  # type: ignore[return-value]


class SyntheticVolume(Strict):
    """A synthetic EM volume (hpctrain.ffn.synthetic.make_synthetic_volume); unset knobs keep its defaults."""

    shape: Shape = Field(DEFAULT_SYNTHETIC_SHAPE, description="(z, y, x)")
    seed: int = 0
    neurites: int | None = Field(None, ge=1)
    branch_prob: float | None = Field(None, ge=0, le=1)
    blobs: int | None = Field(None, ge=0)
    wiggle: float | None = Field(None, ge=0)
    membrane_contrast: float | None = Field(None, ge=0)
    faint_fraction: float | None = Field(None, ge=0, le=1)
    faint_contrast: float | None = Field(None, ge=0)
    blur_sigma: float | None = Field(None, ge=0)
    noise_sigma: float | None = Field(None, ge=0)
    shading: float | None = Field(None, ge=0)
    membrane_width: int | None = Field(None, ge=2, multiple_of=2, description="Membrane thickness in voxels (2)")
    membrane_on_neighbours: bool | None = Field(None, description="Membranes darker than the objects they "
                                                "separate by the contrast (default false: every membrane voxel "
                                                "starts from one random brightness; measured in docs/ffn_log.md)")

    def options(self) -> dict[str, Any]:
        """The knobs that were set (keyword arguments of make_synthetic_volume besides shape and seed)."""
        return self.model_dump(exclude={"shape", "seed"}, exclude_none=True)


class _VolumeSource(Strict):
    synthetic: SyntheticVolume | None = None
    image: str | VolumeRef | None = Field(None, description="FILE.h5:DATASET, a .zarr, or {path, dataset}")
    labels: str | VolumeRef | None = Field(None, description="Ground-truth object ids, same shape as the image")

    @model_validator(mode="after")
    def _one_source(self) -> _VolumeSource:
        files = self.image is not None or self.labels is not None
        if self.synthetic is not None and files:
            raise ValueError("give either synthetic or image + labels, not both")
        if self.synthetic is None and (self.image is None or self.labels is None):
            raise ValueError("needs synthetic: {shape: [z, y, x]} or both image and labels")
        return self


class TrainVolume(_VolumeSource):
    """``data.train``: the labelled training volume."""


def _candidates(values: tuple[float, ...]) -> tuple[float, ...]:
    if not values or len(set(values)) != len(values):
        raise ValueError("give one or more distinct candidate values, e.g. [0.7, 0.8, 0.9]")
    return values


Candidates = Annotated[tuple[Fraction, ...], BeforeValidator(_as_tuple), AfterValidator(_candidates)]


# Settings a join fit's flood takes from the checkpoint or makes itself, never from fit_joins.inference.
FIT_FLOOD_FIXED = ("fov", "deltas", "image_mean", "image_stddev", "join_model", "agglomerate_threshold")


class JoinFit(Strict):
    """``data.eval.tune.fit_joins``: a join model (``hpctrain.ffn.inference.join_model``) fitted for each trained model
    on the pieces of a labelled volume before the thresholds are chosen; the join threshold is then a probability."""

    volume: _VolumeSource | None = Field(None, description="labelled volume to fit on, like data.train (default: "
                                                           "the training volume)")
    crop: Shape | None = Field(None, description="central crop of that volume (default: all of it)")
    inference: InferenceSettings | None = Field(
        None, description="data.eval.inference settings this flood changes (e.g. self_prediction: 0, half the model "
                          "calls); where the thresholds are chosen on the same volume they are chosen on this flood")

    @field_validator("inference")
    @classmethod
    def _flood_settings_only(cls, value: InferenceSettings | None) -> InferenceSettings | None:
        fixed = sorted(k for k in FIT_FLOOD_FIXED if value is not None and getattr(value, k) is not None)
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot differ for the join fit's flood (the FOV and normalisation "
                             "come from the checkpoint, the fit makes the join model and its threshold): remove "
                             "them here")
        return value


class InferenceTuning(Strict):
    """``data.eval.tune``: inference thresholds chosen for each trained model on a labelled volume
    (``hpctrain.ffn.inference.tuning``): every combination of the candidates segments (a central crop of) ``volume`` —
    ``data.train`` when it is not given — and the lowest VOI against its labels wins (``hpctrain demo``,
    ``hpctrain ffn tune``)."""

    move_threshold: Candidates | None = Field(None, description="candidate move thresholds")
    segment_threshold: Candidates | None = Field(None, description="candidate segment thresholds")
    agglomerate_threshold: Candidates | None = Field(None, description="candidate join thresholds (no model "
                                                                       "calls: applied to one flood's pair scores)")
    crop: Shape | None = Field(None, description="central crop of the volume segmented per candidate "
                                                 "(default: all of it)")
    volume: _VolumeSource | None = Field(None, description="labelled volume the candidates are tried on, like "
                                         "data.train (default: the training volume); a validation volume in the "
                                         "condition the model will segment chooses better")
    fit_joins: JoinFit | None = Field(None, description="fit a join model on a labelled volume first and join "
                                                        "pieces by its probability (candidates: probabilities)")

    @model_validator(mode="after")
    def _something(self) -> InferenceTuning:
        if not (self.move_threshold or self.segment_threshold or self.agglomerate_threshold):
            raise ValueError("name at least one of move_threshold, segment_threshold, agglomerate_threshold")
        return self

    def fit_flood_settings(self) -> dict[str, Any]:
        """``fit_joins.inference`` as InferenceConfig keys and values: what the join fit's flood changes ({} where
        nothing is given, or no join model is fitted)."""
        fit = self.fit_joins
        return fit.inference.model_dump(exclude_none=True) if fit is not None and fit.inference is not None else {}

    def grid(self) -> dict[str, list[float]]:
        """The candidates by InferenceConfig key (``hpctrain.ffn.inference.tuning.tune_inference``'s ``grid``)."""
        return {k: list(v) for k, v in (("move_threshold", self.move_threshold),
                                        ("segment_threshold", self.segment_threshold),
                                        ("agglomerate_threshold", self.agglomerate_threshold)) if v}


class EvalVolume(_VolumeSource):
    """``data.eval``: a held-out volume and the segmentation settings used on it (``hpctrain demo``)."""

    inference: InferenceSettings | None = None
    tune: InferenceTuning | None = None


class Partitions(Strict):
    """``data.partitions``: how training coordinates are balanced (google/ffn compute_partitions)."""

    thresholds: Annotated[tuple[float, ...], BeforeValidator(_as_tuple), AfterValidator(_thresholds)] | None = \
        Field(None, description="Active-fraction thresholds (default: google/ffn's)")
    min_size: int = Field(1000, ge=0, description="Objects smaller than this (voxels) become background")
    seed: int = 0


class FFNData(Strict):
    """``data`` of ``model: ffn``."""

    train: TrainVolume
    eval: EvalVolume | None = None
    coordinates: str | None = Field(None, description="Prepared training coordinates (.npz); skips partitions")
    partitions: Partitions = Field(default_factory=Partitions)
    margin: Offsets | None = Field(None, description="Training centres' distance from the border "
                                                     "(default: half the training box)")


def volume_paths(prefix: str, source: _VolumeSource | None) -> dict[str, str]:
    """``{prefix.image: file, prefix.labels: file}`` of a volume source given as files."""
    if source is None:
        return {}
    return {f"{prefix}.{key}": str(parse_volume_spec(spec)[0])
            for key, spec in (("image", source.image), ("labels", source.labels)) if spec is not None}


class FFNSchema(ModelSchema):
    model_args = FFNModelArgs
    data = FFNData

    def data_paths(self, args: FFNModelArgs, data: FFNData) -> dict[str, str]:
        paths = {**volume_paths("data.train", data.train), **volume_paths("data.eval", data.eval)}
        if data.eval is not None and data.eval.tune is not None:
            paths.update(volume_paths("data.eval.tune.volume", data.eval.tune.volume))
            if data.eval.tune.fit_joins is not None:
                paths.update(volume_paths("data.eval.tune.fit_joins.volume", data.eval.tune.fit_joins.volume))
        if data.coordinates:
            paths["data.coordinates"] = data.coordinates
        return paths

    def check(self, args: FFNModelArgs, data: FFNData, job: JobSpec, world_size: int) -> list[str]:
        if data.margin is not None and any(m < b for m, b in zip(data.margin, args.box_margin(), strict=True)):
            raise ConfigError(
                f"margin {list(data.margin)} is smaller than half the training box {list(args.training_box())} "
                f"(FOV {list(args.fov)} + 2 x deltas {list(args.deltas)} per move): boxes around centres near the "
                "border would leave the volume", key="data.margin",
                hint=f"use at least {list(args.box_margin())}, or leave data.margin out")
        synthetic = data.train.synthetic
        if synthetic is not None:
            check_training_shape(synthetic.shape, args, data, key="data.train.synthetic.shape")
        fov, deltas, where = inference_geometry(args, data)
        problem = deltas_problem(fov, deltas)
        if problem:
            raise ConfigError(f"inference {problem}", key=where,
                              hint="make data.eval.inference.deltas smaller or its fov larger")
        for key, shape in _inference_boxes(data):
            check_inference_shape(shape, fov, key=key)
        warnings = []
        if args.single_fov_steps >= job.train.steps > 0:
            warnings.append(f"model_args.single_fov_steps ({args.single_fov_steps}) >= train.steps "
                            f"({job.train.steps}): every step trains on bare-seed FOVs, FOV movement is never trained")
        return warnings


    def check_files(self, args: FFNModelArgs, data: FFNData) -> list[str]:
        """Open each image + labels pair given as files (headers only) with the ranks' reader: a missing dataset,
        a file that is not HDF5 (or zarr), wrong dtypes, image and labels of different shapes, a training volume
        too small for one training box or an eval volume smaller than the FOV fail here."""
        fov, _, _ = inference_geometry(args, data)
        sources = [("data.train", data.train)]
        if data.eval is not None:
            sources.append(("data.eval", data.eval))
            if data.eval.tune is not None:
                sources.append(("data.eval.tune.volume", data.eval.tune.volume))
                if data.eval.tune.fit_joins is not None:
                    sources.append(("data.eval.tune.fit_joins.volume", data.eval.tune.fit_joins.volume))
        notes: list[str] = []
        for key, source in sources:
            if source is None or source.image is None or source.labels is None:
                continue
            readers = sorted({reader_module(source.image), reader_module(source.labels)})
            missing = [name for name in readers if importlib.util.find_spec(name) is None]
            if missing:
                notes.append(f"{key}: {' and '.join(missing)} is not installed here, so the files' datasets and "
                             "shapes were not checked (the ranks check them when they start)")
                continue
            shape = source_shape(key, source.image, source.labels)
            if key == "data.train":
                check_training_shape(shape, args, data, key="data.train.image", size_of="the file's volume")
            else:  # the eval volume, or one the thresholds or the join model are fitted on
                check_inference_shape(shape, fov, key=f"{key}.image")
        return notes


def _inference_boxes(data: FFNData) -> list[tuple[str, Sequence[int]]]:
    """The volumes and crops known before the job runs that the trained model floods, by key."""
    boxes: list[tuple[str, Sequence[int]]] = []
    ev = data.eval
    if ev is None:
        return boxes
    if ev.synthetic is not None:
        boxes.append(("data.eval.synthetic.shape", ev.synthetic.shape))
    tune = ev.tune
    for prefix, part in (("data.eval.tune", tune), ("data.eval.tune.fit_joins", tune.fit_joins if tune else None)):
        if part is None:
            continue
        if part.volume is not None and part.volume.synthetic is not None:
            boxes.append((f"{prefix}.volume.synthetic.shape", part.volume.synthetic.shape))
        if part.crop is not None:
            boxes.append((f"{prefix}.crop", part.crop))
    return boxes


def inference_geometry(args: FFNModelArgs, data: FFNData) -> tuple[Zyx, Zyx, str]:
    """The FOV and deltas the trained model floods with (data.eval.inference's, else model_args'), and the key
    that set the deltas."""
    settings = data.eval.inference if data.eval is not None else None
    fov = settings.fov if settings is not None and settings.fov is not None else args.fov
    if settings is not None and settings.deltas is not None:
        return fov, settings.deltas, "data.eval.inference.deltas"
    where = "data.eval.inference.fov" if settings is not None and settings.fov is not None else "model_args.deltas"
    return fov, args.deltas, where


def check_training_shape(shape: Sequence[int], args: FFNModelArgs, data: FFNData, *, key: str,
                         size_of: str = "a training volume") -> None:
    """Refuse a training volume of ``shape`` that cannot hold one training box around a centre (the ranks find
    no training coordinates in it)."""
    inner = [max(m, r) for m, r in zip(training_margin(args, data), args.lom_radius(), strict=True)]
    need = [2 * i + 1 for i in inner]
    if any(s < n for s, n in zip(shape, need, strict=True)):
        raise ConfigError(
            f"{size_of} of {list(shape)} cannot hold one training box: centres need {inner} voxels to every border "
            f"(FOV {list(args.fov)}, deltas {list(args.deltas)}), so every axis needs at least {need}", key=key,
            hint="enlarge the volume or make model_args.fov / deltas smaller")


def check_inference_shape(shape: Sequence[int], fov: Sequence[int], *, key: str) -> None:
    """Refuse a volume (or crop) smaller than the FOV the model floods it with (the inference Canvas's rule)."""
    if any(int(s) < int(f) for s, f in zip(shape, fov, strict=True)):
        raise ConfigError(f"a volume of {list(shape)} to segment is smaller than the FOV {list(fov)}", key=key,
                          hint="use a larger volume (or crop) or a smaller data.eval.inference.fov")


def training_margin(args: FFNModelArgs, data: FFNData) -> Zyx:
    """Training centres' distance from the border: ``data.margin``, else half the training box."""
    return data.margin if data.margin is not None else args.box_margin()


SCHEMA = FFNSchema()
