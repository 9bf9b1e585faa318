"""What a run's files say, as plain data for the report: metrics split into the attempts of the requeue chain,
the step profile, every rank's busy time, checkpoints and their write times, the failure note, evaluation scores.

Pure: it reads a directory that holds the run's files (the run directory itself, or the copy fetched from a login
node) and the registry's facts handed in; it runs no command and imports no torch.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hpctrain.text import json_lines

METRICS_FILE = "metrics.jsonl"
ATTEMPTS_FILE = "attempts.jsonl"
PROFILE_FILE = "profile.json"
RANK_TIMES_FILE = "rank_times.jsonl"
FAILURE_FILE = "failure.txt"
JOB_FILE = "job.yaml"
SCORES_FILE = "scores.json"
RANKS_DIR = "ranks"
MANIFEST_FILE = "manifest.json"
# Per-rank rows up to this many ranks; above it, one row per node (its slowest rank).
MAX_RANK_ROWS = 64


@dataclass(frozen=True)
class Attempt:
    """One entry of the registry's chain: a submission, requeue, resubmission or resume."""

    seq: int
    kind: str
    started: float  # epoch seconds
    state: str | None
    reason: str
    exit_code: int | None
    how: str = ""  # what started it after the kind: "after a checkpoint", "by the user after a cancel" (views)


@dataclass(frozen=True)
class RunFacts:
    """What the registry knows of the run (a bare run directory has only its path)."""

    title: str
    where: str
    state: str = "unknown"
    reason: str = ""
    site: str = ""
    attempts: tuple[Attempt, ...] = ()
    total_steps: int | None = None
    ended: bool = False  # the registry says the run will not change by itself any more


@dataclass(frozen=True)
class Mark:
    """Where an attempt after the first took over: the step it resumed after, when it started, its label ("resume
    1"), what kind of restart it was ("requeue", "resume", "restart" where no chain says) and what started it."""

    step: int
    time: float
    label: str
    kind: str = "restart"
    how: str = ""


@dataclass(frozen=True)
class CheckpointEntry:
    step: int
    written: float | None  # epoch seconds of the commit
    nbytes: int


@dataclass(frozen=True)
class Slowest:
    """The slowest row's mean busy seconds per step and what it is set against: the other row's (``other`` names
    it) where there are two, the median of all rows where there are more, nothing for a single row."""

    name: str
    busy: float
    against: float | None
    other: str = ""

    def comparison(self, digits: int = 3) -> str:
        """"against 57.100 ms for rank 0", "against a median of 57.100 ms", or '' for a single row."""
        if self.against is None:
            return ""
        ms = f"{self.against * 1e3:.{digits}f} ms"
        return f"against {ms} for {self.other}" if self.other else f"against a median of {ms}"


@dataclass(frozen=True)
class RankTimes:
    """Busy seconds per step (input + compute) of each row (a rank, or a node's slowest rank) per interval."""

    steps: tuple[int, ...]
    rows: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]  # [row][interval]

    def means(self) -> list[float | None]:
        out: list[float | None] = []
        for row in self.values:
            seen = [v for v in row if v is not None]
            out.append(sum(seen) / len(seen) if seen else None)
        return out

    def slowest(self) -> Slowest | None:
        """The row with the highest mean busy time, against the other row where there are two, else against the
        median of all rows (the mean of the two middle ones for an even count)."""
        means = [(m, name) for m, name in zip(self.means(), self.rows, strict=True) if m is not None]
        if not means:
            return None
        top, name = max(means)
        if len(means) == 1:
            return Slowest(name, top, None, "")
        if len(means) == 2:
            other, other_name = min(means)
            return Slowest(name, top, other, other_name)
        return Slowest(name, top, statistics.median(m for m, _ in means), "")


@dataclass
class ReportData:
    facts: RunFacts
    records: list[dict[str, Any]] = field(default_factory=list)  # interval records, each with its "attempt"
    final: dict[str, Any] | None = None
    marks: list[Mark] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    ranks: RankTimes | None = None
    checkpoints: list[CheckpointEntry] = field(default_factory=list)
    failure: str = ""
    scores: dict[str, Any] | None = None
    efficiency: Any = None  # report.efficiency.Efficiency, or None with efficiency_note
    efficiency_note: str = ""
    slices: list[tuple[str, Any]] = field(default_factory=list)  # (title, 2-D label array)
    slices_note: str = ""
    problems: list[str] = field(default_factory=list)  # files that could not be read, in words

    @property
    def sample_unit(self) -> str:
        return str((self.profile or {}).get("sample_unit", "samples"))


