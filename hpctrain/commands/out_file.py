"""The file a command writes with ``-o``: checked before anything is computed (a directory, a missing directory,
a device or FIFO in its place, a name too long), and written whole; each refusal one line naming the flag."""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.files import kind_of, write_atomic
from hpctrain.text import printable_short


def check_out_file(name: str | os.PathLike[str], flag: str = "-o", example: str = "out.txt") -> Path:
    """``name`` as a path, if it can be written as a new or replaced regular file in an existing directory;
    HpctrainError otherwise (nothing is created here: not the file, not its directory)."""
    if not os.fspath(name):
        raise HpctrainError(f"{flag} '': an empty file name", hint=f"name the file, e.g. {flag} {example}")
    out = Path(name)
    shown = printable_short(str(out))  # a line break in the name is escaped: the message stays one line
    parent = out.parent
    try:
        if out.is_dir():
            raise HpctrainError(f"{flag} {shown}: is a directory", hint=f"name the file, e.g. {flag} {shown}/{example}")
        if out.exists() and not out.is_file():
            raise HpctrainError(f"{flag} {shown}: is {kind_of(os.stat(out).st_mode)}, not a regular file",
                                hint="name a regular file to write")
        if not parent.is_dir():
            raise HpctrainError(f"{flag} {shown}: directory {printable_short(str(parent))} does not exist",
                                hint=f"create it: mkdir -p {printable_short(str(parent))}")
    except OSError as exc:  # a name too long, a loop of links: is_dir() raises for more than a missing path
        raise HpctrainError(f"{flag} {shown}: {exc.strerror or exc}") from None
    return out


def write_out_file(out: Path, text: str, flag: str = "-o", what: str = "the file", mode: int | None = None) -> None:
    """Write ``text`` to ``out`` whole (beside, then renamed: no temporary file left behind on failure)."""
    try:
        write_atomic(out, text, mode=mode)
    except OSError as exc:
        raise HpctrainError(f"{flag} {printable_short(str(out))}: cannot write {what}: {exc.strerror or exc}"
                            ) from None
