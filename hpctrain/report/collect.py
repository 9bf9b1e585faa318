"""What a run's files say, as plain data for the report: metrics split into the attempts of the requeue chain,
the step profile, every rank's busy time, checkpoints and their write times, the failure note, evaluation scores.

Pure: it reads a directory that holds the run's files (the run directory itself, or the copy fetched from a login
node) and the registry's facts handed in; it runs no command and imports no torch. Every file goes through the one
reader of run files (``hpctrain.run_files``: regular files only, each capped below, JSON nesting bounded); the
JSON-lines files are streamed, and above MAX_RECORDS records (MAX_INTERVALS busy-time intervals) only an evenly
spaced sample of them is kept for the figures, so that a long run's report takes bounded memory.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hpctrain.nodes.blame import BLAME_FILE, Blame, parse_blames
from hpctrain.run_files import (
    GIB,
    KIB,
    MIB,
    json_record,
    read_run_head,
    read_run_json,
    read_run_text,
    run_json_lines,
    run_lines,
)

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
# The most the report reads of each file (docs/report.md); a bigger file is refused, the cap named.
LINES_CAP = 2 * GIB  # metrics.jsonl, rank_times.jsonl: streamed, never whole in memory
ATTEMPTS_CAP = 64 * MIB  # attempts.jsonl: a line per attempt
JSON_CAP = 64 * MIB  # profile.json, scores.json, checkpoints/manifest.json: read whole
NODE_FILE_CAP = 16 * MIB  # each ranks/node-*.txt: a line per rank of the node, per attempt
NOTE_BYTES = 4 * KIB  # failure.txt: its first line is the note
BLAME_CAP = 16 * MIB  # blamed-nodes.jsonl: a line per blamed node
# Interval records kept for the figures: above this many, an evenly spaced sample (every k-th, k a power of 2);
# the figures draw at most figures.MAX_POINTS of them per line anyway.
MAX_RECORDS = 10_000
# Busy-time intervals kept for the heat map and the per-rank means, and the cells (intervals x ranks) they may hold.
MAX_INTERVALS = 2_000
MAX_CELLS = 1_000_000
# Restarts marked on the figures and listed; more are counted.
MAX_MARKS = 100


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
    attempts: int = 0  # attempts that wrote interval records (0: count those in ``records``)
    restarts: int = 0  # restarts found (``marks`` holds the first MAX_MARKS)
    intervals: int = 0  # interval records in metrics.jsonl (``records`` holds a sample above MAX_RECORDS)
    blames: list[Blame] = field(default_factory=list)  # the nodes the run blamed (blamed-nodes.jsonl)

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


class Sample:
    """At most ``limit`` items of a stream, evenly spaced: every k-th by its index, k doubling whenever ``limit`` is
    passed; pinned items (the first record of an attempt) are always kept. ``wants`` says before an item is
    parsed whether it would be kept."""

    def __init__(self, limit: int) -> None:
        self.limit, self.every = max(1, limit), 1
        self._kept: list[tuple[int, bool, Any]] = []
        self._free = 0  # kept items that are not pinned

    def wants(self, index: int) -> bool:
        return index % self.every == 0

    def add(self, index: int, item: Any, pinned: bool = False) -> None:
        if pinned or self.wants(index):
            self._kept.append((index, pinned, item))
            self._free += not pinned
            self._fit()

    def tighten(self, limit: int) -> None:
        """Keep at most ``limit`` from now on (the items grew bigger)."""
        if limit < self.limit:
            self.limit = max(1, limit)
            self._fit()

    def _fit(self) -> None:
        while self._free > self.limit:
            self.every *= 2
            self._kept = [e for e in self._kept if e[1] or e[0] % self.every == 0]
            self._free = sum(1 for _, pinned, _ in self._kept if not pinned)

    @property
    def last_index(self) -> int | None:
        return self._kept[-1][0] if self._kept else None

    def items(self) -> list[Any]:
        return [item for _, _, item in self._kept]


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


class AttemptSplit:
    """Numbers records by the attempt that wrote them, one record at a time, and marks where each later attempt
    took over (the first MAX_MARKS; ``restarts`` counts them all).

    A record belongs to the latest attempt started before its time; without starts (a bare directory of an older
    run), a new attempt begins wherever the step does not go forward (a resume from an earlier checkpoint).
    """

    def __init__(self, starts: list[AttemptStart]) -> None:
        self.starts = sorted(starts, key=lambda a: a.time)
        self._times = [a.time for a in self.starts]
        self.marks: list[Mark] = []
        self.restarts = 0
        self.current, self.last_step, self.seen = 0, None, False
        self._numbers: set[int] = set()

    @property
    def attempts(self) -> int:
        """How many attempts wrote a record."""
        return len(self._numbers) if self.starts else (self.current + 1 if self.seen else 0)

    def attempt_of(self, record: dict[str, Any]) -> int | None:
        """The record's attempt (None: the record has no step and is not one of the interval records)."""
        t, step = record.get("time"), record.get("step")
        if not isinstance(step, int | float):
            return None
        attempt = self.current
        if self.starts and isinstance(t, int | float):
            attempt = max(0, bisect_right(self._times, t) - 1)
        elif self.last_step is not None and step <= self.last_step:
            attempt = self.current + 1
        if attempt > self.current and self.seen:
            self.restarts += 1
            if len(self.marks) < MAX_MARKS:
                self.marks.append(self._mark(attempt, step, t))
        self.current, self.last_step, self.seen = attempt, step, True
        if self.starts:
            self._numbers.add(attempt)
        return attempt

    def _mark(self, attempt: int, step: int | float, t: Any) -> Mark:
        start = self.starts[attempt] if attempt < len(self.starts) else None
        resumed = start.step if start is not None and start.step is not None else self.last_step
        when = start.time if start is not None else float(t if isinstance(t, int | float) else 0.0)
        return Mark(int(resumed if resumed is not None else step), when,
                    start.label if start is not None else f"restart {attempt}",
                    start.kind if start is not None else "restart", start.how if start is not None else "")


