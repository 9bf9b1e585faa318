"""The run registry's records: runs, their submissions, checkpoints and blamed nodes as read from its rows, and the
checks that turn a row whose values are not what the schema promises (a damaged or hand-edited file) into ``BadRow``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpctrain.nodes.blame import KINDS, Blame
from hpctrain.submission.schedulers.state import JobState

TABLES = ("runs", "submissions", "checkpoints", "blamed_nodes", "forgotten_nodes")
# Tables of rows that belong to one run (deleted with it, dropped by a repair when their run is lost).
RUN_TABLES = ("submissions", "checkpoints", "blamed_nodes")
SUBMISSION_KINDS = ("submit", "requeue", "resubmit", "resume")
# Run states besides JobState values: nothing submitted yet, or every submission attempt failed.
CREATED = "created"
SUBMIT_FAILED = "submit_failed"
ACTIVE_STATES = tuple(s.value for s in JobState if s.is_active)
ENDED_STATES = frozenset(s.value for s in JobState if s.is_terminal)


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
class CheckpointRecord:
    """A checkpoint a run wrote, as the registry keeps it."""

    run_id: str
    step: int
    path: str
    created: str


class BadRow(ValueError):
    """A registry row whose values are not what the schema promises (a damaged or hand-edited file)."""


_TEXT, _OPT_TEXT, _INT, _OPT_INT = (str,), (str, type(None)), (int,), (int, type(None))
_RUN_COLUMNS = {"run_id": _TEXT, "name": _TEXT, "site": _TEXT, "remote": _OPT_TEXT, "spec_hash": _TEXT,
                "spec_path": _OPT_TEXT, "run_dir": _TEXT, "created": _TEXT, "state": _TEXT, "state_reason": _TEXT,
                "array_parent": _OPT_TEXT, "array_index": _OPT_INT, "overrides": _TEXT}
_SUBMISSION_COLUMNS = {"run_id": _TEXT, "seq": _INT, "job_id": _OPT_TEXT, "kind": _TEXT, "submitted_at": _TEXT,
                       "ok": _INT, "error": _OPT_TEXT, "state": _OPT_TEXT, "state_reason": _TEXT,
                       "exit_code": _OPT_INT, "restart_count": _INT, "updated_at": _OPT_TEXT}
_CHECKPOINT_COLUMNS = {"run_id": _TEXT, "step": _INT, "path": _TEXT, "created": _TEXT}
_BLAME_COLUMNS = {"run_id": _TEXT, "node": _TEXT, "kind": _TEXT, "source": _TEXT, "job": _TEXT, "restart": _INT,
                  "cause": _TEXT, "ranks": _TEXT, "time": (float, int), "recorded": _TEXT}
_FORGOTTEN_COLUMNS = {"site": _TEXT, "node": _TEXT, "forgotten": _TEXT}
COLUMNS = {"runs": _RUN_COLUMNS, "submissions": _SUBMISSION_COLUMNS, "checkpoints": _CHECKPOINT_COLUMNS,
           "blamed_nodes": _BLAME_COLUMNS, "forgotten_nodes": _FORGOTTEN_COLUMNS}


def _checked(row: Mapping[str, object] | sqlite3.Row, columns: Mapping[str, tuple[type, ...]]) -> dict[str, object]:
    values = {name: row[name] for name in columns}
    for name, types in columns.items():
        value = values[name]
        if not isinstance(value, types) or isinstance(value, bool):
            raise BadRow(f"{name} holds {type(value).__name__} {str(value)[:40]!r}")
    return values


def decode_overrides(text: str) -> list[str]:
    """A run's ``overrides`` column: a JSON list of ``KEY=VALUE`` strings."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadRow(f"overrides is not JSON ({str(exc)[:60]})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRow("overrides is not a list of KEY=VALUE texts")
    return value


def decode_run(row: Mapping[str, object] | sqlite3.Row) -> Run:
    """A run row as a Run; BadRow when a value is not of its column's type."""
    v = _checked(row, _RUN_COLUMNS)
    return Run(v["run_id"], v["name"], v["site"], v["remote"], v["spec_hash"], v["spec_path"],  # type: ignore[arg-type]
               v["run_dir"], v["created"], v["state"], v["state_reason"], v["array_parent"],  # type: ignore[arg-type]
               v["array_index"], decode_overrides(v["overrides"]))  # type: ignore[arg-type]


def decode_submission(row: Mapping[str, object] | sqlite3.Row) -> Submission:
    """A submission row as a Submission; BadRow when a value is not of its column's type."""
    v = _checked(row, _SUBMISSION_COLUMNS)
    if v["kind"] not in SUBMISSION_KINDS or v["ok"] not in (0, 1):
        raise BadRow(f"kind {v['kind']!r} / ok {v['ok']!r} are not values this registry writes")
    return Submission(v["run_id"], v["seq"], v["job_id"], v["kind"], v["submitted_at"],  # type: ignore[arg-type]
                      bool(v["ok"]), v["error"], v["state"], v["state_reason"], v["exit_code"],  # type: ignore[arg-type]
                      v["restart_count"], v["updated_at"])  # type: ignore[arg-type]


def decode_checkpoint(row: Mapping[str, object] | sqlite3.Row) -> CheckpointRecord:
    """A checkpoint row as a CheckpointRecord; BadRow when a value is not of its column's type."""
    v = _checked(row, _CHECKPOINT_COLUMNS)
    return CheckpointRecord(v["run_id"], v["step"], v["path"], v["created"])  # type: ignore[arg-type]


@dataclass(frozen=True)
class BlamedNode:
    """A node a run blamed, as the registry keeps it: the blame and when a poll first recorded it."""

    run_id: str
    blame: Blame
    recorded: str


def decode_blame(row: Mapping[str, object] | sqlite3.Row) -> BlamedNode:
    """A blamed_nodes row as a BlamedNode; BadRow when a value is not of its column's type."""
    v = _checked(row, _BLAME_COLUMNS)
    try:
        ranks = json.loads(v["ranks"])  # type: ignore[arg-type]
    except (ValueError, RecursionError):
        ranks = None
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise BadRow("ranks is not a list of rank numbers")
    if v["kind"] not in KINDS:
        raise BadRow(f"kind {v['kind']!r} is not a kind of blame")
    blame = Blame(node=v["node"], cause=v["cause"], kind=v["kind"], ranks=tuple(ranks),  # type: ignore[arg-type]
                  source=v["source"], job=v["job"], restart=v["restart"], time=float(v["time"]))  # type: ignore[arg-type]
    return BlamedNode(v["run_id"], blame, v["recorded"])  # type: ignore[arg-type]


def decode_forgotten(row: Mapping[str, object] | sqlite3.Row) -> tuple[str, str, str]:
    """A forgotten_nodes row as (site, node, when); BadRow when a value is not text."""
    v = _checked(row, _FORGOTTEN_COLUMNS)
    return v["site"], v["node"], v["forgotten"]  # type: ignore[return-value]


DECODERS: dict[str, Callable[[Mapping[str, object] | sqlite3.Row], object]] = {
    "runs": decode_run, "submissions": decode_submission, "checkpoints": decode_checkpoint,
    "blamed_nodes": decode_blame, "forgotten_nodes": decode_forgotten}


def row_name(row: Mapping[str, object] | sqlite3.Row) -> str:
    """The run id a row names, for messages about it (``?`` when it has none)."""
    try:
        return repr(row["run_id"])[:80]
    except (IndexError, KeyError):
        return "?"
