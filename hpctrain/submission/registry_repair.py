"""Rebuilding a damaged run registry (``hpctrain runs --repair``): keep a copy, salvage every readable row.

The damaged file is copied aside first (``registry.db.damaged-<UTC time>``, its ``-wal`` beside it, both
byte for byte); the rows that can still be read and decoded go into a fresh registry that then replaces the
file. Run it while no other hpctrain command uses the registry.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_db import RegistryDamaged, create_database, registry_file_exists
from hpctrain.submission.registry_rows import COLUMNS, DECODERS, RUN_TABLES, TABLES, BadRow, decode_overrides

# Rows probed one by one past a damaged spot before a table's remaining rows are given up.
PROBE_WINDOW = 1000
# Damaged spots stepped over in one table before giving up on it.
MAX_DAMAGED_SPOTS = 64
# Tables a registry of schema version 1 does not have: a damaged file without them lost nothing there.
NODE_TABLES = ("blamed_nodes", "forgotten_nodes")


@dataclass
class RepairReport:
    """What ``repair_registry`` found and did."""

    path: Path
    problems: list[str]
    backup: Path | None = None
    kept: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)  # note -> how many times it happened

    def note(self, text: str) -> None:
        self.notes[text] = self.notes.get(text, 0) + 1

    @property
    def repaired(self) -> bool:
        return self.backup is not None

    def summary(self) -> str:
        """A few lines for the terminal."""
        if not self.repaired:
            return f"the run registry {self.path} is healthy: nothing to repair"
        # The tables of blamed nodes are named only where they held rows (most registries have none).
        kept = ", ".join(f"{self.kept.get(t, 0)} {t}" for t in TABLES if t not in NODE_TABLES or self.kept.get(t))
        dropped = ", ".join(f"{n} {t}" for t, n in self.dropped.items() if n) or "nothing"
        first = " ".join(self.problems[0].split())
        lines = [f"the run registry {self.path} was damaged: {first}",
                 f"rebuilt it with {kept}; dropped {dropped}",
                 f"the damaged file is kept at {self.backup}"]
        shown = [f"  {note}" + (f" (x{n})" if n > 1 else "") for note, n in list(self.notes.items())[:20]]
        return "\n".join(lines + shown)


def check_registry(path: Path) -> list[str]:
    """What is wrong with the registry file at ``path`` (an empty list when it is healthy)."""
    try:
        with RunRegistry(path, readonly=True) as registry:
            return registry.integrity_problems()
    except RegistryDamaged as exc:
        return [exc.why]
    except HpctrainError as exc:
        return [exc.message]


def repair_registry(path: Path, *, now: datetime | None = None) -> RepairReport:
    """Check the registry at ``path``; when it is damaged, keep a copy and rebuild it from what can be read."""
    path = Path(path)
    if not registry_file_exists(path):
        raise HpctrainError(f"there is no run registry at {path}", hint="nothing to repair")
    report = RepairReport(path, check_registry(path))
    if not report.problems:
        return report
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    backup = path.with_name(f"{path.name}.damaged-{stamp}")
    try:
        _copy_with_wal(path, backup)
        with tempfile.TemporaryDirectory(prefix=".repair-", dir=path.parent) as scratch:
            # Salvage from a copy: opening the file may replay its WAL, and the backup stays as it was found.
            work = Path(scratch) / "damaged.db"
            _copy_with_wal(path, work)
            salvaged = _salvage_all(work, report)
            fresh = Path(scratch) / "fresh.db"
            create_database(fresh)
            _fill(fresh, salvaged, report)
            for stale in (Path(f"{path}-wal"), Path(f"{path}-shm")):
                # A WAL left beside the new file would be replayed onto it.
                with suppress(FileNotFoundError):
                    stale.unlink()
            shutil.move(str(fresh), str(path))
    except OSError as exc:
        raise HpctrainError(f"cannot repair the run registry {path}: {exc.strerror or exc}",
                            hint=f"the original is unchanged{'' if not backup.exists() else f'; a copy is at {backup}'}"
                            ) from None
    report.backup = backup
    return report


def _copy_with_wal(source: Path, target: Path) -> None:
    shutil.copyfile(source, target)
    wal = Path(f"{source}-wal")
    if wal.exists():
        shutil.copyfile(wal, Path(f"{target}-wal"))


def _salvage_all(work: Path, report: RepairReport) -> dict[str, list[dict[str, object]]]:
    salvaged: dict[str, list[dict[str, object]]] = {t: [] for t in TABLES}
    try:
        con = sqlite3.connect(work, isolation_level=None)
        # Without this SQLite refuses the whole schema when one index's pages are gone (a truncated file);
        # nothing is written through this connection.
        con.execute("PRAGMA writable_schema = ON")
    except sqlite3.Error as exc:
        report.note(f"nothing could be read: {exc}")
        return salvaged
    try:
        for table in TABLES:
            rows, spots, why = _salvage(con, table, list(COLUMNS[table]))
            salvaged[table] = rows
            if why and table in NODE_TABLES and "no such table" in why:
                continue
            if why:
                report.note(f"{table}: {why}")
            elif spots:
                report.note(f"{table}: rows in {spots} damaged spot(s) could not be read")
    finally:
        con.close()
    return salvaged


def _salvage(con: sqlite3.Connection, table: str, names: list[str]) -> tuple[list[dict[str, object]], int, str]:
    """(rows read in rowid order, damaged spots stepped over, why the table could not be read at all)."""
    columns = ", ".join(names)
    rows: list[dict[str, object]] = []
    last, spots = 0, 0
    while True:
        try:
            for record in con.execute(f"SELECT rowid, {columns} FROM {table} WHERE rowid > ? ORDER BY rowid",
                                      (last,)):
                last = record[0]
                rows.append(dict(zip(names, record[1:], strict=True)))
            return rows, spots, ""
        except sqlite3.DatabaseError as exc:
            if not rows and spots == 0 and _unreadable_table(exc):
                return [], 0, f"cannot be read ({exc})"
            spots += 1
            found = _next_readable(con, table, columns, last) if spots <= MAX_DAMAGED_SPOTS else None
            if found is None:
                return rows, spots, ""
            last = found[0]  # the scan goes on after the row the probe found (always forward)
            rows.append(dict(zip(names, found[1:], strict=True)))


def _unreadable_table(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc)
    return "no such table" in text or "not a database" in text or "malformed database schema" in text


def _next_readable(con: sqlite3.Connection, table: str, columns: str, after: int) -> tuple[object, ...] | None:
    """The first row past rowid ``after`` (within PROBE_WINDOW) that can be read, as (rowid, values...)."""
    for rowid in range(after + 1, after + 1 + PROBE_WINDOW):
        try:
            record = con.execute(f"SELECT rowid, {columns} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if record is not None:
            return tuple(record)
    return None


def _fill(fresh: Path, salvaged: dict[str, list[dict[str, object]]], report: RepairReport) -> None:
    """Insert every salvaged row that decodes (runs first), then drop rows whose run did not survive."""
    con = sqlite3.connect(fresh, isolation_level=None)
    try:
        con.execute("BEGIN")
        for table in TABLES:
            names = list(COLUMNS[table])
            insert = (f"INSERT OR IGNORE INTO {table} ({', '.join(names)}) "
                      f"VALUES ({', '.join('?' * len(names))})")
            kept = dropped = 0
            for row in salvaged[table]:
                if table == "runs" and isinstance(row.get("overrides"), str):
                    try:
                        decode_overrides(row["overrides"])  # type: ignore[arg-type]
                    except BadRow as exc:
                        report.note(f"run {str(row.get('run_id'))[:60]!r}: {exc}; its overrides were reset "
                                            "to none")
                        row = {**row, "overrides": "[]"}
                try:
                    DECODERS[table](row)
                    cursor = con.execute(insert, [row[n] for n in names])
                except (BadRow, sqlite3.IntegrityError) as exc:
                    dropped += 1
                    report.note(f"{table} row of run {str(row.get('run_id'))[:60]!r} dropped: {exc}")
                    continue
                kept += cursor.rowcount
                dropped += 1 - cursor.rowcount  # a duplicate key (a damaged index) keeps the first copy
            report.kept[table], report.dropped[table] = kept, dropped
        # Rows whose run was lost cannot be shown or used: they go too; array links to lost runs are cut.
        con.execute("UPDATE runs SET array_parent = NULL WHERE array_parent NOT IN (SELECT run_id FROM runs)")
        for table in RUN_TABLES:
            orphans = con.execute(f"DELETE FROM {table} WHERE run_id NOT IN (SELECT run_id FROM runs)").rowcount
            if orphans:
                report.kept[table] -= orphans
                report.dropped[table] += orphans
                report.note(f"{table}: {orphans} row(s) of runs that were lost dropped")
        con.execute("COMMIT")
    finally:
        con.close()