def iso_epoch(text: str | None) -> float | None:
    """A registry or manifest time (ISO 8601, UTC) as epoch seconds."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _read(path: Path, problems: list[str]) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(f"cannot read {path.name}: {exc.strerror}")
        return None


@dataclass(frozen=True)
class AttemptStart:
    """When an attempt began training, from which step (None: not known), and what started it."""

    time: float
    step: int | None
    label: str
    kind: str = "restart"
    how: str = ""


def attempt_starts(lines: list[dict[str, Any]], chain: tuple[Attempt, ...]) -> list[AttemptStart]:
    """From ``attempts.jsonl`` (rank 0's clock, the records' clock) where the run wrote it, labelled by the chain's
    entries in order; else from the chain's submission times (when a poll saw each requeue: later than the
    attempt's start when nobody polled meanwhile)."""
    ordered = sorted(chain, key=lambda a: a.seq)

    def kind(i: int) -> str:
        return "start" if i == 0 else ordered[i].kind if i < len(ordered) else "restart"

    def how(i: int) -> str:
        return ordered[i].how if 0 < i < len(ordered) else ""

    known = sorted((line for line in lines if isinstance(line.get("time"), int | float)), key=lambda x: x["time"])
    if known:
        return [AttemptStart(float(line["time"]), line["step"] if isinstance(line.get("step"), int) else None,
                             "start" if i == 0 else f"{kind(i)} {i}", kind(i), how(i))
                for i, line in enumerate(known)]
    return [AttemptStart(a.started, None, "start" if i == 0 else f"{kind(i)} {i}", kind(i), how(i))
            for i, a in enumerate(ordered)]


def split_attempts(records: list[dict[str, Any]], starts: list[AttemptStart]) -> tuple[list[dict[str, Any]],
                                                                                      list[Mark]]:
    """Number each record by the attempt that wrote it and mark where each later attempt took over.

    A record belongs to the latest attempt started before its time; without starts (a bare directory of an older
    run), a new attempt begins wherever the step does not go forward (a resume from an earlier checkpoint).
    """
    starts = sorted(starts, key=lambda a: a.time)
    out, marks = [], []
    current, last_step = 0, None
    for record in records:
        t, step = record.get("time"), record.get("step")
        if not isinstance(step, int | float):
            continue
        attempt = current
        if starts and isinstance(t, int | float):
            attempt = max(0, sum(1 for a in starts if a.time <= t) - 1)
        elif last_step is not None and step <= last_step:
            attempt = current + 1
        if attempt > current and out:
            start = starts[attempt] if attempt < len(starts) else None
            resumed = start.step if start is not None and start.step is not None else last_step
            when = start.time if start is not None else float(t if isinstance(t, int | float) else 0.0)
            marks.append(Mark(int(resumed if resumed is not None else step), when,
                              start.label if start is not None else f"restart {attempt}",
                              start.kind if start is not None else "restart", start.how if start is not None else ""))
        current, last_step = attempt, step
        out.append({**record, "attempt": attempt})
    return out, marks


def read_metrics(directory: Path, attempts: tuple[Attempt, ...], problems: list[str]
                 ) -> tuple[list[dict[str, Any]], dict[str, Any] | None, list[Mark]]:
    text = _read(directory / METRICS_FILE, problems)
    if text is None:
        return [], None, []
    rows = json_lines(text)
    finals = [r for r in rows if r.get("final")]
    starts = attempt_starts(json_lines(_read(directory / ATTEMPTS_FILE, problems) or ""), attempts)
    records, marks = split_attempts([r for r in rows if not r.get("final")], starts)
    return records, (finals[-1] if finals else None), marks


def read_hosts(directory: Path) -> dict[int, str]:
    """rank -> host, from the ranks/node-*.txt lines ``rank R pid P host H ...`` (the newest attempt wins)."""
    hosts: dict[int, str] = {}
    for path in sorted((directory / RANKS_DIR).glob("node-*.txt")):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if len(words) >= 6 and words[0] == "rank" and words[4] == "host" and words[1].isdigit():
                hosts[int(words[1])] = words[5]
    return hosts


