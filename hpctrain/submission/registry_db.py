"""The run registry's file: its schema, creating it whole, opening it read-only, and SQLite's errors turned into
HpctrainErrors that name the file and the way out (a damaged file, a lock held too long, a read-only file, a full
disk).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import urllib.parse
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.files import atomic_path, kind_of

SCHEMA_VERSION = 2


_SCHEMA_V1 = """
CREATE TABLE runs (
    run_id       TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    site         TEXT NOT NULL,
    remote       TEXT,
    spec_hash    TEXT NOT NULL,
    spec_path    TEXT,
    run_dir      TEXT NOT NULL,
    created      TEXT NOT NULL,
    state        TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT '',
    array_parent TEXT REFERENCES runs(run_id),
    array_index  INTEGER,
    overrides    TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX runs_site_state ON runs(site, state);
CREATE TABLE submissions (
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    seq           INTEGER NOT NULL,
    job_id        TEXT,
    kind          TEXT NOT NULL CHECK (kind IN ('submit', 'requeue', 'resubmit', 'resume')),
    submitted_at  TEXT NOT NULL,
    ok            INTEGER NOT NULL CHECK (ok IN (0, 1)),
    error         TEXT,
    state         TEXT,
    state_reason  TEXT NOT NULL DEFAULT '',
    exit_code     INTEGER,
    restart_count INTEGER NOT NULL DEFAULT 0,
    updated_at    TEXT,
    PRIMARY KEY (run_id, seq),
    CHECK (ok = 0 OR job_id IS NOT NULL),
    CHECK (ok = 1 OR error IS NOT NULL)
);
CREATE INDEX submissions_job ON submissions(job_id);
CREATE TABLE checkpoints (
    run_id  TEXT NOT NULL REFERENCES runs(run_id),
    step    INTEGER NOT NULL,
    path    TEXT NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
"""

# Version 2: the nodes each run blamed (its blamed-nodes.jsonl as polled) and the marks of a person's "forget these
# nodes" per site (a node is remembered for a site from failed blames in two runs recorded after its mark).
_SCHEMA_V2 = """
CREATE TABLE blamed_nodes (
    run_id   TEXT NOT NULL REFERENCES runs(run_id),
    node     TEXT NOT NULL,
    kind     TEXT NOT NULL,
    source   TEXT NOT NULL,
    job      TEXT NOT NULL,
    restart  INTEGER NOT NULL,
    cause    TEXT NOT NULL,
    ranks    TEXT NOT NULL DEFAULT '[]',
    time     REAL NOT NULL,
    recorded TEXT NOT NULL,
    PRIMARY KEY (run_id, node, kind, source, job, restart)
);
CREATE INDEX blamed_nodes_node ON blamed_nodes(node, kind);
CREATE TABLE forgotten_nodes (
    site      TEXT NOT NULL,
    node      TEXT NOT NULL,
    forgotten TEXT NOT NULL,
    PRIMARY KEY (site, node)
);
"""



def _statements(script: str) -> list[str]:
    return [s for s in script.split(";") if s.strip()]


def _add_node_tables(con: sqlite3.Connection) -> None:
    for statement in _statements(_SCHEMA_V2):
        con.execute(statement)


# version N -> function bringing a version-N database to N+1 (run inside the write transaction).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _add_node_tables}


class RegistryLocked(HpctrainError):
    """The registry stayed locked by another process for longer than the bounded wait."""


class Guarded:
    """The registry's connection: every statement's rows are fetched at once, and SQLite's errors become
    HpctrainErrors that name the file and the way out (a damaged file, a lock, a read-only file, a full disk).

    Constraint violations (IntegrityError) pass through: the callers that expect them handle them.
    """

    def __init__(self, connection: sqlite3.Connection, path: Path, lock_timeout_s: float) -> None:
        self.connection = connection
        self.path = path
        self.lock_timeout_s = lock_timeout_s

    def execute(self, sql: str, args: Iterable[object] = ()) -> _Rows:
        try:
            cursor = self.connection.execute(sql, tuple(args))
            return _Rows(cursor.fetchall())
        except sqlite3.Error as exc:
            raise registry_error(exc, self.path, self.lock_timeout_s) from None

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def close(self) -> None:
        self.connection.close()


class _Rows(list):  # type: ignore[type-arg]
    """A statement's rows, read in full (so a damaged page fails inside ``execute``, not while iterating)."""

    def fetchone(self) -> sqlite3.Row | None:
        return self[0] if self else None

    def fetchall(self) -> list[sqlite3.Row]:
        return list(self)


def registry_error(exc: sqlite3.Error, path: Path, waited_s: float = 0.0) -> Exception:
    """The HpctrainError for an SQLite error on the registry at ``path`` (IntegrityError and programming
    errors are returned unchanged: they are not the user's to fix)."""
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return exc
    msg = str(exc)
    low = msg.lower()
    if "locked" in low or "busy" in low:
        return RegistryLocked(f"the run registry {path} is locked by another process (waited {waited_s:g} s: "
                              f"{msg})",
                              hint=f"another hpctrain command is writing to it or is stuck: try again, or find it "
                                   f"with `fuser {path}`")
    if "readonly" in low or "read-only" in low or ("unable to open" in low and _read_only_place(path)):
        return HpctrainError(f"the run registry {path} is read-only and this command writes to it ({msg})",
                             hint="make the file and its directory writable, or set HPCTRAIN_REGISTRY to a "
                                  "writable copy")
    if "full" in low:
        return HpctrainError(f"the run registry {path} cannot grow: the disk is full ({msg})",
                             hint="free space on that file system")
    if "unable to open" in low:
        return HpctrainError(f"cannot open the run registry {path} ({msg})",
                             hint="check the directory exists and is readable, or set HPCTRAIN_REGISTRY")
    return damaged(path, msg)


class RegistryDamaged(HpctrainError):
    """The registry file is not (or no longer) a readable registry; ``why`` says what was found."""

    def __init__(self, path: Path, why: str) -> None:
        self.why = why
        super().__init__(f"the run registry {path} is damaged: {why}",
                         hint="`hpctrain runs --repair` keeps a copy of it and rebuilds it from the rows that can "
                              "still be read")


def registry_file_exists(path: Path) -> bool:
    """Whether the registry file exists (False: not yet); an error naming the path when it is anything but a
    regular file or a place one can be created (a FIFO, a device, a symbolic-link loop, a directory above it
    that is a file)."""
    hint = "set HPCTRAIN_REGISTRY (or HPCTRAIN_HOME) to a regular file (or a directory) of your own"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise HpctrainError(f"the run registry {path} is a symbolic link to nothing", hint=hint) from None
        return False
    except NotADirectoryError:
        raise HpctrainError(f"the run registry {path} cannot exist: a directory above it is a file "
                            "(is HPCTRAIN_HOME a file?)", hint=hint) from None
    except OSError as exc:
        raise HpctrainError(f"the run registry {path} cannot be reached: {exc.strerror or exc}", hint=hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise HpctrainError(f"the run registry {path} is {kind_of(st.st_mode)}, not an SQLite file", hint=hint)
    return True


def _read_only_place(path: Path) -> bool:
    """True when the registry's file system is mounted read-only (root ignores file modes, not this)."""
    try:
        return bool(os.statvfs(path if path.exists() else path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def damaged(path: Path, why: str) -> RegistryDamaged:
    """The error for a registry file that is not (or no longer) a readable registry."""
    return RegistryDamaged(path, why)


def connect_read_only(path: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection (``mode=ro``): SQLite refuses every write through it and takes no write lock."""
    uri = "file:" + urllib.parse.quote(str(path.resolve()), safe="/")
    con = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=timeout, isolation_level=None)
    try:
        con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # opens the file now, not later
        return con
    except sqlite3.OperationalError as exc:
        con.close()
        if "unable to open" not in str(exc):
            raise
    # A WAL file on a read-only file system, whose -shm cannot be created: nobody can be writing to it, so
    # SQLite may read it without locks.
    return sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, timeout=timeout, isolation_level=None)


def schema_statements() -> list[str]:
    """The statements that create the current schema's tables and indices."""
    return _statements(_SCHEMA_V1) + _statements(_SCHEMA_V2)


def temporary_added_tables(version: int) -> list[str]:
    """The statements creating, as empty TEMP tables, those a registry of schema ``version`` lacks: a read-only
    connection cannot migrate the file, and an older file has no rows in them."""
    added = _statements(_SCHEMA_V2) if version < 2 else []
    return [s.replace("CREATE TABLE", "CREATE TEMP TABLE", 1) for s in added if "CREATE TABLE" in s]


def create_database(path: Path) -> None:
    """Write a new, empty registry file at ``path`` (which must not exist yet), schema and WAL mode set."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("BEGIN")
        for statement in schema_statements():
            con.execute(statement)
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        con.execute("COMMIT")
    finally:
        con.close()  # the last connection checkpoints the WAL into the file and removes it


def create_atomically(path: Path) -> None:
    """Create the registry file complete or not at all: built beside it, then hard-linked into place (a link
    never replaces a file another process created meanwhile). So a zero-length registry is always damage."""
    made: list[Path] = []
    try:
        with atomic_path(path, exclusive=True) as tmp:
            made.append(tmp)
            create_database(tmp)
    except FileExistsError:
        pass  # another process made it first: use theirs
    finally:
        for leftover in (Path(f"{tmp}-{kind}") for tmp in made for kind in ("wal", "shm")):
            with suppress(OSError):
                leftover.unlink()

