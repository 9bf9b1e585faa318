"""Turn pydantic validation errors into ConfigErrors that name file, line, key and the fix.

A misspelt key gets a "did you mean" suggestion computed from the fields of the model at that place,
so the list of valid keys is derived from one source: the pydantic models themselves. A key set from the
command line (``--set``, ``--nodes``, ...) is blamed on that flag, not on a line of the file.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hpctrain.config.common import FieldProblem
from hpctrain.config.yamlio import KeyPath, LoadedYaml
from hpctrain.errors import ConfigError, ConfigErrors
from hpctrain.text import printable

M = TypeVar("M", bound=BaseModel)
_SHOWN = 60  # characters of a rejected value repeated in a message
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


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
    """``a.b.0``; a key that is not a plain word is shown quoted, so a newline in it cannot split the line."""
    return ".".join(str(p) if _PLAIN_KEY.fullmatch(str(p)) else repr(p) for p in loc) if loc else "(top level)"


def one_line(text: str) -> str:
    """Text with control and line-separator characters escaped (a flag's value may hold anything)."""
    return printable(text)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + "...'"


def _location(err: Mapping[str, Any], payload: Any) -> tuple[Any, ...]:
    """The error's key path in the data: pydantic's union-member and validator tags (``cores.int``,
    ``function-after[...]``) are left out by walking the path through the data itself."""
    node, loc, parts = payload, [], list(err["loc"])
    for i, part in enumerate(parts):
        if isinstance(node, dict) and part in node:
            loc.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            loc.append(part)
            node = node[part]
        elif err["type"] == "missing" and i == len(parts) - 1:
            loc.append(part)
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        loc += problem.loc
    return tuple(loc)


def _holds(data: Any, loc: tuple[Any, ...]) -> bool:
    """Whether ``data`` has a value at key path ``loc``."""
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return False
    return True


def _extended_owner(loaded: LoadedYaml, extended: Sequence[LoadedYaml], loc: tuple[Any, ...]) -> LoadedYaml | None:
    """The extended file (``extends:``) that holds the value at ``loc``, when the validated file does not."""
    if not loc or _holds(loaded.data, loc):
        return None
    return next((parent for parent in extended if _holds(parent.data, loc)), None)


def _error_for(root: type[BaseModel], loaded: LoadedYaml, payload: Any, err: Mapping[str, Any],
               origins: Mapping[KeyPath, str], extended: Sequence[LoadedYaml] = ()) -> tuple[ConfigError, str]:
    """The error for one pydantic complaint, and the ``(got ...)`` text to end its message with."""
    loc = _location(err, payload)
    owner = _extended_owner(loaded, extended, loc)
    if owner is not None:
        # Another file's keys and values are not repeated: the profile that extends it may not be its owner's.
        return ConfigError("a value of this extended profile is not valid in the profile that extends it",
                           path=owner.path, line=owner.line_of(loc),
                           hint=f"`hpctrain sites validate {owner.path}` shows the details"), ""
    flag = next((one_line(text) for path, text in origins.items() if loc[: len(path)] == path), None)
    where: dict[str, Any] = ({"path": flag} if flag is not None else
                             {"path": loaded.path, "line": loaded.line_of(loc)})
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        valid = sorted(parent.model_fields) if parent else []
        guess = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
        hint = f"did you mean {guess[0]!r}?" if guess else ("valid keys: " + ", ".join(valid) if valid else None)
        if not _PLAIN_KEY.fullmatch(str(loc[-1])):
            # Not a key anyone meant to write (a line of some other file read as YAML): named by its line only.
            return ConfigError("unknown key (not a plain word; not repeated here)", key=_describe(loc[:-1]),
                               hint=f"valid keys: {', '.join(valid)}" if valid else None, **where), ""
        return ConfigError("unknown key", key=_describe(loc), hint=hint, **where), ""
    if kind == "missing":
        return ConfigError("required key is missing", key=_describe(loc), hint=f"add '{loc[-1]}:' here",
                           **where), ""
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    given = err.get("input")
    got = ""
    if not isinstance(given, (dict, list, BaseModel)) and given is not None and not isinstance(
            (err.get("ctx") or {}).get("error"), FieldProblem) and repr(given) not in message:
        got = f" (got {_shown(given)})"
    return ConfigError(one_line(message), key=_describe(loc), **where), got


def _merged(errors: list[tuple[ConfigError, str]]) -> list[ConfigError]:
    """One error per key: a union's members each complain (``int`` and ``'auto'``); say it once."""
    by_key: dict[tuple[str | None, str | None], tuple[ConfigError, str]] = {}
    for e, got in errors:
        slot = (e.path, e.key)
        if slot not in by_key:
            by_key[slot] = (e, got)
        elif e.message not in by_key[slot][0].message:
            by_key[slot][0].message += f", or {e.message}"
    for e, got in by_key.values():
        e.message += got
    return [e for e, _ in by_key.values()]


def validate_model(model: type[M], loaded: LoadedYaml, data: Any = None,
                   origins: Mapping[KeyPath, str] | None = None, extended: Sequence[LoadedYaml] = ()) -> M:
    """Validate ``data`` (default: the loaded YAML) against ``model``; every problem in one ConfigErrors.

    ``origins`` maps key paths set outside the file to what set them (``--nodes 0``): errors under
    those paths name the flag instead of a line of the file. ``extended`` are the files ``data`` merged
    in (``extends:``, nearest first): an error in a value only one of them holds names that file and line.
    """
    payload = loaded.data if data is None else data
    if not isinstance(payload, dict):
        raise ConfigError("the file must hold a mapping of keys (key: value)", path=loaded.path, line=1)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = [_error_for(model, loaded, payload, e, origins or {}, extended)
                  for e in exc.errors(include_url=False)]
        raise ConfigErrors(_merged(errors)) from None