@dataclass
class Metrics:
    """What metrics.jsonl holds for the report: the kept interval records (a sample above MAX_RECORDS, the first
    of each attempt and the newest always among them), the final record, the restarts marked and counted."""

    records: list[dict[str, Any]]
    final: dict[str, Any] | None
    marks: list[Mark]
    attempts: int
    restarts: int
    total: int  # interval records in the file


def read_metrics(directory: Path, attempts: tuple[Attempt, ...], problems: list[str]) -> Metrics:
    """metrics.jsonl streamed: each interval record numbered by its attempt, an evenly spaced sample kept."""
    try:
        starts = attempt_starts(list(run_json_lines(directory / ATTEMPTS_FILE, ATTEMPTS_CAP)), attempts)
    except OSError as exc:
        problems.append(f"cannot read {ATTEMPTS_FILE}: {exc.strerror}")
        starts = attempt_starts([], attempts)
    split = AttemptSplit(starts)
    sample = Sample(MAX_RECORDS)
    final: dict[str, Any] | None = None
    newest: tuple[int, dict[str, Any]] | None = None
    total, previous, pins = 0, None, 0
    try:
        for row in run_json_lines(directory / METRICS_FILE, LINES_CAP):
            if row.get("final"):
                final = row
                continue
            attempt = split.attempt_of(row)
            if attempt is None:
                continue
            row["attempt"] = attempt
            pinned = attempt != previous and pins < MAX_MARKS  # each attempt's first record: its colour is drawn
            pins += pinned
            sample.add(total, row, pinned)
            newest, previous = (total, row), attempt
            total += 1
    except OSError as exc:
        problems.append(f"cannot read {METRICS_FILE}: {exc.strerror}")
    records = sample.items()
    if newest is not None and sample.last_index != newest[0]:
        records.append(newest[1])  # the summary's progress is the newest record
    return Metrics(records, final, split.marks, split.attempts, split.restarts, total)


def read_hosts(directory: Path) -> dict[int, str]:
    """rank -> host, from the ranks/node-*.txt lines ``rank R pid P host H ...`` (the newest attempt wins)."""
    hosts: dict[int, str] = {}
    for path in sorted((directory / RANKS_DIR).glob("node-*.txt")):
        try:
            lines = (read_run_text(path, NODE_FILE_CAP) or "").splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if len(words) >= 6 and words[0] == "rank" and words[4] == "host" and words[1].isdigit():
                hosts[int(words[1])] = words[5]
    return hosts


