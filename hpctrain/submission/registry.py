"""The run registry: which runs exist, each run's chain of scheduler submissions, states, checkpoints and the
nodes it blamed (and, from those, the nodes remembered as bad per site).

SQLite in WAL mode, one file per user (``$HPCTRAIN_REGISTRY``, else ``$HPCTRAIN_HOME/registry.db``, else
``~/.local/share/hpctrain/registry.db``); many hpctrain processes may read and write it at once.
The file itself (schema, locks, damage) is ``registry_db``; the records read from its rows, ``registry_rows``.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from hpctrain.errors import HpctrainError, UnknownRun
from hpctrain.nodes.blame import Blame
from hpctrain.submission.registry_db import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Guarded,
    RegistryLocked,
    connect_read_only,
    create_atomically,
    damaged,
    registry_error,
    registry_file_exists,
    schema_statements,
    temporary_added_tables,
)
from hpctrain.submission.registry_rows import (
    ACTIVE_STATES,
    CREATED,
    DECODERS,
    ENDED_STATES,
    RUN_TABLES,
    SUBMISSION_KINDS,
    SUBMIT_FAILED,
    TABLES,
    BadRow,
    BlamedNode,
    CheckpointRecord,
    Run,
    Submission,
    decode_blame,
    decode_checkpoint,
    decode_run,
    decode_submission,
    row_name,
)
from hpctrain.submission.schedulers.state import JobState

if TYPE_CHECKING:
    from hpctrain.submission.schedulers.status_parsers import JobStatus

# Bounded waits for another process's lock, in all (not per retry): writers wait longer than readers.
WRITE_LOCK_WAIT_S = 30.0
READ_LOCK_WAIT_S = 10.0
T = TypeVar("T")


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


class RunRegistry:
    """The run registry. Every write is one ``BEGIN IMMEDIATE`` transaction, retried while busy.

    ``readonly=True`` (``hpctrain runs``, ``logs``) opens the file read-only: no write transaction, no
    lock taken, and a registry that does not exist yet reads as empty. Waits for a lock are bounded by
    ``lock_timeout_s`` in all; rows that cannot be decoded are skipped and described in ``damaged_rows``.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, readonly: bool = False,
                 lock_timeout_s: float | None = None) -> None:
        self.path = Path(path) if path is not None else default_registry_path()
        self.readonly = readonly
        self.lock_timeout_s = lock_timeout_s if lock_timeout_s is not None else (
            READ_LOCK_WAIT_S if readonly else WRITE_LOCK_WAIT_S)
        self.damaged_rows: list[str] = []
        self._db = Guarded(self._connect(), self.path, self.lock_timeout_s)
        try:
            if readonly:
                self._check_readable()
            else:
                self._db.execute("PRAGMA synchronous = NORMAL")
                self._db.execute("PRAGMA foreign_keys = ON")
                self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        exists = registry_file_exists(self.path)
        if exists and self.path.is_file() and self.path.stat().st_size == 0:
            raise damaged(self.path, "the file is empty (0 bytes): it was truncated")
        try:
            if self.readonly:
                if not exists:  # nothing registered yet: an empty registry, without creating the file
                    con = sqlite3.connect(":memory:", isolation_level=None)
                    for statement in schema_statements():
                        con.execute(statement)
                else:
                    con = connect_read_only(self.path, self.lock_timeout_s)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if not exists:
                    create_atomically(self.path)
                # isolation_level=None: we issue BEGIN/COMMIT ourselves.
                con = sqlite3.connect(self.path, timeout=self.lock_timeout_s, isolation_level=None)
        except OSError as exc:
            raise HpctrainError(f"cannot open the run registry {self.path}: {exc.strerror or exc}",
                                hint="set HPCTRAIN_REGISTRY to a writable file") from None
        except sqlite3.Error as exc:
            raise registry_error(exc, self.path, self.lock_timeout_s) from None
        con.row_factory = sqlite3.Row
        con.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout_s * 1000)}")
        return con

    # --- plumbing -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> RunRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retry(self, fn: Callable[[], object]) -> object:
        """Run ``fn``; while the registry is locked, back off and try again until ``lock_timeout_s`` is spent."""
        deadline = time.monotonic() + self.lock_timeout_s
        delay = 0.05
        while True:
            try:
                return fn()
            except RegistryLocked:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(delay * (1 + random.random()), max(deadline - time.monotonic(), 0.0)))
                delay = min(delay * 2, 2.0)

    @contextmanager
    def _write(self) -> Iterator[Guarded]:
        self._retry(lambda: self._db.execute("BEGIN IMMEDIATE"))
        try:
            yield self._db
            self._retry(lambda: self._db.execute("COMMIT"))
        except BaseException:
            if self._db.in_transaction:
                with suppress(sqlite3.Error, HpctrainError):
                    self._db.connection.execute("ROLLBACK")
            raise

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the registry's write lock while the block runs: a file kept beside it that many processes
        replace (``run_record``) is read, compared and written with no other process in between."""
        with self._write():
            yield

    def _tables(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table' UNION "
                                               "SELECT name FROM sqlite_temp_master WHERE type = 'table'")}

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise HpctrainError(f"the run registry {self.path} has schema version {version}, newer than "
                                f"this hpctrain understands ({SCHEMA_VERSION})", hint="upgrade hpctrain")

    def _check_tables(self) -> None:
        missing = sorted(set(TABLES) - self._tables())
        if missing:
            raise damaged(self.path, f"table {', '.join(missing)} is missing")

    def _check_readable(self) -> None:
        version = self.schema_version
        self._check_version(version)
        if version == 0 and not self._tables():
            # Made by an older hpctrain that had not written its schema yet: nothing registered.
            self._db.close()
            self._db = Guarded(sqlite3.connect(":memory:", isolation_level=None), self.path, self.lock_timeout_s)
            self._db.connection.row_factory = sqlite3.Row
            for statement in schema_statements():
                self._db.execute(statement)
            return
        for statement in temporary_added_tables(version):
            self._db.execute(statement)
        self._check_tables()

    def _migrate(self) -> None:
        version = self.schema_version
        self._check_version(version)
        if version == SCHEMA_VERSION:  # the usual case: no write transaction just to open the registry
            self._check_tables()
            return
        self._retry(lambda: self._db.execute("PRAGMA journal_mode = WAL"))
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            self._check_version(version)
            if version == 0:
                for statement in schema_statements():
                    db.execute(statement)
                version = 1
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](db.connection)
                version += 1
            db.execute(f"PRAGMA user_version = {version}")
        self._check_tables()

    @property
    def schema_version(self) -> int:
        """``PRAGMA user_version`` of the file."""
        row = self._db.execute("PRAGMA user_version").fetchone()
        if row is None or not isinstance(row[0], int):
            raise damaged(self.path, "no schema version")
        return int(row[0])


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
            return self._decode_run(row)
        rows = self._db.execute(
            "SELECT * FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY created DESC",
            (len(run_id_or_prefix), run_id_or_prefix),
        ).fetchall()
        if not rows:
            raise UnknownRun(f"no run matches {run_id_or_prefix!r} in {self.path}",
                             hint="`hpctrain runs` lists the runs")
        if len(rows) > 1:
            shown = ", ".join(r["run_id"] for r in rows[:10]) + (" ..." if len(rows) > 10 else "")
            raise UnknownRun(f"{run_id_or_prefix!r} matches {len(rows)} runs: {shown}",
                             hint="give more of the run id")
        return self._decode_run(rows[0])

    def list_runs(self, site: str | None = None, active_only: bool = False) -> list[Run]:
        """Runs, newest first, optionally of one site and/or only those still active."""
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if site is not None:
            sql += " AND site = ?"
            args.append(site)
        if active_only:
            sql += f" AND state IN ({','.join('?' * len(ACTIVE_STATES))})"
            args.extend(ACTIVE_STATES)
        return self._decoded(self._db.execute(sql + " ORDER BY created DESC, run_id", args), decode_run, "run")

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

    def _decode_run(self, row: sqlite3.Row) -> Run:
        try:
            return decode_run(row)
        except BadRow as exc:
            raise damaged(self.path, f"the row of run {row_name(row)} cannot be read: {exc}") from None

    def _decoded(self, rows: Iterable[sqlite3.Row], decode: Callable[[sqlite3.Row], T], what: str) -> list[T]:
        """Rows decoded; one that cannot be is skipped and described in ``damaged_rows`` (the rest still show)."""
        out: list[T] = []
        for row in rows:
            try:
                out.append(decode(row))
            except BadRow as exc:
                note = f"{what} row of run {row_name(row)} skipped: {exc}"
                if note not in self.damaged_rows:
                    self.damaged_rows.append(note)
        return out

    def _submission(self, run_id: str, seq: int) -> Submission:
        row = self._db.execute("SELECT * FROM submissions WHERE run_id = ? AND seq = ?",
                               (run_id, seq)).fetchone()
        return decode_submission(row)

    def chain(self, run_id: str) -> list[Submission]:
        """Every submission attempt of a run, oldest first (failed ones included)."""
        rid = self.get_run(run_id).run_id
        rows = self._db.execute("SELECT * FROM submissions WHERE run_id = ? ORDER BY seq", (rid,))
        return self._decoded(rows, decode_submission, "submission")

    def end_submission(self, run_id: str, seq: int, state: str, reason: str, exit_code: int | None) -> None:
        """Close an earlier submission of a run whose job went on under a newer entry (a requeue keeps the
        job id: polling updates only the newest entry carrying it)."""
        with self._write() as db:
            db.execute("UPDATE submissions SET state = ?, state_reason = ?, exit_code = ?, updated_at = ?"
                       " WHERE run_id = ? AND seq = ?", (state, reason, exit_code, _now(), run_id, seq))

    def update_states(self, statuses: Mapping[str, JobStatus], site: str | None = None) -> int:
        """Store polled job states (one transaction); returns how many submissions changed state.

        A job id is matched to the newest successful submission carrying it (of ``site`` when given, since
        ids repeat across clusters); the run follows the state of its newest successful submission. A
        submission that has ended keeps its end: an active state for it is an answer read before another
        process stored the end, and is dropped.
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
                    if old == new or (row["state"] in ENDED_STATES and new[0] not in ENDED_STATES):
                        # An active state after an end is an answer read before it (another process's poll
                        # stored the end meanwhile): an ended job is never polled again, so its end stands.
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
            if not isinstance(row["site"], str) or not isinstance(row["job_id"], str):
                self.damaged_rows.append(f"submission of a run on site {str(row['site'])[:40]!r} skipped: "
                                         f"job id {str(row['job_id'])[:40]!r} is not text")
                continue
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

    def checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        """A run's checkpoints, oldest step first."""
        rows = self._db.execute("SELECT * FROM checkpoints WHERE run_id = ? ORDER BY step", (run_id,))
        return self._decoded(rows, decode_checkpoint, "checkpoint")

    # --- blamed nodes ------------------------------------------------------------------------------------------

    def record_blames(self, run_id: str, blames: Iterable[Blame]) -> list[Blame]:
        """Keep the blames of a run's ``blamed-nodes.jsonl`` (one transaction); a blame already kept (same node,
        kind, source, job and restart) is not kept twice. Returns the ones new to the registry."""
        blames = list(blames)
        if not blames:
            return []
        now = _now()
        new: list[Blame] = []
        with self._write() as db:
            for b in blames:
                db.execute("INSERT OR IGNORE INTO blamed_nodes (run_id, node, kind, source, job, restart, cause, ranks,"
                           " time, recorded) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (run_id, b.node, b.kind, b.source, b.job, b.restart, b.cause, json.dumps(list(b.ranks)),
                            b.time, now))
                if db.execute("SELECT changes()").fetchone()[0]:
                    new.append(b)
        return new

    def blames(self, run_id: str) -> list[Blame]:
        """The nodes a run blamed, in the order they were blamed."""
        rows = self._db.execute("SELECT * FROM blamed_nodes WHERE run_id = ? ORDER BY time, rowid", (run_id,))
        return [found.blame for found in self._decoded(rows, decode_blame, "blamed node")]

    def remembered_nodes(self, site: str) -> dict[str, list[BlamedNode]]:
        """The nodes remembered as bad on ``site``: node -> its failed blames (the first of each run), for every
        node blamed as failed in two or more runs of the site since a person last made the registry forget it."""
        rows = self._db.execute(
            "SELECT b.* FROM blamed_nodes b JOIN runs r ON r.run_id = b.run_id"
            " LEFT JOIN forgotten_nodes f ON f.site = r.site AND f.node = b.node"
            " WHERE r.site = ? AND b.kind = 'failed' AND (f.forgotten IS NULL OR b.recorded > f.forgotten)"
            " ORDER BY b.node, b.time, b.rowid", (site,))
        by_node: dict[str, dict[str, BlamedNode]] = {}
        for found in self._decoded(rows, decode_blame, "blamed node"):
            by_node.setdefault(found.blame.node, {}).setdefault(found.run_id, found)
        return {node: list(runs.values()) for node, runs in by_node.items() if len(runs) >= 2}

    def forget_nodes(self, site: str, nodes: Iterable[str] = ()) -> list[str]:
        """Forget the blames of ``nodes`` (all nodes any run of the site blamed, when none are named) as far as the
        site's memory goes: from now on only new blames count. Returns the nodes that were remembered."""
        remembered = self.remembered_nodes(site)
        names = list(dict.fromkeys(nodes))
        if not names:
            rows = self._db.execute("SELECT DISTINCT b.node FROM blamed_nodes b JOIN runs r ON r.run_id = b.run_id"
                                    " WHERE r.site = ?", (site,))
            names = [str(row[0]) for row in rows]
        now = _now()
        with self._write() as db:
            for node in names:
                db.execute("INSERT OR REPLACE INTO forgotten_nodes (site, node, forgotten) VALUES (?,?,?)",
                           (site, node, now))
        return [node for node in names if node in remembered]

    # --- housekeeping -------------------------------------------------------------------------------------

    def integrity_problems(self) -> list[str]:
        """SQLite's integrity check plus every row decoded: what is wrong (an empty list when healthy)."""
        result = [str(r[0]) for r in self._db.execute("PRAGMA integrity_check")]
        if result != ["ok"]:
            return [f"SQLite integrity check: {'; '.join(result[:5])}"]
        problems: list[str] = []
        for table in TABLES:
            for row in self._db.execute(f"SELECT * FROM {table}"):
                try:
                    DECODERS[table](row)
                except BadRow as exc:
                    problems.append(f"{table} row of run {row_name(row)}: {exc}")
        return problems


    def never_ran(self, registered_before: datetime) -> list[Run]:
        """Runs that never reached a scheduler (``created``, ``submit_failed``) registered before the given
        time, oldest first; an array task is left out while a task that is kept still names it as parent."""
        cutoff = registered_before.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        rows = self._db.execute("SELECT * FROM runs WHERE state IN (?, ?) AND created < ? ORDER BY created",
                                (CREATED, SUBMIT_FAILED, cutoff))
        runs = self._decoded(rows, decode_run, "run")
        chosen = {r.run_id for r in runs}
        links = [(row[0], row[1]) for row in
                 self._db.execute("SELECT run_id, array_parent FROM runs WHERE array_parent IS NOT NULL")]
        while True:  # a parent row stays while any task that is kept points at it (foreign key)
            blocked = {parent for child, parent in links if parent in chosen and child not in chosen}
            if not blocked:
                break
            chosen -= blocked
        return [r for r in runs if r.run_id in chosen]

    def delete_runs(self, run_ids: Iterable[str]) -> int:
        """Remove runs with their submissions, checkpoint records and blamed nodes (one transaction); returns how
        many."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        with self._write() as db:
            for table in RUN_TABLES:
                db.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", ids)
            before = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            db.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", ids)
            after = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        return int(before - after)
