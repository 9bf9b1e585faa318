"""The inference settings a segmentation runs with, and the model package that carries them with a trained model.

The settings are declared once, by stage, in ``hpctrain.config.plugins.ffn_inference`` (``InferenceConfig``);
this module resolves them for a checkpoint (its FOV, deltas and image normalisation unless the settings name
them) and reads and writes the model package: ``inference.json`` in a run's checkpoint directory, written after
the thresholds and the join model are chosen for the trained model (``hpctrain demo``, ``hpctrain ffn tune``),
so that ``hpctrain ffn segment RUN VOLUME`` segments as the run chose to, with no job spec.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.manifest import STEP_DIR
from hpctrain.config.plugins.ffn_fields import zyx
from hpctrain.config.plugins.ffn_inference import FillSettings, InferenceConfig
from hpctrain.errors import CheckpointError
from hpctrain.files import write_atomic

PACKAGE_FILE = "inference.json"
PACKAGE_SCHEMA = "hpctrain.ffn.inference/2"


def checkpoint_settings(model_args: Mapping[str, Any], ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a checkpoint fixes: the FOV and deltas it was trained with and its image normalisation (top
    level of the checkpoint or ``model_args``), as flat keys; those it does not record are left out."""
    out: dict[str, Any] = {}
    for key in ("fov", "deltas"):
        if key in model_args:
            out[key] = zyx(model_args[key], f"model_args.{key}")
    for key in ("image_mean", "image_stddev"):
        value = ckpt.get(key, model_args.get(key))
        if value is not None:
            out[key] = float(value)
    return out


def flood_only(config: InferenceConfig) -> InferenceConfig:
    """``config`` without the stages that run after the floods of a volume cut into pieces are reconciled: no
    joins, no fill (``subvolume_finish``)."""
    return config.replace(agglomerate_threshold=0.0, watershed_fill=False)


def finishes(config: InferenceConfig) -> bool:
    """Whether ``config`` has stages to run after the floods: joins, or a fill of what they left."""
    return config.joins.agglomerate_threshold > 0 or config.fill != FillSettings()


def find_package(checkpoint: str | Path) -> Path | None:
    """The model package that goes with ``checkpoint`` (a ``step-N/shared.pt`` file or a checkpoint directory):
    ``inference.json`` in the checkpoint directory; None where there is none."""
    path = Path(checkpoint)
    place = _checkpoint_dir(path) if path.is_file() else path
    return place / PACKAGE_FILE if (place / PACKAGE_FILE).is_file() else None


def _checkpoint_dir(checkpoint: Path) -> Path:
    """Where a checkpoint file's package lives: a training run's checkpoint directory for its
    ``step-N/shared.pt``; the file's own directory for a bare checkpoint."""
    return checkpoint.parent.parent if STEP_DIR.fullmatch(checkpoint.parent.name) else checkpoint.parent


def read_package(path: str | Path) -> dict[str, Any]:
    """A model package, checked: its schema, its settings (``InferenceConfig`` keys) and the checkpoint it names
    (made absolute; relative names are to the package's directory)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"model package {path} cannot be read: {e}",
                              hint="choose the settings again: hpctrain ffn tune RUN --volume V.h5:image "
                                   "--labels V.h5:labels") from e
    if not isinstance(data, dict) or data.get("schema") != PACKAGE_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"model package {path} has schema {found!r}; this hpctrain reads {PACKAGE_SCHEMA!r}",
                              hint="choose the settings again with this hpctrain: hpctrain ffn tune RUN ...")
    InferenceConfig.from_mapping(data.get("settings") or {}, where=f"{path}: settings")
    data["checkpoint"] = str((path.parent / str(data.get("checkpoint", ""))).resolve())
    return data


def write_package(checkpoint: str | Path, settings: InferenceConfig, *, model_name: str,
                  chosen: Mapping[str, Any] | None = None, record: Mapping[str, Any] | None = None) -> Path:
    """Write the model package for ``checkpoint`` into its checkpoint directory (beside a bare checkpoint file),
    atomically: every setting (flat keys), the model's name, what was chosen and how (``chosen``, ``record``)."""
    checkpoint = Path(checkpoint).resolve()
    where = _checkpoint_dir(checkpoint)
    package = {"schema": PACKAGE_SCHEMA, "model_name": model_name,
               "checkpoint": os.path.relpath(checkpoint, where), "settings": settings.flat(),
               "chosen": dict(chosen or {}), "record": dict(record or {})}
    path = where / PACKAGE_FILE
    write_atomic(path, json.dumps(package, indent=2, default=str) + "\n")
    return path
