"""What a model plug-in declares so that a job is checked on the laptop, not after hours in a queue.

A ``ModelSchema`` names the pydantic models of the job spec's ``model_args`` and ``data`` and may add checks
across keys, the dataset's size (batch and epoch checks) and the files the ranks will read. Built-in plug-ins
declare theirs in ``hpctrain/config/plugins/``; a user's ``package.module:factory`` declares one as ``SCHEMA``
in a torch-free sibling module ``package.module_schema`` (see docs/architecture.md, "Model plug-ins").
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, create_model

from hpctrain.config.common import Strict
from hpctrain.config.job import JobSpec
from hpctrain.config.origin import JobOrigin, locate
from hpctrain.config.validation import validate_model
from hpctrain.config.yamlio import LoadedYaml
from hpctrain.errors import ConfigError


class NoKeys(Strict):
    """A section the plug-in reads nothing from: any key in it is an error."""


class ModelSchema:
    """A plug-in's ``model_args`` and ``data`` models; subclasses override the hooks that apply to them.

    Hooks receive the validated sections (instances of ``model_args`` and ``data``). ``check`` raises a
    ConfigError naming the key (``model_args.fov``) for what cannot run, and returns warnings for what runs
    but is probably not meant.
    """

    model_args: type[BaseModel] = NoKeys
    data: type[BaseModel] = NoKeys

    def __init__(self, model_args: type[BaseModel] | None = None, data: type[BaseModel] | None = None) -> None:
        if model_args is not None:
            self.model_args = model_args
        if data is not None:
            self.data = data

    def parse(self, model_args: Mapping[str, Any], data: Mapping[str, Any],
              origin: JobOrigin | None = None) -> tuple[Any, Any]:
        """Both sections validated; every problem in one ConfigErrors naming the file line (or flag) and key."""
        parsed = validate_sections({"model_args": (self.model_args, model_args), "data": (self.data, data)}, origin)
        return parsed["model_args"], parsed["data"]

    def parse_model_args(self, model_args: Mapping[str, Any], origin: JobOrigin | None = None) -> Any:
        """``model_args`` alone validated (for tools that read no data, e.g. a checkpoint's FOV)."""
        return validate_sections({"model_args": (self.model_args, model_args)}, origin)["model_args"]

    def dataset_size(self, args: Any, data: Any) -> int | None:
        """Samples in one epoch of the training data, where known before the job runs."""
        return None

    def data_paths(self, args: Any, data: Any) -> dict[str, str]:
        """Files and directories the ranks will read: ``{key: path}`` (``data.train.image`` -> the .h5 file)."""
        return {}

    def check_files(self, args: Any, data: Any) -> list[str]:
        """Checks of the data files' contents (format, dataset names, shapes), run where the files are visible
        (the job runs on this machine) after ``data_paths`` were found to exist; returns notes (what could not
        be checked here), raises ConfigError naming the key. Read headers, not the data: it runs on a laptop."""
        return []

    def check(self, args: Any, data: Any, job: JobSpec, world_size: int) -> list[str]:
        """Checks across keys and against the rest of the job; returns warnings, raises ConfigError."""
        return []


@cache
def _sections_model(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[BaseModel]:
    fields: dict[str, Any] = {name: (model, ...) for name, model in sections}
    return create_model("Sections", __base__=Strict, **fields)


def validate_sections(sections: Mapping[str, tuple[type[BaseModel], Mapping[str, Any]]],
                      origin: JobOrigin | None = None) -> dict[str, Any]:
    """``{key: (model, values)}`` -> ``{key: validated model}``; errors are keyed ``key.field`` and placed by
    ``origin`` at their file line or flag."""
    model = _sections_model(tuple((name, cls) for name, (cls, _) in sections.items()))
    payload = {name: dict(values) for name, (_, values) in sections.items()}
    try:
        # Validated as if from nowhere, then placed: the key's flag if one set it, else its line in the file.
        parsed = validate_model(model, LoadedYaml(payload, {}, ""), payload)
    except ConfigError as exc:
        raise locate(exc, origin) from None
    return {name: getattr(parsed, name) for name in sections}
