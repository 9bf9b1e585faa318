"""Values echoed to a terminal: control characters escaped, long lists of errors cut.

Every message and table that repeats a value (a path, a key, a registry field) passes it through
``printable``, so a value cannot clear the screen, move the cursor or forge a line of its own. ``json_lines``
reads back the JSON-lines files that runs append to (metrics, records), tolerating a line torn mid-append.
"""

from __future__ import annotations

import json
from typing import Any

# Errors printed per file before "and N more": enough to fix a file, not a screen of noise.
MAX_ERRORS_SHOWN = 20


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
    """The JSON objects of a JSON-lines file, one per line; a torn last line (a writer mid-append) and lines that
    are not objects are skipped."""
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out
