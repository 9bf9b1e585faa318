"""Quoting helpers: the one place where values become shell text in a batch script.

Every value is quoted so that bash reads it back as exactly one word and nothing in it is executed. Values
holding control characters are written with ANSI-C quoting (``$'a\\nb'``) so no value ever adds a line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from hpctrain.errors import ConfigError

# Characters that would start a new line (for bash or for a reader splitting lines) or are invisible
# controls: written as escapes inside $'...'. Python's str.splitlines also breaks on \x1c-\x1e, \x85,
# \u2028 and \u2029, so those are escaped too.
_NEEDS_ANSI_C = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
# A value that is safe inside a scheduler directive line: one word, no quotes, no shell or comment syntax.
_DIRECTIVE_WORD = re.compile(r"[A-Za-z0-9_./+:@=,%*-]+")
_HOME_PREFIX = re.compile(r"^(?:~|\$HOME|\$\{HOME\})(?=/|$)")


def _ansi_c_char(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    if ch == "'":
        return "\\'"
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if code in (0x85, 0x2028, 0x2029):
        return f"\\u{code:04x}"
    return ch


def quote(value: str) -> str:
    """``value`` as one bash word that expands to exactly ``value`` (nothing inside is run or expanded)."""
    if "\x00" in value:
        raise ConfigError(f"value {value[:40]!r}... holds a NUL byte, which a shell script cannot carry",
                          hint="remove the NUL character")
    if not _NEEDS_ANSI_C.search(value):
        return shlex.quote(value)
    return "$'" + "".join(_ansi_c_char(ch) for ch in value) + "'"


def quote_path(path: str) -> str:
    """Like ``quote`` but a leading ``~``, ``$HOME`` or ``${HOME}`` stays the user's home: ``"$HOME"/'x'``.

    Nothing else in the path expands: ``$SCRATCH/x`` or ``~other/x`` are taken literally.
    """
    match = _HOME_PREFIX.match(path)
    if not match:
        return quote(path)
    rest = path[match.end():].lstrip("/")
    return '"$HOME"' + ("/" + quote(rest) if rest else "")


def is_home_relative(path: str) -> bool:
    """True when ``path`` starts with ``~``, ``$HOME`` or ``${HOME}`` (expanded only by the batch shell)."""
    return bool(_HOME_PREFIX.match(path))


def join(argv: Iterable[str], *, paths: Iterable[int] = ()) -> str:
    """An argv as one line of shell text; the positions in ``paths`` are quoted with ``quote_path``."""
    path_positions = set(paths)
    return " ".join(quote_path(a) if i in path_positions else quote(a) for i, a in enumerate(argv))


def directive_word(value: str, *, what: str) -> str:
    """``value`` unchanged if it can stand in a ``#SBATCH``/``#PBS``/``#COBALT`` line, else a ConfigError.

    Directive lines are read by the scheduler, not by bash, so quoting does not help there: only plain
    words (letters, digits and ``_ . / + : @ = , % * -``) are written.
    """
    if not _DIRECTIVE_WORD.fullmatch(value):
        raise ConfigError(f"{what} {value!r} cannot be written into a scheduler directive line",
                          hint="use only letters, digits and _ . / + : @ = , % * - (no spaces or quotes)")
    return value


def comment(text: str, *, limit: int = 200) -> str:
    """Free text made safe for one ``# ...`` comment line (control characters replaced, length capped)."""
    flat = _NEEDS_ANSI_C.sub("?", text)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ShellWord(str):
    """A word that names variables the script itself sets (``$HPCTRAIN_NODE_LOCAL``, ``$USER``): written with those
    variables in double quotes and every other piece quoted, so they and nothing else expand.

    ``ShellWord("a/", ("USER",), "/b", ("SLURM_JOB_ID", "none"))``: literal pieces, and tuples naming a variable
    (with a default for when it is unset). As a ``str`` it reads ``a/${USER}/b${SLURM_JOB_ID:-none}``; launchers
    pass it through unchanged and ``word()`` writes it.
    """

    pieces: tuple[str | tuple[str, ...], ...]

    def __new__(cls, *pieces: str | tuple[str, ...]) -> ShellWord:
        for piece in pieces:
            if isinstance(piece, tuple) and not (
                    1 <= len(piece) <= 2 and _VARIABLE_NAME.fullmatch(piece[0])
                    and (len(piece) == 1 or _DEFAULT.fullmatch(piece[1]))):
                raise ValueError(f"{piece!r} is not a variable name with an optional plain default")
        self = super().__new__(cls, "".join(_variable(p) if isinstance(p, tuple) else p for p in pieces))
        self.pieces = pieces
        return self

    def shell(self) -> str:
        return "".join(f'"{_variable(p)}"' if isinstance(p, tuple) else quote(p) for p in self.pieces if p)

    def __add__(self, other: str) -> ShellWord:  # type: ignore[override]
        return ShellWord(*self.pieces, *(other.pieces if isinstance(other, ShellWord) else (other,)))


_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT = re.compile(r"[A-Za-z0-9_.-]*")


def _variable(piece: tuple[str, ...]) -> str:
    return "${" + piece[0] + (f":-{piece[1]}" if len(piece) == 2 else "") + "}"


def word(value: str) -> str:
    """One word of a script line: a ``ShellWord`` with its variables, anything else as ``quote_path`` writes it."""
    return value.shell() if isinstance(value, ShellWord) else quote_path(value)