def read_rank_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of rank_times.jsonl with busy times: all of them up to MAX_INTERVALS (and MAX_CELLS values), else
    an evenly spaced sample; the lines left out are not parsed."""
    sample = Sample(MAX_INTERVALS)
    for number, raw in run_lines(path, LINES_CAP):
        if not sample.wants(number - 1):
            continue
        row = json_record(raw, path, number)
        if row is None or not isinstance(row.get("busy_s"), list) or not isinstance(row.get("step"), int):
            continue
        sample.tighten(MAX_CELLS // max(1, len(row["busy_s"])))
        sample.add(number - 1, row)
    return sample.items()


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
    try:
        manifest = read_run_json(directory / "checkpoints" / MANIFEST_FILE, JSON_CAP)
    except OSError as exc:
        problems.append(f"cannot read checkpoints/{MANIFEST_FILE}: {exc.strerror}")
        return []
    except ValueError:
        problems.append(f"checkpoints/{MANIFEST_FILE} is not JSON")
        return []
    if manifest is None:
        return []
    entries = manifest.get("checkpoints", []) if isinstance(manifest, dict) else None
    if not isinstance(entries, list):
        problems.append(f"checkpoints/{MANIFEST_FILE} is not a checkpoint manifest")
        return []
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("step"), int):
            continue
        files = e.get("files")
        nbytes = sum(f["bytes"] for f in (files if isinstance(files, list) else [])
                     if isinstance(f, dict) and isinstance(f.get("bytes"), int) and not isinstance(f["bytes"], bool))
        created = e.get("created")
        out.append(CheckpointEntry(e["step"], iso_epoch(created if isinstance(created, str) else None), nbytes))
    return sorted(out, key=lambda c: c.step)


def read_json(directory: Path, name: str, problems: list[str]) -> dict[str, Any] | None:
    """A JSON object file of the run; None when missing, not an object, or not JSON yet (noted)."""
    try:
        value = read_run_json(directory / name, JSON_CAP)
    except OSError as exc:
        problems.append(f"cannot read {name}: {exc.strerror}")
        return None
    except ValueError:
        problems.append(f"{name} is not JSON (a writer may be replacing it)")
        return None
    return value if isinstance(value, dict) else None


def collect(directory: Path, facts: RunFacts, *, extra_dirs: tuple[Path, ...] = ()) -> ReportData:
    """Everything the report shows that the run's files hold (the plan comparison is added by the caller)."""
    data = ReportData(facts)
    problems = data.problems
    metrics = read_metrics(directory, facts.attempts, problems)
    data.records, data.final, data.marks = metrics.records, metrics.final, metrics.marks
    data.attempts, data.restarts, data.intervals = metrics.attempts, metrics.restarts, metrics.total
    data.profile = read_json(directory, PROFILE_FILE, problems)
    per_node = _count((data.profile or {}).get("ranks_per_node"))
    try:
        rows = read_rank_rows(directory / RANK_TIMES_FILE)
    except OSError as exc:
        problems.append(f"cannot read {RANK_TIMES_FILE}: {exc.strerror}")
        rows = []
    if rows:
        data.ranks = rank_times(rows, per_node, read_hosts(directory))
    data.checkpoints = read_checkpoints(directory, problems)
    try:
        note = read_run_head(directory / FAILURE_FILE, NOTE_BYTES)
    except OSError as exc:
        problems.append(f"cannot read {FAILURE_FILE}: {exc.strerror}")
        note = None
    data.failure = (note or "").strip().splitlines()[0] if (note or "").strip() else ""
    try:
        data.blames = parse_blames(read_run_text(directory / BLAME_FILE, BLAME_CAP) or "")
    except OSError as exc:
        problems.append(f"cannot read {BLAME_FILE}: {exc.strerror}")
    for place in (directory, *extra_dirs):
        if data.scores is None:
            data.scores = read_json(place, SCORES_FILE, problems)
    return data


def _count(value: Any) -> int:
    """A positive count from a file (ranks per node), 1 where it is missing or not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


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
