"""The run registry: which runs exist, each run's chain of scheduler submissions, states and checkpoints.

SQLite in WAL mode, one file per user (``$HPCTRAIN_REGISTRY``, else ``$HPCTRAIN_HOME/registry.db``, else
``~/.local/share/hpctrain/registry.db``); many hpctrain processes may read and write it at once.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.errors import HpctrainError
from hpctrain.submission.schedulers.state import JobState

if TYPE_CHECKING:
    from hpctrain.submission.schedulers.status_parsers import JobStatus

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
SUBMISSION_KINDS = ("submit", "requeue", "resubmit", "resume")
# Run states besides JobState values: nothing submitted yet, or every submission attempt failed.
CREATED = "created"
SUBMIT_FAILED = "submit_failed"
ACTIVE_STATES = tuple(s.value for s in JobState if s.is_active)

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

# version N -> function bringing a version-N database to N+1 (run inside the write transaction).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}


@dataclass(frozen=True)
class Run:
    """One training run as registered (one job spec + overrides on one site)."""

    run_id: str
    name: str
    site: str
    remote: str | None
    spec_hash: str
    spec_path: str | None
    run_dir: str
    created: str
    state: str
    state_reason: str
    array_parent: str | None
    array_index: int | None
    overrides: list[str]

    @property
    def is_active(self) -> bool:
        """True while the run's current job may still change state."""
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class Submission:
    """One attempt to put a run on the scheduler; a failed attempt has ``ok=False`` and no job id."""

    run_id: str
    seq: int
    job_id: str | None
    kind: str
    submitted_at: str
    ok: bool
    error: str | None
    state: str | None
    state_reason: str
    exit_code: int | None
    restart_count: int
    updated_at: str | None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint a run wrote."""

    run_id: str
    step: int
    path: str
    created: str


def default_registry_path() -> Path:
    """``$HPCTRAIN_REGISTRY``, else ``$HPCTRAIN_HOME/registry.db``, else the XDG data directory."""
    if os.environ.get("HPCTRAIN_REGISTRY"):
        return Path(os.environ["HPCTRAIN_REGISTRY"]).expanduser()
    if os.environ.get("HPCTRAIN_HOME"):
        return Path(os.environ["HPCTRAIN_HOME"]).expanduser() / "registry.db"
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "hpctrain" / "registry.db"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id(name: str, when: datetime | None = None) -> str:
    """A short readable id: ``<name>-<YYYYMMDD>-<HHMM>-<4 hex>``, e.g. ``ffn-local-20261122-0231-a3f9``."""
    when = when or datetime.now(UTC)
    return f"{name}-{when:%Y%m%d-%H%M}-{secrets.token_hex(2)}"


class Registry:
    """The run registry. Every write is one ``BEGIN IMMEDIATE`` transaction, retried while busy."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, retries: int = 8) -> None:
        self.path = Path(path) if path is not None else default_registry_path()
        self.retries = retries
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves.
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HpctrainError(f"cannot open the run registry {self.path}: {exc}",
                                hint="set HPCTRAIN_REGISTRY to a writable file") from None
        self._db.row_factory = sqlite3.Row
        self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self._retry(lambda: self._db.execute("PRAGMA journal_mode = WAL").fetchone())
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    # --- plumbing -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retry(self, fn: Callable[[], object]) -> object:
        """Run ``fn``; on SQLITE_BUSY/LOCKED past busy_timeout, back off and try again."""
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                msg = str(exc)
                if "locked" not in msg and "busy" not in msg:
                    raise
                if attempt == self.retries:
                    raise HpctrainError(f"the run registry {self.path} stayed locked by another process: "
                                        f"{msg}",
                                        hint="another hpctrain command may be stuck; retry later") from None
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._retry(lambda: self._db.execute("BEGIN IMMEDIATE"))
        try:
            yield self._db
            self._retry(lambda: self._db.execute("COMMIT"))
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HpctrainError(f"the run registry {self.path} has schema version {version}, newer than "
                                    f"this hpctrain understands ({SCHEMA_VERSION})", hint="upgrade hpctrain")
            if version == 0:
                for statement in _SCHEMA_V1.split(";"):
                    if statement.strip():
                        db.execute(statement)
                version = 1
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](db)
                version += 1
            db.execute(f"PRAGMA user_version = {version}")

    @property
    def schema_version(self) -> int:
        """``PRAGMA user_version`` of the file."""
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    # --- runs ---------------------------------------------------------------------------------------------

    def create_run(self, name: str, site: str, spec_hash: str, run_dir: str, *, remote: str | None = None,
                   spec_path: str | None = None, overrides: Iterable[str] = (),
                   array_parent: str | None = None, array_index: int | None = None,
                   run_id: str | None = None) -> Run:
        """Register a new run (state ``created``) under a fresh unique id, or ``run_id`` when given."""
        created = _now()
        overrides_json = json.dumps(list(overrides))
        for _ in range(20):
            rid = run_id or new_run_id(name)
            try:
                with self._write() as db:
                    db.execute(
                        "INSERT INTO runs (run_id, name, site, remote, spec_hash, spec_path, run_dir,"
                        " created, state, array_parent, array_index, overrides)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (rid, name, site, remote, spec_hash, spec_path, run_dir, created, CREATED,
                         array_parent, array_index, overrides_json),
                    )
            except sqlite3.IntegrityError as exc:
                if run_id is not None or "UNIQUE" not in str(exc):
                    raise HpctrainError(f"cannot register run {rid}: {exc}") from None
                continue  # the random suffix collided: draw another
            return self.get_run(rid)
        raise HpctrainError(f"could not find a free run id for {name}")

    def get_run(self, run_id_or_prefix: str) -> Run:
        """The run with this id, or the one run whose id starts with it."""
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id_or_prefix,)).fetchone()
        if row is not None:
            return _run(row)
        rows = self._db.execute(
            "SELECT * FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY created DESC",
            (len(run_id_or_prefix), run_id_or_prefix),
        ).fetchall()
        if not rows:
            raise HpctrainError(f"no run matches {run_id_or_prefix!r} in {self.path}",
                                hint="`hpctrain status` lists the runs")
        if len(rows) > 1:
            shown = ", ".join(r["run_id"] for r in rows[:10]) + (" ..." if len(rows) > 10 else "")
            raise HpctrainError(f"{run_id_or_prefix!r} matches {len(rows)} runs: {shown}",
                                hint="give more of the run id")
        return _run(rows[0])

    def list_runs(self, site: str | None = None, active_only: bool = False) -> list[Run]:
        """Runs, newest first, optionally of one site and/or only those still active."""
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if site is not None:
            sql += " AND site = ?"
            args.append(site)
        if active_only:
            sql += f" AND state IN ({','.join('?' * len(ACTIVE_STATES))})"
            args.extend(ACTIVE_STATES)
        return [_run(r) for r in self._db.execute(sql + " ORDER BY created DESC, run_id", args)]

    # --- submissions --------------------------------------------------------------------------------------

    def add_submission(self, run_id: str, job_id: str | None, kind: str, ok: bool,
                       error: str | None = None) -> Submission:
        """Record one submission attempt; a failed one (``ok=False``) needs ``error``, never has a job."""
        if kind not in SUBMISSION_KINDS:
            raise ValueError(f"kind must be one of {SUBMISSION_KINDS}, not {kind!r}")
        if ok and not job_id:
            raise ValueError("a successful submission needs its job id")
        if not ok and not error:
            raise ValueError("a failed submission needs its error text")
        now = _now()
        with self._write() as db:
            run = db.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if run is None:
                raise HpctrainError(f"no run {run_id} in {self.path}")
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM submissions WHERE run_id = ?",
                             (run_id,)).fetchone()[0]
            state = JobState.PENDING.value if ok else SUBMIT_FAILED
            db.execute(
                "INSERT INTO submissions (run_id, seq, job_id, kind, submitted_at, ok, error, state,"
                " updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (run_id, seq, job_id or None, kind, now, int(ok), error, state, now),
            )
            if ok:
                db.execute("UPDATE runs SET state = ?, state_reason = '' WHERE run_id = ?", (state, run_id))
            elif run["state"] not in ACTIVE_STATES:
                # A failed attempt never hides a job that is still queued; otherwise it is the news.
                db.execute("UPDATE runs SET state = ?, state_reason = ? WHERE run_id = ?",
                           (SUBMIT_FAILED, error, run_id))
        return self._submission(run_id, seq)

    def _submission(self, run_id: str, seq: int) -> Submission:
        row = self._db.execute("SELECT * FROM submissions WHERE run_id = ? AND seq = ?",
                               (run_id, seq)).fetchone()
        return _submission(row)

    def chain(self, run_id: str) -> list[Submission]:
        """Every submission attempt of a run, oldest first (failed ones included)."""
        rid = self.get_run(run_id).run_id
        rows = self._db.execute("SELECT * FROM submissions WHERE run_id = ? ORDER BY seq", (rid,))
        return [_submission(r) for r in rows]

    def update_states(self, statuses: Mapping[str, JobStatus], site: str | None = None) -> int:
        """Store polled job states (one transaction); returns how many submissions changed state.

        A job id is matched to the newest successful submission carrying it (of ``site`` when given, since
        ids repeat across clusters); the run follows the state of its newest successful submission.
        """
        if not statuses:
            return 0
        now = _now()
        changed = 0
        site_sql = " AND r.site = ?" if site is not None else ""
        with self._write() as db:
            for job_id, status in statuses.items():
                args: list[object] = [job_id] + ([site] if site is not None else [])
                rows = db.execute(
                    "SELECT s.run_id, s.seq, s.state, s.state_reason, s.exit_code, s.restart_count"
                    " FROM submissions s JOIN runs r ON r.run_id = s.run_id"
                    f" WHERE s.job_id = ? AND s.ok = 1{site_sql}"
                    " AND s.seq = (SELECT MAX(seq) FROM submissions s2 WHERE s2.run_id = s.run_id"
                    "              AND s2.job_id = s.job_id AND s2.ok = 1)",
                    args,
                ).fetchall()
                new = (status.state.value, status.reason_text or "", status.exit_code, status.restart_count)
                for row in rows:
                    old = (row["state"], row["state_reason"], row["exit_code"], row["restart_count"])
                    if old == new:
                        continue
                    changed += 1
                    db.execute(
                        "UPDATE submissions SET state = ?, state_reason = ?, exit_code = ?,"
                        " restart_count = ?, updated_at = ? WHERE run_id = ? AND seq = ?",
                        (*new, now, row["run_id"], row["seq"]),
                    )
                    db.execute(
                        "UPDATE runs SET state = ?, state_reason = ? WHERE run_id = ? AND ? = "
                        "(SELECT MAX(seq) FROM submissions WHERE run_id = ? AND ok = 1)",
                        (new[0], new[1], row["run_id"], row["seq"], row["run_id"]),
                    )
        return changed

    def active_jobs_by_site(self) -> dict[str, list[str]]:
        """Job ids worth polling, grouped by site so each site gets ONE batched status command."""
        rows = self._db.execute(
            "SELECT r.site, s.job_id FROM runs r JOIN submissions s ON s.run_id = r.run_id"
            f" WHERE r.state IN ({','.join('?' * len(ACTIVE_STATES))}) AND s.ok = 1"
            " AND s.seq = (SELECT MAX(seq) FROM submissions WHERE run_id = r.run_id AND ok = 1)"
            " ORDER BY r.site, s.submitted_at",
            ACTIVE_STATES,
        )
        out: dict[str, list[str]] = {}
        for row in rows:
            ids = out.setdefault(row["site"], [])
            if row["job_id"] not in ids:
                ids.append(row["job_id"])
        return out

    # --- checkpoints --------------------------------------------------------------------------------------

    def record_checkpoint(self, run_id: str, step: int, path: str) -> None:
        """Remember a checkpoint of a run (a second record of the same step replaces the first)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO checkpoints (run_id, step, path, created) VALUES (?,?,?,?)",
                       (run_id, int(step), path, _now()))

    def checkpoints(self, run_id: str) -> list[Checkpoint]:
        """A run's checkpoints, oldest step first."""
        rows = self._db.execute("SELECT * FROM checkpoints WHERE run_id = ? ORDER BY step", (run_id,))
        return [Checkpoint(r["run_id"], r["step"], r["path"], r["created"]) for r in rows]


def _run(row: sqlite3.Row) -> Run:
    return Run(row["run_id"], row["name"], row["site"], row["remote"], row["spec_hash"], row["spec_path"],
               row["run_dir"], row["created"], row["state"], row["state_reason"], row["array_parent"],
               row["array_index"], json.loads(row["overrides"]))


def _submission(row: sqlite3.Row) -> Submission:
    return Submission(row["run_id"], row["seq"], row["job_id"], row["kind"], row["submitted_at"],
                      bool(row["ok"]), row["error"], row["state"], row["state_reason"], row["exit_code"],
                      row["restart_count"], row["updated_at"])
