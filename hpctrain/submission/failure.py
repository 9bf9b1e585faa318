"""The run directory's failure note: the cause of a failed run, in one line, so ``status`` can name it.

Several writers may race: every rank that fails, and the launcher that saw a rank killed by a signal. They do
not all know the cause equally well, so each note has a rank (``PEER`` < ``OWN`` < ``SIGNAL``) and the note is
the first one written at the highest rank:

- ``PEER``: a rank's error caused by another rank going away (gloo "Connection closed by peer", an MPI error
  after a peer's death, a collective that timed out): only the reason when nothing better is known;
- ``OWN``: a rank's own exception (a data error, a bug, a bad value): the cause;
- ``SIGNAL``: the launcher's "rank N killed by SIGKILL": that rank left no message of its own, and the errors of
  the others are its consequence.

Each writer claims its rank's hidden file with a hard link (the first claim of a rank wins, whole or not at
all), then publishes the highest claim as ``failure.txt`` by an atomic rename, again until no higher claim has
appeared meanwhile: whatever the order of the writers, the note ends as the highest claim, and no reader sees a
half-written one. Status polling fetches ``failure.txt`` in the same batched call as metrics and exit records
and shows it as the reason; a continuation removes every file of ``NOTE_FILES`` before its job starts.
Plain standard library (and hpctrain.files): both sides import this module.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hpctrain.files import write_atomic

FAILURE_FILE = "failure.txt"
MAX_CHARS = 400  # one line: what a status table and a registry row can hold
PEER, OWN, SIGNAL = 0, 1, 2  # how well a note knows the cause (see the module's docstring)
LEVELS = (SIGNAL, OWN, PEER)  # highest first
# The claims: one hidden file per level, the first writer's line.
NOTE_FILES = (FAILURE_FILE, *(f".{FAILURE_FILE}.level{level}" for level in LEVELS))


def failure_line(message: str) -> str:
    """The first non-empty line of ``message``, without control characters, at most MAX_CHARS long."""
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    line = "".join(c if c.isprintable() else " " for c in line)
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3] + "..."


def _claim(directory: Path, level: int) -> Path:
    return directory / f".{FAILURE_FILE}.level{level}"


def _tmp(directory: Path, what: str) -> Path:
    # Ranks on different nodes may share a pid: the host name keeps their temporary names apart.
    return directory / f".{FAILURE_FILE}.{what}.{socket.gethostname()}.{os.getpid()}"


def record_failure(run_dir: str | os.PathLike[str], message: str, level: int = OWN) -> bool:
    """Offer ``message``'s first line as the run's failure note at ``level``; True when this call's line is the
    first at its level (it is then the note unless a higher level has one).

    A note is never replaced by one of a lower level, nor by a later one of the same level.
    """
    if level not in LEVELS:
        raise ValueError(f"failure note level {level} is not one of {LEVELS}")
    directory = Path(run_dir)
    line = failure_line(message)
    if not line:
        return False
    tmp = _tmp(directory, "claim")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(line + "\n", encoding="utf-8")
        try:
            os.link(tmp, _claim(directory, level))
            won = True
        except FileExistsError:  # an earlier writer at this level: its line stands
            won = False
        _publish(directory)
        return won
    except OSError:  # the directory is not writable: status falls back to the exit code
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _highest_claim(directory: Path) -> tuple[int, str] | None:
    for level in LEVELS:
        try:
            return level, _claim(directory, level).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
    return None


def noted_level(run_dir: str | os.PathLike[str]) -> int | None:
    """The highest level at which a note was offered in ``run_dir`` (None: no note)."""
    highest = _highest_claim(Path(run_dir))
    return None if highest is None else highest[0]


def _publish(directory: Path) -> None:
    """Make ``failure.txt`` the highest claim; again while a higher claim appeared during the rename."""
    published: int | None = None
    while True:
        highest = _highest_claim(directory)
        if highest is None or highest[0] == published:
            return
        level, text = highest
        write_atomic(directory / FAILURE_FILE, text)
        published = level


def read_failure(text: str) -> str:
    """The note as fetched by a status poll ('' when there is none)."""
    return failure_line(text)
