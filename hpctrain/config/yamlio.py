"""YAML loading that remembers where every key came from.

Errors in site profiles and job specs must name the file and line, so loading returns the data together
with a map from key paths to line numbers. Sexagesimal integers are disabled: ``walltime: 01:00:00``
stays the string the user wrote instead of becoming 3600.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpctrain.errors import ConfigError

KeyPath = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 base-60 integers and floats (``1:30`` is a string, not 90)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
    r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


class LoadedYaml:
    """Parsed YAML data plus the line (1-based) of every mapping key and sequence item."""

    def __init__(self, data: Any, lines: dict[KeyPath, int], path: str) -> None:
        self.data = data
        self.lines = lines
        self.path = path

    def line_of(self, key_path: KeyPath) -> int | None:
        """Line of the deepest known prefix of ``key_path`` (the key itself when it exists)."""
        for cut in range(len(key_path), -1, -1):
            line = self.lines.get(tuple(key_path[:cut]))
            if line is not None:
                return line
        return None


def _walk(node: yaml.Node, prefix: KeyPath, lines: dict[KeyPath, int], path: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"key {key!r} appears twice (first on line {seen[key]})",
                    path=path,
                    line=line,
                    key=".".join(map(str, prefix + (key,))),
                    hint="keep one of them",
                )
            seen[key] = line
            lines[prefix + (key,)] = line
            _walk(value_node, prefix + (key,), lines, path)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[prefix + (index,)] = item.start_mark.line + 1
            _walk(item, prefix + (index,), lines, path)


def parse_yaml(text: str, path: str) -> LoadedYaml:
    """Parse YAML text; syntax errors become a ConfigError naming the file and line."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return LoadedYaml({}, {}, path)
        lines: dict[KeyPath, int] = {(): node.start_mark.line + 1}
        _walk(node, (), lines, path)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(
            f"not valid YAML: {exc.problem or exc}", path=path, line=line, hint="check indentation and quoting"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", path=path) from None
    finally:
        loader.dispose()
    return LoadedYaml(data, lines, path)


def load_yaml_file(path: str | Path) -> LoadedYaml:
    """Read and parse a YAML file; a missing or unreadable file is a ConfigError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", path=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", path=str(p)) from None
    return parse_yaml(text, str(p))
