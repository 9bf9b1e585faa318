"""The FFN's inference settings, declared once and grouped by the stage that reads them.

A segmentation runs five stages: the ``flood`` (the canvas growing objects from seeds), the ``seeds`` it starts
from, the ``joins`` that turn flooded pieces into objects, the ``fill`` of the voxels left over, and the
``execution`` (device, arithmetic, how FOVs are batched). Each stage takes its group whole. Job specs, the
model package (``inference.json``) and the command line name the settings flat (``move_threshold``,
``linkage``, ...): every key belongs to exactly one group. Torch- and numpy-free: the laptop checks a job's
``data.eval.inference`` with ``InferenceSettings``, derived from the groups below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, create_model, model_validator

from hpctrain.config.common import Strict
from hpctrain.config.plugins.ffn_fields import FovSize, Fraction, Offsets, Share
from hpctrain.config.precision import PrecisionRequest
from hpctrain.errors import ConfigError

JOIN_FEATURES = ("claim", "gap", "brightness_difference", "log_contact", "touch", "membrane_dip")
"""The pair features a join model is over, in order (``hpctrain.ffn.inference.join_model`` computes them)."""
JOIN_MODEL_KEYS = ("features", "mean", "scale", "coef", "intercept")


def join_model_problem(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """(what is wrong, the fix) with a join model's mapping (``JoinModel.as_dict``), or None when it is whole."""
    refit = "fit it again (data.eval.tune.fit_joins, or hpctrain ffn tune --fit-joins IMAGE LABELS)"
    if not isinstance(data, Mapping) or set(data) != set(JOIN_MODEL_KEYS):
        keys = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        return f"needs exactly the keys {list(JOIN_MODEL_KEYS)}, got {keys}", \
            "use the join_model that hpctrain ffn tune --json or hpctrain demo wrote"
    if list(data["features"] or []) != list(JOIN_FEATURES):
        return f"is over features {data['features']}; this hpctrain computes {list(JOIN_FEATURES)}", refit
    try:
        vectors = [[float(v) for v in data[k]] for k in ("mean", "scale", "coef")]
        float(data["intercept"])
    except (TypeError, ValueError):
        return "mean, scale and coef must be lists of numbers and intercept a number", refit
    if any(len(v) != len(JOIN_FEATURES) for v in vectors):
        return f"mean, scale and coef need {len(JOIN_FEATURES)} numbers each, one per feature", refit
    if min(vectors[1]) <= 0:
        return f"scale must be positive, got {vectors[1]}", refit
    return None


def _join_model(value: dict[str, Any] | None) -> dict[str, Any] | None:
    problem = join_model_problem(value) if value is not None else None
    if problem:  # pydantic reports ValueErrors under the key's full path
        raise ValueError(f"{problem[0]} ({problem[1]})")
    return value


JoinModelDict = Annotated[dict[str, Any] | None, AfterValidator(_join_model)]

# google/ffn normalises images as (image - image_mean) / image_stddev; 128 / 33 are its FIB-25 defaults.
DEFAULT_IMAGE_MEAN = 128.0
DEFAULT_IMAGE_STDDEV = 33.0


class _Group(Strict):
    model_config = ConfigDict(**Strict.model_config, frozen=True)


class FloodSettings(_Group):
    """How the canvas grows one object from a seed (google/ffn's ``InferenceOptions`` and the FOV)."""

    fov: FovSize = Field((33, 33, 33), description="field of view (z, y, x), odd sizes (default: the checkpoint's)")
    deltas: Offsets = Field((8, 8, 8), description="FOV movement step (default: the checkpoint's)")
    move_threshold: Fraction = Field(0.9, description="object probability on a FOV face that moves the FOV there")
    segment_threshold: Fraction = Field(0.6, description="object probability that makes a voxel part of it")
    min_segment_size: int = Field(1000, ge=0, description="objects (and split pieces) under this many voxels are "
                                                          "dropped")
    init_activation: Fraction = Field(0.95, description="object probability put at the seed voxel")
    pad_value: Fraction = Field(0.05, description="object probability the model sees where nothing is predicted")
    min_boundary_dist: Offsets = Field((1, 1, 1), description="a seed this close to an object is skipped")
    image_mean: float = Field(DEFAULT_IMAGE_MEAN, description="image normalisation (default: the checkpoint's)")
    image_stddev: float = Field(DEFAULT_IMAGE_STDDEV, gt=0, description="image normalisation (default: the "
                                                                          "checkpoint's)")
    movement_order: Literal["fifo", "score"] = Field("fifo", description="order of the move queue")
    max_seed_distance: int = Field(0, ge=0, description="not in the reference (0: off): FOV centres stay within "
                                   "this many voxels (per axis) of the object's seed, so a flood that leaks through "
                                   "a faint membrane takes a piece of the neighbour, not all of it")
    self_prediction: Share = Field(0.0, description="not in the reference (0: off): a move is refused where the "
                                   "model's answer from a bare seed there claims less than this share of the "
                                   "object's voxels already in the FOV")
    self_prediction_radius: int = Field(0, ge=0, description="the check looks only at voxels within this distance "
                                        "of the FOV centre (0: the whole FOV)")


class SeedSettings(_Group):
    """Where objects are started."""

    seed_policy: Literal["peaks", "grid"] = Field("peaks", description="seed policy (hpctrain.ffn.inference.seeds)")
    seed_args: dict[str, Any] = Field(default_factory=dict, description="the policy's arguments")
    reseed_passes: int = Field(0, ge=0, description="not in the reference (0: off): passes of the peaks policy over "
                               "the voxels still unsegmented after the policy's seeds (segmented ones count as "
                               "edges)")