def rank_times(rows: list[dict[str, Any]], ranks_per_node: int, hosts: dict[int, str]) -> RankTimes | None:
    """The busy-time matrix: per rank up to MAX_RANK_ROWS ranks, else per node (its slowest rank)."""
    rows = [r for r in rows if isinstance(r.get("busy_s"), list) and isinstance(r.get("step"), int)]
    if not rows:
        return None
    ranks = max(len(r["busy_s"]) for r in rows)
    per_node = ranks > MAX_RANK_ROWS and ranks_per_node > 0
    groups = ((ranks + ranks_per_node - 1) // ranks_per_node) if per_node else ranks
    names = []
    for g in range(groups):
        first = g * ranks_per_node if per_node else g
        host = hosts.get(first)
        kind = "node" if per_node else "rank"
        names.append(f"{kind} {g}" + (f" ({host})" if host else ""))
    matrix: list[list[float | None]] = [[] for _ in range(groups)]
    for r in rows:
        busy = [v if isinstance(v, int | float) and math.isfinite(v) else None for v in r["busy_s"]]
        busy += [None] * (ranks - len(busy))
        for g in range(groups):
            part = busy[g * ranks_per_node:(g + 1) * ranks_per_node] if per_node else [busy[g]]
            seen = [v for v in part if v is not None]
            matrix[g].append(max(seen) if seen else None)
    return RankTimes(tuple(r["step"] for r in rows), tuple(names), tuple(tuple(m) for m in matrix))


def read_checkpoints(directory: Path, problems: list[str]) -> list[CheckpointEntry]:
    """The committed checkpoints of the run's manifest (those still kept), oldest first."""
    text = _read(directory / "checkpoints" / MANIFEST_FILE, problems)
    if text is None:
        return []
    try:
        entries = json.loads(text).get("checkpoints", [])
    except (ValueError, AttributeError):
        problems.append("checkpoints/manifest.json is not JSON")
        return []
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("step"), int):
            continue
        nbytes = sum(f.get("bytes", 0) for f in e.get("files", []) if isinstance(f, dict))
        out.append(CheckpointEntry(e["step"], iso_epoch(e.get("created")), int(nbytes)))
    return sorted(out, key=lambda c: c.step)


def read_json(directory: Path, name: str, problems: list[str]) -> dict[str, Any] | None:
    text = _read(directory / name, problems)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        problems.append(f"{name} is not JSON (a writer may be replacing it)")
        return None
    return value if isinstance(value, dict) else None


def collect(directory: Path, facts: RunFacts, *, extra_dirs: tuple[Path, ...] = ()) -> ReportData:
    """Everything the report shows that the run's files hold (the plan comparison is added by the caller)."""
    data = ReportData(facts)
    problems = data.problems
    data.records, data.final, data.marks = read_metrics(directory, facts.attempts, problems)
    data.profile = read_json(directory, PROFILE_FILE, problems)
    per_node = int((data.profile or {}).get("ranks_per_node") or 1)
    text = _read(directory / RANK_TIMES_FILE, problems)
    if text is not None:
        data.ranks = rank_times(json_lines(text), per_node, read_hosts(directory))
    data.checkpoints = read_checkpoints(directory, problems)
    note = _read(directory / FAILURE_FILE, problems)
    data.failure = (note or "").strip().splitlines()[0] if (note or "").strip() else ""
    for place in (directory, *extra_dirs):
        if data.scores is None:
            data.scores = read_json(place, SCORES_FILE, problems)
    return data


def score_rows(scores: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The evaluation table: one row per method (FFN, baselines) with the metrics they share."""
    methods = {name: v for name, v in scores.items()
               if isinstance(v, dict) and v and any(isinstance(x, int | float) and not isinstance(x, bool)
                                                    for x in v.values())}
    wanted = ("voi", "voi_split", "voi_merge", "adapted_rand_error", "segments")
    columns = [c for c in wanted if any(c in v for v in methods.values())]
    if not columns:
        columns = sorted({k for v in methods.values() for k, x in v.items() if isinstance(x, int | float)})[:6]
    rows = []
    for name, v in methods.items():
        if not any(c in v for c in columns):
            continue  # timings and settings beside the scores
        cells = [name]
        for c in columns:
            x = v.get(c)
            cells.append("-" if not isinstance(x, int | float) else f"{x:.3f}" if isinstance(x, float) else str(x))
        rows.append(cells)
    return ["method", *columns], rows
