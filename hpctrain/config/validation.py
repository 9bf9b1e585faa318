"""Turn pydantic validation errors into ConfigErrors that name file, line, key and the fix.

A misspelt key gets a "did you mean" suggestion computed from the fields of the model at that place,
so the list of valid keys is derived from one source: the pydantic models themselves.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hpctrain.config.yamlio import LoadedYaml
from hpctrain.errors import ConfigError, ConfigErrors

M = TypeVar("M", bound=BaseModel)


def _inner_models(annotation: Any) -> list[type[BaseModel]]:
    """BaseModel classes reachable from a field annotation (through Optional, dict values, lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_inner_models(arg))
    return found


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class whose fields apply at key path ``loc`` (None when it is not a model)."""
    current: type[BaseModel] | None = root
    pending_container = False
    for part in loc:
        if current is None:
            return None
        if pending_container:
            pending_container = False
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        origin = typing.get_origin(annotation)
        models = _inner_models(annotation)
        current = models[0] if models else None
        if origin in (dict, list) or any(typing.get_origin(a) in (dict, list) for a in typing.get_args(annotation)):
            pending_container = bool(models)
    return current


def _describe(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) if loc else "(top level)"


def _error_for(root: type[BaseModel], loaded: LoadedYaml, err: dict[str, Any]) -> ConfigError:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    line = loaded.line_of(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        valid = sorted(parent.model_fields) if parent else []
        guess = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
        hint = f"did you mean {guess[0]!r}?" if guess else ("valid keys: " + ", ".join(valid) if valid else None)
        return ConfigError("unknown key", path=loaded.path, line=line, key=_describe(loc), hint=hint)
    if kind == "missing":
        return ConfigError("required key is missing", path=loaded.path, line=line, key=_describe(loc),
                           hint=f"add '{loc[-1]}:' here")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    given = err.get("input")
    if not isinstance(given, (dict, list)) and given is not None:
        message = f"{message} (got {given!r})"
    return ConfigError(message, path=loaded.path, line=line, key=_describe(loc))


def validate_model(model: type[M], loaded: LoadedYaml, data: Any = None) -> M:
    """Validate ``data`` (default: the loaded YAML) against ``model``; every problem in one ConfigErrors."""
    payload = loaded.data if data is None else data
    if not isinstance(payload, dict):
        raise ConfigError("the file must hold a mapping of keys (key: value)", path=loaded.path, line=1)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = [_error_for(model, loaded, e) for e in exc.errors(include_url=False)]
        raise ConfigErrors(errors) from None
