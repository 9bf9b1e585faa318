"""Model plug-ins by name (``ffn``, ``resnet``, ``lstm``, ``package.module:factory``) and their schemas, torch-free.

``models/registry.py`` builds the training task named here on the ranks; the preflight finds each plug-in's
``ModelSchema`` here: a built-in's in ``hpctrain/config/plugins/``, a user plug-in's as ``SCHEMA`` in the
torch-free module ``package.module_schema`` beside its factory's module.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from hpctrain.config.backends import Registry
from hpctrain.config.plugin import ModelSchema
from hpctrain.errors import ConfigError

SCHEMA_SUFFIX = "_schema"


@dataclass(frozen=True)
class Builtin:
    """A built-in plug-in: its task class on the ranks (``module:Class``) and the module of its schema."""

    task: str
    schema_module: str

    @property
    def schema(self) -> ModelSchema:
        # Imported when asked for: a job pays for its own model's pydantic models only (CLI start-up).
        return importlib.import_module(self.schema_module).SCHEMA


# The model registry: the built-ins, and any installed package's entry point in the group ``hpctrain.models``
# naming a ``Builtin`` (a spec may also name ``package.module:factory`` directly).
MODELS = Registry("model", "hpctrain.models", {
    "ffn": Builtin("hpctrain.ffn.training.task:FFNTask", "hpctrain.config.plugins.ffn"),
    "resnet": Builtin("hpctrain.models.digits:DigitsTask", "hpctrain.config.plugins.digits"),
    "lstm": Builtin("hpctrain.models.charlm:CharLMTask", "hpctrain.config.plugins.charlm"),
}, key="model")


def unknown_model(model: str) -> ConfigError:
    """The error for a ``model`` that is neither a built-in name nor ``package.module:factory``."""
    guess = difflib.get_close_matches(model, list(MODELS), n=1, cutoff=0.6)
    known = "use one of " + ", ".join(MODELS) + " or package.module:factory"
    return ConfigError(f"unknown model {model!r}", key="model",
                       hint=f"did you mean {guess[0]!r}? {known}" if guess else known)


def schema_module_name(model: str) -> str:
    """``package.module:factory`` -> ``package.module_schema``, where its schema is declared."""
    return model.partition(":")[0] + SCHEMA_SUFFIX


def find_schema(model: str) -> tuple[ModelSchema | None, str | None]:
    """(the plug-in's schema, None), or (None, why it has none) for a user plug-in without one.

    Raises a ConfigError for an unknown name and for a schema module that exists but is broken.
    """
    if model in MODELS:
        return MODELS.load(model).schema, None
    if ":" not in model:
        raise unknown_model(model)
    name = schema_module_name(model)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None, f"no module {name} declares its schema"
        if exc.name and name.startswith(exc.name + "."):
            return None, f"{exc.name} cannot be imported here"
        raise ConfigError(f"cannot import {name}: {exc}", key="model",
                          hint="a schema module must import with hpctrain and pydantic only") from None
    except Exception as exc:  # the user's module is broken: say where, not a traceback
        raise ConfigError(f"importing {name} failed: {type(exc).__name__}: {exc}", key="model") from None
    schema = getattr(module, "SCHEMA", None)
    if not isinstance(schema, ModelSchema):
        raise ConfigError(f"{name}.SCHEMA must be a hpctrain.config.plugin.ModelSchema, "
                          f"got {type(schema).__name__}", key="model",
                          hint="SCHEMA = ModelSchema(model_args=MyArgs, data=MyData)")
    return schema, None
