"""The run directory's failure note: the first error line a rank wrote, so ``status`` can name the cause.

``hpctrain run`` records it when a rank fails (the first writer wins; the note appears whole or not at all);
status polling fetches it in the same batched call as metrics and exit records and shows it as the reason.
A continuation removes it before its job starts. Plain standard library: both sides import this module.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

FAILURE_FILE = "failure.txt"
MAX_CHARS = 400  # one line: what a status table and a registry row can hold


def failure_line(message: str) -> str:
    """The first non-empty line of ``message``, without control characters, at most MAX_CHARS long."""
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    line = "".join(c if c.isprintable() else " " for c in line)
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3] + "..."


def record_failure(run_dir: str | os.PathLike[str], message: str) -> bool:
    """Write ``message``'s first line as the run's failure note unless one exists; True when this call wrote it.

    The note is written beside its final name and hard-linked into place: ``link`` fails when the name
    exists, so of several failing ranks exactly one wins and no reader sees a half-written note.
    """
    directory = Path(run_dir)
    line = failure_line(message)
    if not line:
        return False
    # Ranks on different nodes may share a pid: the host name keeps their temporary names apart.
    tmp = directory / f".{FAILURE_FILE}.{socket.gethostname()}.{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(line + "\n", encoding="utf-8")
        os.link(tmp, directory / FAILURE_FILE)
        return True
    except OSError:  # already there (another rank won), or the directory is not writable: status falls back
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_failure(text: str) -> str:
    """The note as fetched by a status poll ('' when there is none)."""
    return failure_line(text)
