"""Where each value of a job spec came from: a line of its YAML file or a command-line flag.

Checks that run after loading (the model plug-ins' schemas, the preflight) know only a key; ``JobOrigin``
names the ``file:line`` or the flag (``--set model_args.depth=-3``) its value came from, the way
``validate_model`` does while loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpctrain.config.yamlio import KeyPath, LoadedYaml
from hpctrain.errors import ConfigError, ConfigErrors


def key_path(key: str) -> KeyPath:
    """``"model_args.fov.0"`` -> ``("model_args", "fov", 0)`` (list indices as ints, as YAML lines record them)."""
    return tuple(int(p) if p.isdigit() else p for p in key.split("."))


@dataclass(frozen=True)
class JobOrigin:
    """The loaded spec file (with the line of every key) and the flags applied on top of it."""

    loaded: LoadedYaml
    # key path -> the flag that set it (``--set train.steps=2``, ``--nodes 4``), as job_from_loaded records them
    flags: Mapping[KeyPath, str] = field(default_factory=dict)

    def flag_for(self, key: KeyPath) -> str | None:
        """The flag that set ``key`` or a mapping above it."""
        return next((text for path, text in self.flags.items() if tuple(key[: len(path)]) == tuple(path)), None)

    def locate(self, error: ConfigError) -> ConfigError:
        """``error`` placed at its key's flag or file line; one that already names a place is kept."""
        if isinstance(error, ConfigErrors):
            return ConfigErrors([self.locate(e) for e in error.errors])
        if error.path or not error.key:
            return error
        key = key_path(error.key)
        flag = self.flag_for(key)
        where, line = (flag, None) if flag else (self.loaded.path, self.loaded.line_of(key))
        return type(error)(error.message, path=where, line=line, key=error.key, hint=error.hint)


def locate(error: ConfigError, origin: JobOrigin | None) -> ConfigError:
    """``origin.locate(error)``, or ``error`` itself for a spec built in Python (no file, no flags)."""
    return origin.locate(error) if origin is not None else error
