"""Batched state tracking: ONE transport call per poll for all active runs of a (site, login node) pair.

The call is one small ``sh`` script that runs the scheduler's status commands with their fallbacks (Slurm:
``sacct -P`` else ``sacct -c``, then ``squeue -t all`` else ``scontrol``) and ``tail -n 1`` of every run's
``metrics.jsonl``, so a poll over ssh costs one round trip. Local-site runs are read from their run dirs.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError, TransportError
from hpctrain.exit_codes import EXIT_REQUEUE
from hpctrain.submission.registry import CREATED, SUBMIT_FAILED, Registry, Run
from hpctrain.submission.schedulers.base import EXIT_LOG
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus, is_unknown_job_error
from hpctrain.submission.transport import LocalTransport, SSHTransport, Transport

META_FILE = "submit.json"
METRICS_FILE = "metrics.jsonl"
STATUS_TIMEOUT_S = 60.0
_MARK = "@@hpctrain-section"
_ARRAY_RANGE = re.compile(r"^(?P<master>[^_\[\]]+)_\[(?P<spec>[^\]]+)\](?P<rest>.*)$")


# --- where a run lives ----------------------------------------------------------------------------------------


def record_dir(registry: Registry, run_id: str) -> Path:
    """Local directory beside the registry holding what was submitted (job.yaml, job.sh, submit.json)."""
    return Path(registry.path).parent / "runs" / run_id


@dataclass(frozen=True)
class RunMeta:
    """How to reach a run again from a later process (kept in ``submit.json`` beside the registry)."""

    scheduler: str
    ssh_config: str | None = None
    log_name: str = ""  # the scheduler's output file in the run dir; "{job_id}" is replaced
    total_steps: int | None = None
    array_master: str | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1)


def read_meta(registry: Registry, run: Run) -> RunMeta:
    """The run's submit.json, or what the site profile says when it is gone."""
    try:
        data = json.loads((record_dir(registry, run.run_id) / META_FILE).read_text(encoding="utf-8"))
        return RunMeta(**{k: v for k, v in data.items() if k in RunMeta.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        from hpctrain.config.site import load_site

        try:
            return RunMeta(scheduler=load_site(run.site).scheduler)
        except HpctrainError:
            return RunMeta(scheduler="slurm" if run.site != "local" else "local")


# --- transports ---------------------------------------------------------------------------------------------


TransportFactory = Callable[[str | None, str | None], Transport]


def default_transport_factory(remote: str | None, ssh_config: str | None) -> Transport:
    """LocalTransport on the login node, else one SSHTransport (ControlMaster) for ``remote``."""
    if remote is None:
        return LocalTransport()
    return SSHTransport(remote, ssh_config=ssh_config)


@dataclass
class TransportPool:
    """One transport per (remote, ssh config) for the life of a command: every call reuses its master."""

    factory: TransportFactory = default_transport_factory
    _made: dict[tuple[str | None, str | None], Transport] = field(default_factory=dict)

    def get(self, remote: str | None, ssh_config: str | None = None) -> Transport:
        key = (remote, ssh_config)
        if key not in self._made:
            self._made[key] = self.factory(remote, ssh_config)
        return self._made[key]

    def close(self, stop_masters: bool = False) -> None:
        """Forget the transports; ``stop_masters`` also ends their ssh masters (else they persist)."""
        if stop_masters:
            for t in self._made.values():
                close = getattr(t, "close", None)
                if close is not None:
                    close()
        self._made.clear()


# --- views ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Training progress from the last line of a run's metrics.jsonl."""

    step: int | None
    total: int | None
    loss: float | None
    rate: float | None

    def text(self) -> str:
        if self.step is None:
            return ""
        parts = [f"step {self.step}" + (f"/{self.total}" if self.total else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.rate is not None:
            parts.append(f"{self.rate:.3g}/s/rank")
        return "  ".join(parts)


def progress_from_record(record: Mapping[str, Any] | None, total: int | None) -> Progress | None:
    if not record:
        return None
    def num(key: str) -> float | None:
        value = record.get(key)
        return float(value) if isinstance(value, int | float) else None
    step = record.get("step")
    return Progress(int(step) if isinstance(step, int | float) else None, total, num("loss"),
                    num("per_rank_rate"))


@dataclass(frozen=True)
class RunView:
    """What ``hpctrain status`` shows for one run."""

    run_id: str
    name: str
    site: str
    remote: str | None
    job_id: str | None
    state: str
    reason: str
    run_dir: str
    progress: Progress | None = None
    poll_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["progress"] = self.progress.__dict__ if self.progress else None
        return d


def latest_job_id(registry: Registry, run_id: str) -> str | None:
    """The job id of a run's newest successful submission."""
    for sub in reversed(registry.chain(run_id)):
        if sub.ok:
            return sub.job_id
    return None


# --- parsing helpers ------------------------------------------------------------------------------------------


def expand_array_ranges(results: Mapping[str, JobStatus]) -> dict[str, JobStatus]:
    """``15_[0-3]`` (a pending array range as squeue/scontrol print it) becomes 15_0 ... 15_3."""
    out: dict[str, JobStatus] = {}
    for key, status in results.items():
        m = _ARRAY_RANGE.match(key)
        if not m:
            out[key] = status
            continue
        spec = m.group("spec").split("%", 1)[0]
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            for i in range(int(lo), int(hi or lo) + 1):
                task = f"{m.group('master')}_{i}{m.group('rest')}"
                out.setdefault(task, JobStatus(task, status.state, status.reason_text, status.exit_code,
                                               status.restart_count, status.raw_state, status.signal))
    return out


def combine(job_ids: Iterable[str], accounting: Mapping[str, JobStatus] | None,
            live: Mapping[str, JobStatus] | None, *, completion_file: bool = False) -> dict[str, JobStatus]:
    """One status per job: the live view while the job is active, else its accounting record.

    Accounting (``sacct``/``sacct -c``) has exit codes but may lag or (the completion file) only know
    finished jobs; the live view (``squeue``/``scontrol``) forgets jobs after MinJobAge. A job found in
    neither is MISSING, but only when the live view answered (otherwise we cannot know).
    ``completion_file``: the accounting answer came from ``sacct -c``, where every record of a job is a run
    that ended — so a job that is active again has been requeued at least once per record (``squeue`` does
    not show restarts).
    """
    out: dict[str, JobStatus] = {}
    acc, liv = accounting or {}, live or {}
    for job_id in job_ids:
        a, lv = acc.get(job_id), liv.get(job_id)
        if lv is not None and lv.state.is_active and a is not None and completion_file:
            out[job_id] = replace(lv, restart_count=max(lv.restart_count, a.restart_count + 1))
        elif lv is not None and (lv.state.is_active or a is None):
            out[job_id] = lv
        elif a is not None:
            out[job_id] = a
        elif live is not None:
            out[job_id] = JobStatus(job_id, JobState.MISSING, "the scheduler no longer knows this job")
    return out


# --- the one batched call -------------------------------------------------------------------------------------

# Fallback chains: each chain runs its commands until one succeeds; the chains' answers are combined.
# (role, argv indices of scheduler.status_argv)
_CHAINS: dict[str, list[tuple[str, list[int]]]] = {
    "slurm": [("accounting", [0, 1]), ("live", [2, 3])],
    "pbs": [("live", [0])],
    "cobalt": [("live", [0])],
}


EXIT_RECORD_LINES = 64  # the end of a run's EXIT_LOG read per poll: 2 lines per job of its chain


def batch_script(chains: Sequence[Sequence[tuple[str, list[str]]]], tails: Sequence[str],
                 records: Sequence[str] = ()) -> str:
    """One POSIX sh script: each chain's commands (``a || b``) with their stdout/stderr/exit status
    between markers, then ``tail -n 1`` of each file in ``tails`` and the last EXIT_RECORD_LINES lines of
    each file in ``records``."""
    lines = [
        't=$(mktemp 2>/dev/null || echo "/tmp/hpctrain-status.$$")',
        f"sec() {{ printf '\\n{_MARK} %s\\n' \"$*\"; }}",
        'run() { n=$1; shift; sec "$n" out; "$@" 2>"$t"; rc=$?; sec "$n" err; cat "$t"; sec "$n" rc $rc; '
        "return $rc; }",
    ]
    for chain in chains:
        lines.append(" || ".join(f"run {name} {shlex.join(argv)}" for name, argv in chain) + " || true")
    for i, path in enumerate(tails):
        lines.append(f"sec tail{i} out; tail -n 1 -- {shlex.quote(path)} 2>/dev/null")
    for i, path in enumerate(records):
        lines.append(f"sec rec{i} out; tail -n {EXIT_RECORD_LINES} -- {shlex.quote(path)} 2>/dev/null")
    lines.append('rm -f "$t"; sec end')
    return "\n".join(lines) + "\n"


def split_sections(stdout: str) -> dict[str, dict[str, str]]:
    """``{section: {"out": ..., "err": ..., "rc": "0"}}`` from the marked output of ``batch_script``."""
    out: dict[str, dict[str, str]] = {}
    current: tuple[str, str] | None = None
    buf: list[str] = []

    def flush() -> None:
        if current is not None:
            out.setdefault(current[0], {})[current[1]] = "\n".join(buf).strip("\n")

    for line in stdout.split("\n"):
        if line.startswith(_MARK + " "):
            flush()
            words = line[len(_MARK) + 1:].split()
            buf = []
            if len(words) >= 3 and words[1] == "rc":
                out.setdefault(words[0], {})["rc"] = words[2]
                current = None
            elif len(words) >= 2:
                current = (words[0], words[1])
            else:
                out.setdefault(words[0] if words else "", {})
                current = None
            continue
        buf.append(line)
    flush()
    return out


@dataclass(frozen=True)
class GroupPoll:
    """The answer of one batched poll: job statuses (None when nothing answered), last metrics lines."""

    statuses: dict[str, JobStatus] | None
    metrics: dict[str, dict[str, Any] | None]
    error: str = ""
    sources: tuple[str, ...] = ()  # the commands that answered, e.g. ("sacct -c", "squeue")
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # record path -> its JSON lines


def poll_scheduler(transport: Transport, scheduler_name: str, job_ids: list[str],
                   metrics_paths: Sequence[str] = (), *, record_paths: Sequence[str] = (),
                   timeout: float = STATUS_TIMEOUT_S) -> GroupPoll:
    """Status of ``job_ids``, the last metrics record of each path and the exit records of each of
    ``record_paths`` (EXIT_LOG files) in ONE ``transport.run``."""
    from hpctrain.submission.schedulers.base import get_scheduler

    scheduler = get_scheduler(scheduler_name)
    argvs = scheduler.status_argv(job_ids) if job_ids else []
    plan = _CHAINS.get(scheduler_name, [("live", list(range(len(argvs))))]) if argvs else []
    chains = [[(f"{role}{i}", argvs[i]) for i in idx if i < len(argvs)] for role, idx in plan]
    script = batch_script(chains, list(metrics_paths), list(record_paths))
    try:
        done = transport.run(["sh", "-c", script], timeout=timeout, check=False)
    except TransportError as exc:
        return GroupPoll(None, dict.fromkeys(metrics_paths), f"status poll on {transport.host} failed: {exc}")
    sections = split_sections(done.stdout)
    if "end" not in sections:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return GroupPoll(None, dict.fromkeys(metrics_paths),
                         f"status poll on {transport.host} did not finish: {detail}")
    answers: dict[str, dict[str, JobStatus] | None] = {}
    errors: list[str] = []
    sources: list[str] = []
    for role, idx in plan:
        answers[role] = None
        for i in idx:
            sec = sections.get(f"{role}{i}")
            if sec is None or i >= len(argvs):
                continue
            rc, err = sec.get("rc", "1"), sec.get("err", "")
            if rc == "0" or is_unknown_job_error(err):
                parsed = scheduler.parse_status(i, sec.get("out", "")) if rc == "0" else {}
                answers[role] = expand_array_ranges(parsed)
                sources.append(" ".join(argvs[i][:2]) if argvs[i][1] == "-c" else argvs[i][0])
                break
            errors.append(f"{argvs[i][0]}: {(err.strip().splitlines() or ['exit ' + rc])[-1]}")
    statuses: dict[str, JobStatus] | None
    if answers.get("live") is None and answers.get("accounting") is None:
        statuses = None
    else:
        statuses = combine(job_ids, answers.get("accounting"), answers.get("live"),
                           completion_file="sacct -c" in sources)
    metrics: dict[str, dict[str, Any] | None] = {}
    for i, path in enumerate(metrics_paths):
        metrics[path] = _last_json(sections.get(f"tail{i}", {}).get("out", ""))
    error = "" if statuses is not None else (f"no status command answered on {transport.host}: "
                                             + "; ".join(errors))
    records = {path: _json_lines(sections.get(f"rec{i}", {}).get("out", "")) for i, path in enumerate(record_paths)}
    return GroupPoll(statuses, metrics, error, tuple(sources), records)


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def read_last_record(path: Path) -> dict[str, Any] | None:
    """The newest complete record of a local metrics file (None when there is none yet): its last 64 KiB."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return _last_json(text)


def _last_json(text: str) -> dict[str, Any] | None:
    records = _json_lines(text)
    return records[-1] if records else None


_LOCAL_STATES = {s.name: s for s in JobState}


def poll_local(run_dirs: Mapping[str, str]) -> dict[str, JobStatus]:
    """``{job_id: status}`` of local-site runs from their supervisor records (no transport involved)."""
    from hpctrain.submission.schedulers import local_controller

    out = {}
    for job_id, run_dir in run_dirs.items():
        st = local_controller.status(run_dir)
        out[job_id] = JobStatus(job_id, _LOCAL_STATES.get(st.state, JobState.FAILED), st.reason, st.exit_code,
                                restart_count=st.restarts, raw_state=st.state)
    return out


def apply_exit_records(registry: Registry, statuses: Mapping[str, JobStatus] | None, runs: Mapping[str, Run],
                       records: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, JobStatus]:
    """Statuses completed from the batch scripts' own records (``EXIT_LOG`` of each run directory).

    Records are read for every job that is not active: one the scheduler no longer lists (MISSING: Cobalt's
    qstat forgets finished jobs, so does PBS without job history), one no status command could answer for
    (``statuses`` None), and one that ended by the scheduler's account (PBS with history still lists a job
    that resubmitted itself). ``resubmit`` (PBS/Cobalt after a checkpoint) adds the new job to the run's
    chain and the new job's records are read in turn (a whole resubmitted job may have run between two
    polls); ``exit`` with status 0 → COMPLETED, another status → FAILED with that exit code. A state the
    scheduler gave is kept; the records only fill in what it did not say. A new job with no record yet is
    PENDING until the next poll asks the scheduler about it.
    """
    out = dict(statuses or {})
    for job, run in runs.items():
        known = out.get(job)
        if known is not None and known.state.is_active:
            continue
        told = known is not None and known.state is not JobState.MISSING  # the scheduler's word stands
        current, seen = job, set()
        while current not in seen:
            seen.add(current)
            mine = [r for r in records.get(job, ()) if r.get("job") == current]
            last = mine[-1] if mine else None
            if last is None:
                if current != job:
                    out.setdefault(current, JobStatus(current, JobState.PENDING,
                                                      "resubmitted after a checkpoint; not polled yet"))
                break
            new_job, code = last.get("new_job"), last.get("status")
            if last.get("event") == "resubmit" and isinstance(new_job, str) and new_job:
                if not any(s.ok and s.job_id == new_job for s in registry.chain(run.run_id)):
                    registry.add_submission(run.run_id, new_job, "resubmit", ok=True)
                if not (told and current == job):
                    out[current] = JobStatus(current, JobState.COMPLETED,
                                             f"stopped at a checkpoint; resubmitted as job {new_job}", exit_code=0)
                current = new_job
            elif last.get("event") == "exit" and isinstance(code, int) and not isinstance(code, bool):
                if not (told and current == job):
                    out[current] = JobStatus(current, JobState.COMPLETED if code == 0 else JobState.FAILED,
                                             "" if code == 0 else "the job script recorded a non-zero exit",
                                             exit_code=code)
                break
            else:
                break
    return out


def record_requeues(registry: Registry, statuses: Mapping[str, JobStatus], runs: Mapping[str, Run]) -> int:
    """Add one ``requeue`` submission to a run's chain per restart of its job not yet recorded.

    A requeued Slurm job (and a local job the controller re-ran) keeps its job id; the scheduler counts its
    restarts (``RestartCnt``, or ``sacct -c`` records). Counts only ever add rows: a source that cannot see
    restarts (``squeue``) never removes one. Returns how many rows were added.
    """
    added = 0
    for job_id, status in statuses.items():
        run = runs.get(job_id)
        if run is None or status.restart_count <= 0:
            continue
        known = sum(1 for s in registry.chain(run.run_id) if s.ok and s.job_id == job_id and s.kind == "requeue")
        for _ in range(status.restart_count - known):
            registry.add_submission(run.run_id, job_id, "requeue", ok=True)
            added += 1
    return added


# --- polling runs from the registry ---------------------------------------------------------------------------


def poll_runs(registry: Registry, runs: Sequence[Run], pool: TransportPool | None = None, *,
              progress: bool = True, ssh_config: str | None = None) -> list[RunView]:
    """Poll the active ones of ``runs`` (one call per (site, remote, ssh config)), store, and return views."""
    pool = pool or TransportPool()
    runs = [registry.get_run(r.run_id) for r in runs]  # callers may hold stale copies
    groups: dict[tuple[str, str | None, str | None, str], list[tuple[Run, RunMeta, str | None]]] = {}
    for run in runs:
        meta = read_meta(registry, run)
        cfg = ssh_config or meta.ssh_config
        groups.setdefault((run.site, run.remote, cfg, meta.scheduler), []).append(
            (run, meta, latest_job_id(registry, run.run_id)))
    errors: dict[str, str] = {}
    records: dict[str, dict[str, Any] | None] = {}
    for (site, remote, cfg, sched), members in groups.items():
        active = {job: run for run, _, job in members if job and run.is_active}
        paths = [f"{run.run_dir}/{METRICS_FILE}" for run, _, _ in members] if progress else []
        if sched == "local":
            if active:
                local = poll_local({j: r.run_dir for j, r in active.items()})
                record_requeues(registry, local, active)
                registry.update_states(local, site=site)
            for path in paths:
                records[path] = read_last_record(Path(path))
            continue
        if not active and not paths:
            continue
        want_paths = paths if progress else []
        exit_logs = {job: f"{run.run_dir}/{EXIT_LOG}" for job, run in active.items()}
        result = poll_scheduler(pool.get(remote, cfg), sched, list(active), want_paths,
                                record_paths=list(exit_logs.values()))
        records.update(result.metrics)
        statuses = apply_exit_records(registry, result.statuses, active,
                                      {job: result.records.get(path, []) for job, path in exit_logs.items()})
        if statuses:
            record_requeues(registry, statuses, active)
            registry.update_states(statuses, site=site)
        if result.statuses is None:
            for job, run in active.items():
                if job not in statuses:
                    errors[run.run_id] = result.error
    views = []
    for run in runs:
        fresh = registry.get_run(run.run_id)
        meta = read_meta(registry, fresh)
        rec = records.get(f"{fresh.run_dir}/{METRICS_FILE}")
        views.append(view_of(registry, fresh, progress_from_record(rec, meta.total_steps),
                             errors.get(run.run_id, "")))
    return views


def view_of(registry: Registry, run: Run, progress: Progress | None = None, poll_error: str = "") -> RunView:
    """A RunView from the registry alone (no polling)."""
    reason = run.state_reason
    if run.state == CREATED:
        reason = reason or "registered, not submitted"
    if run.state == SUBMIT_FAILED:
        reason = reason or "submission failed"
    if run.state in _ENDED_BADLY:
        reason = why_it_ended(registry, run)
    return RunView(run.run_id, run.name, run.site, run.remote, latest_job_id(registry, run.run_id), run.state,
                   reason, run.run_dir, progress, poll_error)


_ENDED_BADLY = frozenset(s.value for s in (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED,
                                           JobState.PREEMPTED, JobState.MISSING))


def why_it_ended(registry: Registry, run: Run) -> str:
    """The scheduler's reason plus the exit code / signal of the run's newest job, e.g.
    ``the job exited with a non-zero exit code; exit code 137 (killed by signal 9)``."""
    parts = [run.state_reason] if run.state_reason else []
    newest = next((s for s in reversed(registry.chain(run.run_id)) if s.ok), None)
    code = newest.exit_code if newest is not None else None
    if code is not None and not any("exit code " in p for p in parts):
        text = f"exit code {code}"
        if code > 128 and code - 128 < 65:
            text += f" (killed by signal {code - 128})"
        elif code == EXIT_REQUEUE:
            text += " (stopped at a checkpoint; continue with `hpctrain resume`)"
        parts.append(text)
    return "; ".join(parts)


def is_terminal(state: str) -> bool:
    """True for states that will not change by themselves (including a failed submission)."""
    if state in (SUBMIT_FAILED,):
        return True
    try:
        return JobState(state).is_terminal
    except ValueError:
        return False
