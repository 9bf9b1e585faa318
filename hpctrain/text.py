"""Values echoed to a terminal: control characters escaped, long lists of errors cut.

Every message and table that repeats a value (a path, a key, a registry field) passes it through
``printable``, so a value cannot clear the screen, move the cursor or forge a line of its own. ``json_value``
parses JSON with its nesting bounded (a deeply nested value is one ValueError, never a RecursionError);
``json_lines`` reads back the JSON-lines text that runs append to (metrics, records), tolerating a line torn
mid-append.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Errors printed per file before "and N more": enough to fix a file, not a screen of noise.
MAX_ERRORS_SHOWN = 20
# Arrays and objects inside each other: hpctrain's files nest a few levels; the parser recurses per level.
MAX_JSON_DEPTH = 64
_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_JSON_SCAN = json.JSONDecoder().scan_once  # json.loads without its checks around: a metrics file has 10**6 lines


class JSONTooDeep(ValueError):
    """JSON text nested deeper than ``MAX_JSON_DEPTH`` arrays and objects."""

    def __init__(self, depth: int) -> None:
        super().__init__(f"JSON nested deeper than {depth} levels")
        self.depth = depth


def json_depth_exceeds(text: str, depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``text`` opens more than ``depth`` arrays or objects inside each other (brackets in strings do not
    count); stops at the first level too many."""
    if text.count("[") + text.count("{") <= depth:
        return False  # too few brackets to nest that deep: the common case, decided at C speed
    level = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            level += 1
            if level > depth:
                return True
        elif token in "]}":
            level -= 1
    return False


def json_value(text: str, depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` with the nesting bounded: JSONTooDeep (a ValueError) before the parser recurses."""
    if json_depth_exceeds(text, depth):
        raise JSONTooDeep(depth)
    try:
        value, end = _JSON_SCAN(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)  # leading space, or no JSON: json.loads says which (a ValueError)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(text)  # "Extra data"
    return value


def printable(text: str) -> str:
    """``text`` with control, line-separator and other non-printable characters written as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable_lines(text: str) -> str:
    """Each line of ``text`` made printable; the line breaks between them kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def writable_text(text: str) -> bool:
    """Whether ``text`` can be written to a UTF-8 script or file name: no NUL, no undecodable bytes (which
    arrive from the command line as lone surrogates)."""
    return "\x00" not in text and not any("\ud800" <= c <= "\udfff" for c in text)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, one per line; a torn last line (a writer mid-append), lines that
    are not objects and lines nested deeper than MAX_JSON_DEPTH are skipped."""
    out = []
    for line in text.splitlines():
        try:
            value = json_value(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def printable_short(text: str, limit: int = 120) -> str:
    """``printable(text)`` cut to about ``limit`` characters, saying how long it was: a pasted megabyte stays one
    readable line in a message."""
    shown = printable(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(text)} characters)"
