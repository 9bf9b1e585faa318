"""Reading the files a run writes (metrics, profile, scores, its checkpoint manifest, notes) for the report: regular
files only (a FIFO, a device or a link to one is refused before a byte is read: ``hpctrain.files``), each read
capped at a size that the refusal names, JSON nesting bounded (``hpctrain.text.json_value``), and JSON-lines
streamed a line at a time, so that a long run's metrics never sit in memory whole.

A refused file is a ``RunFileError``: no healthy run writes one, so it ends the command with one line. A file that
is missing is ``None``; one that is not JSON yet (a writer replacing it) is the caller's ValueError to note.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hpctrain.errors import HpctrainError
from hpctrain.files import NotRegularFile, open_regular
from hpctrain.text import JSONTooDeep, json_value, printable

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# A JSON-lines record longer than this is no record hpctrain writes (a rank_times line of 100,000 ranks is ~1 MiB).
MAX_LINE = 8 * MIB


class RunFileError(HpctrainError):
    """A run's file refused: not a regular file, larger than its cap, a line too long or nested too deep."""


def size_text(nbytes: int) -> str:
    """``2 GiB``, ``1.5 MiB``, ``700 bytes``: a size in the unit that reads best."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} bytes"


def _shown(path: Path) -> str:
    return printable(str(path))


def open_run_file(path: Path, cap: int) -> tuple[BinaryIO, int] | None:
    """``path`` open for binary reading and its size, if it is a regular file of at most ``cap`` bytes; None when
    it is missing. RunFileError when it is something else or bigger; other OSErrors (no permission) propagate."""
    try:
        f = open_regular(path)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise RunFileError(f"{_shown(path)}: {exc.strerror}; a run writes only regular files here") from None
    size = os.fstat(f.fileno()).st_size
    if size > cap:
        f.close()
        raise RunFileError(f"{_shown(path)}: {size_text(size)}, above the {size_text(cap)} that hpctrain reads of "
                           "this file (docs/report.md)")
    return f, size


def read_run_text(path: Path, cap: int) -> str | None:
    """A run file's text (undecodable bytes replaced), or None when it is missing."""
    opened = open_run_file(path, cap)
    if opened is None:
        return None
    f, size = opened
    with f:
        return f.read(size).decode("utf-8", errors="replace")  # the size seen at open: a growing file is cut there


def read_run_head(path: Path, nbytes: int) -> str | None:
    """The first ``nbytes`` of a run file of any size (a note of which only the first line counts)."""
    opened = open_run_file(path, 1 << 62)
    if opened is None:
        return None
    f, _ = opened
    with f:
        return f.read(nbytes).decode("utf-8", errors="replace")


def read_run_json(path: Path, cap: int) -> Any:
    """A run file's JSON value, or None when it is missing; ValueError when it is not JSON (yet)."""
    text = read_run_text(path, cap)
    if text is None:
        return None
    try:
        return json_value(text)
    except JSONTooDeep as exc:
        raise RunFileError(f"{_shown(path)}: {exc}") from None


def run_lines(path: Path, cap: int, max_line: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of each line of a run file, up to the size it had when opened (a live run appends to it);
    a line longer than ``max_line`` (default MAX_LINE) is a RunFileError. Nothing when the file is missing."""
    max_line = MAX_LINE if max_line is None else max_line
    opened = open_run_file(path, cap)
    if opened is None:
        return
    f, left = opened
    with f:
        number = 0
        while left > 0:
            raw = f.readline(min(left, max_line + 1))
            if not raw:
                break
            left -= len(raw)
            number += 1
            if len(raw) > max_line and not raw.endswith(b"\n"):
                raise RunFileError(f"{_shown(path)}: line {number} is longer than {size_text(max_line)}, longer "
                                   "than any record a run writes")
            yield number, raw


def json_record(raw: bytes, path: Path, number: int) -> dict[str, Any] | None:
    """Line ``number`` of a JSON-lines run file as an object; None for a torn line or one that is no object;
    RunFileError for one nested deeper than MAX_JSON_DEPTH."""
    try:
        value = json_value(raw.decode("utf-8", errors="replace"))
    except JSONTooDeep as exc:
        raise RunFileError(f"{_shown(path)}: line {number}: {exc}") from None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def run_json_lines(path: Path, cap: int, max_line: int | None = None) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines run file, a line at a time (``run_lines``, ``json_record``): a torn line
    (a writer mid-append) and lines that are not objects are skipped."""
    for number, raw in run_lines(path, cap, max_line):
        record = json_record(raw, path, number)
        if record is not None:
            yield record
