"""YAML loading that remembers where every key came from, within limits that hostile files cannot break.

Errors in site profiles and job specs must name the file and line, so loading returns the data together
with a map from key paths to line numbers. Sexagesimal integers are disabled: ``walltime: 01:00:00``
stays the string the user wrote instead of becoming 3600. File size, nesting depth and the number of values
after alias expansion are bounded, so a "billion laughs" file is refused in milliseconds, not swapped to death.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpctrain.config.numbers import MAX_DIGITS
from hpctrain.errors import ConfigError
from hpctrain.files import NotRegularFile, read_regular_bytes

KeyPath = tuple[str | int, ...]

# The largest shipped profile is ~3 KB; a configuration file a thousand times that is a mistake or an attack.
MAX_BYTES = 1 << 20
# Real specs nest 4 levels; PyYAML's composer recurses per level, so depth is checked on the event stream first.
MAX_DEPTH = 64
# Values after expanding aliases (each scalar, list and mapping counts one).
MAX_VALUES = 100_000
# Double-quoted escapes ("\0", "\ud800") can make text that no script, file name or environment variable
# can carry: NUL, and unpaired surrogates (not encodable as UTF-8).
_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")
_UNWRITABLE_TEXT = "a {} cannot hold a NUL character or an unpaired surrogate (\\0, \\ud800-\\udfff)"


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
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError("a key must be a plain word, not a list or mapping", path=path, line=line,
                                  key=".".join(map(str, prefix)) or None, hint="write the key as text")
            key = key_node.value
            if _UNWRITABLE.search(key):
                raise ConfigError(_UNWRITABLE_TEXT.format("key"), path=path, line=line,
                                  key=".".join(map(str, prefix)) or None, hint="remove it")
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
    elif isinstance(node, yaml.ScalarNode) and _UNWRITABLE.search(node.value):
        raise ConfigError(_UNWRITABLE_TEXT.format("value"), path=path, line=node.start_mark.line + 1,
                          key=".".join(map(str, prefix)) or None, hint="remove it")
    elif isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int" and (
            sum(ch.isdigit() for ch in node.value) > MAX_DIGITS):
        raise ConfigError(f"an integer of more than {MAX_DIGITS} digits is not a count of anything", path=path,
                          line=node.start_mark.line + 1, key=".".join(map(str, prefix)) or None,
                          hint="write the number the field needs")


def _check_depth(text: str, path: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH before the (recursive) composer sees the document."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"lists and mappings nest deeper than {MAX_DEPTH} levels", path=path,
                                  line=event.start_mark.line + 1, hint="a configuration file never needs this")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _expanded_size(node: yaml.Node, path: str) -> int:
    """Values in the document once every alias is expanded; refuses more than MAX_VALUES and cycles."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ConfigError("an alias refers to the list or mapping that contains it", path=path,
                              line=n.start_mark.line + 1, hint="YAML aliases may not form a cycle")
        open_nodes.add(key)
        children: list[yaml.Node] = []
        if isinstance(n, yaml.MappingNode):
            children = [part for pair in n.value for part in pair]
        elif isinstance(n, yaml.SequenceNode):
            children = list(n.value)
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_VALUES:
                raise ConfigError(f"the document expands to more than {MAX_VALUES} values", path=path,
                                  line=n.start_mark.line + 1,
                                  hint="YAML aliases (*name) repeat their anchor's content; write less of it")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(node)


def _reader_error(exc: yaml.reader.ReaderError, text: str, path: str) -> ConfigError:
    """A character YAML does not allow (control characters, ESC, ...), named with its line."""
    line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else None
    char = exc.character if isinstance(exc.character, int) else None
    what = f"character U+{char:04X}" if char is not None else "a character"
    return ConfigError(f"{what} is not allowed in YAML (control characters cannot be written raw)",
                       path=path, line=line,
                       hint='remove it, or write it as an escape inside double quotes, e.g. "\\x01"')


# What PyYAML's constructors raise for a scalar whose explicit tag it does not fit (each seen from one tag).
_TAG_MISFITS = (ValueError, TypeError, OverflowError, KeyError, AttributeError, IndexError)
# Characters of a library's message repeated in ours: it may quote the value, which can be long.
_SHOWN = 120


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def parse_yaml(text: str, path: str) -> LoadedYaml:
    """Parse YAML text; syntax errors and oversized or over-deep documents become a ConfigError naming the file."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{len(text)} characters is more than the {MAX_BYTES} a configuration may hold",
                          path=path, hint="is this the right file?")
    loader: _Loader | None = None
    try:
        _check_depth(text, path)
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return LoadedYaml({}, {}, path)
        _expanded_size(node, path)
        lines: dict[KeyPath, int] = {(): node.start_mark.line + 1}
        _walk(node, (), lines, path)
        data = loader.construct_document(node)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, path) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(
            f"not valid YAML: {exc.problem or exc}", path=path, line=line, hint="check indentation and quoting"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {' '.join(str(exc).split())}", path=path) from None
    except _TAG_MISFITS as exc:  # an explicit tag the value does not fit: !!float 'x', !!bool 'x', !!timestamp 'x'
        raise ConfigError(f"a value does not fit its YAML tag ({type(exc).__name__}: {_cut(str(exc))})", path=path,
                          hint="remove the !!tag or write a value of that type") from None
    except RecursionError:  # a last guard: the depth check above should make this unreachable
        raise ConfigError("the document nests too deeply to read", path=path) from None
    finally:
        if loader is not None:
            loader.dispose()
    return LoadedYaml(data, lines, path)


def read_config_text(path: str | Path) -> str:
    """A configuration file's text: at most MAX_BYTES, UTF-8; anything else is a ConfigError naming the file."""
    p = Path(path)
    try:
        raw = read_regular_bytes(p, MAX_BYTES)
    except FileNotFoundError:
        raise ConfigError("file not found", path=str(p)) from None
    except NotRegularFile as exc:
        raise ConfigError(f"{exc.strerror}: a configuration is read from a YAML file", path=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror or exc}", path=str(p)) from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"the file is larger than the {MAX_BYTES} bytes a configuration file may have",
                          path=str(p), hint="is this the right file?")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", path=str(p), line=line,
                          hint="save the file as UTF-8") from None


def load_yaml_file(path: str | Path) -> LoadedYaml:
    """Read and parse a YAML file; a missing, unreadable or oversized file is a ConfigError."""
    return parse_yaml(read_config_text(path), str(path))