class JoinSettings(_Group):
    """How flooded objects become pieces and pieces are joined (google/ffn agglomerates after its floods)."""

    split_pieces: bool = Field(False, description="every flooded object split into its 6-connected components, "
                               "those under min_segment_size left unsegmented (google/ffn segmentation.clean_up)")
    agglomerate_threshold: Share = Field(0.0, description="pieces in contact are joined where their score (the "
                                         "mutual bare-seed claim, or the join model's probability) reaches this "
                                         "(0: no agglomeration)")
    min_contact: int = Field(20, ge=0, description="voxel pairs within 3 voxels two pieces need to be scored")
    linkage: Literal["single", "average"] = Field("single", description="single: every pair at the threshold "
                                                  "joins, transitively; average: groups join best first while "
                                                  "the mean score of the pairs between them reaches it")
    join_model: JoinModelDict = Field(None, description="a fitted join model "
                                      "(hpctrain.ffn.inference.join_model.JoinModel.as_dict): pairs are scored by "
                                      "its probability instead of the mutual claim")


class FillSettings(_Group):
    """What happens to the voxels no piece holds."""

    watershed_fill: bool = Field(False, description="every unsegmented voxel goes to the object whose intensity "
                                 "watershed reaches it")


class ExecutionSettings(_Group):
    """Where and how the model runs: the same objects whatever the batching; precision may change them."""

    device: str = Field("cpu", description="torch device of the model")
    precision: PrecisionRequest = Field("float32", description="the model's arithmetic: float32, bfloat16 autocast "
                                        "(logits still float32), or auto: bfloat16 where the device computes it "
                                        "natively (runtime/precision.py); bfloat16 may change the objects")
    concurrent_floods: int = Field(1, ge=1, description="with max_seed_distance set, up to this many objects "
                                   "flooded at once where none reads what another writes, their FOVs in one model "
                                   "call (the same objects)")
    speculative_self_prediction: bool = Field(False, description="with self_prediction, each move's FOV asked in "
                                              "the same model call as its check (the same objects, fewer calls)")


STAGES: dict[str, type[_Group]] = {"flood": FloodSettings, "seeds": SeedSettings, "joins": JoinSettings,
                                   "fill": FillSettings, "execution": ExecutionSettings}
STAGE_OF: dict[str, str] = {key: stage for stage, group in STAGES.items() for key in group.model_fields}


class InferenceConfig(_Group):
    """Settings of one segmentation, one group per stage; built from flat keys by ``from_mapping``."""

    flood: FloodSettings = Field(default_factory=FloodSettings)
    seeds: SeedSettings = Field(default_factory=SeedSettings)
    joins: JoinSettings = Field(default_factory=JoinSettings)
    fill: FillSettings = Field(default_factory=FillSettings)
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings)

    @model_validator(mode="before")
    @classmethod
    def _group_flat_keys(cls, data: Any) -> Any:
        """Flat keys (``InferenceConfig(move_threshold=0.8)``) go to their stage's group."""
        if not isinstance(data, Mapping) or not set(data) & set(STAGE_OF):
            return data
        grouped: dict[str, Any] = {stage: {} for stage in STAGES}
        for key, value in data.items():
            if key in STAGE_OF:
                grouped[STAGE_OF[key]][key] = list(value) if isinstance(value, tuple) else value
            else:
                grouped[key] = value  # a group given whole, or an unknown key (refused)
        return grouped

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None = None, where: str = "inference settings") -> InferenceConfig:
        """From flat keys (``move_threshold: 0.8``, ...); an unknown key or a bad value raises ConfigError naming it
        and, for an unknown key, listing the valid ones."""
        data = dict(data or {})
        unknown = sorted(set(data) - set(STAGE_OF))
        if unknown:
            raise ConfigError(f"unknown inference setting(s) {unknown}", path=where,
                              hint=f"valid keys: {', '.join(STAGE_OF)}")
        try:
            return cls(**data)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'][1:] or err['loc'])}: {err['msg']} "
                                 f"(got {err['input']!r})" for err in e.errors())
            raise ConfigError(f"bad inference setting: {problems}", path=where) from None

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat key (what ``from_mapping`` reads back; tuples as lists for JSON)."""
        out: dict[str, Any] = {}
        for stage in STAGES:
            for key, value in getattr(self, stage).model_dump().items():
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def replace(self, **changes: Any) -> InferenceConfig:
        """These settings with ``changes`` (flat keys), checked as ``from_mapping`` checks them."""
        return InferenceConfig.from_mapping({**self.flat(), **changes}) if changes else self


def _optional(annotation: Any, metadata: list[Any]) -> Any:
    return Annotated[(annotation, *metadata)] | None if metadata else annotation | None


# ``data.eval.inference`` of a job: the same keys flat, each unset one keeping the default above.
InferenceSettings = create_model(  # type: ignore[call-overload]
    "InferenceSettings", __base__=Strict,
    __doc__="``data.eval.inference``: the FFN's inference settings (flat keys of "
            "``config.plugins.ffn_inference``'s stage groups); unset ones keep their defaults.",
    **{key: (_optional(info.annotation, info.metadata), Field(None, description=info.description))
       for group in STAGES.values() for key, info in group.model_fields.items()})
