"""Batched state tracking: ONE transport call per poll for all active runs of a (site, login node) pair.

The call is one small ``sh`` script that runs the back-end's status probes along its fallback chains (Slurm:
``sacct`` else ``sacct -c``, then ``squeue`` else ``scontrol``; local: the local controller), and reads the
end of every run's ``metrics.jsonl``, its exit records, its failure note and the nodes it blamed, so a poll over
ssh costs one round trip. Nothing here knows a scheduler by name: the back-end declares its probes and their parsers.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpctrain.errors import HpctrainError, TransportError
from hpctrain.exit_codes import EXIT_REQUEUE, EXIT_SCHEDULER, EXIT_TRANSPORT
from hpctrain.nodes.blame import BLAME_FILE, Blame, parse_blames
from hpctrain.submission.failure import FAILURE_FILE, read_failure
from hpctrain.submission.marked_sections import split_marked_sections
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import Run
from hpctrain.submission.run_record import RunMeta, kept_progress, read_meta, save_progress
from hpctrain.submission.schedulers.base import EXIT_LOG, Scheduler, StatusProbe, get_scheduler
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus, PastRun, is_unknown_job_error
from hpctrain.submission.transport import Transport, TransportPool, run_script
from hpctrain.submission.views import BY_SCHEDULER, RunView, latest_job_id, progress_from_record, view_of
from hpctrain.text import json_lines

METRICS_FILE = "metrics.jsonl"
STATUS_TIMEOUT_S = 60.0
EXIT_RECORD_LINES = 64  # the end of a run's EXIT_LOG read per poll: 2 lines per job of its chain
FAILURE_BYTES = 2048  # a failure note is one line; read no more of it
# The most read of a run's blamed-nodes.jsonl per poll: a line per blamed node (under 3.5 kB each), so this holds
# the blames of every node of a big job; a line cut at the end is skipped.
BLAME_BYTES = 256 * 1024
# The most read of the end of a metrics file or an exit log per poll: a last line longer than that is no record
# (it is skipped), and a run directory's files never make a poll's answer big.
TAIL_BYTES = 64 * 1024
POLL_MARK = "@@hpctrain-section"
_ARRAY_RANGE = re.compile(r"^(?P<master>[^_\[\]]+)_\[(?P<spec>[^\]]+)\](?P<rest>.*)$")


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
                out.setdefault(task, replace(status, job_id=task))
    return out


def combine(job_ids: Iterable[str], accounting: Mapping[str, JobStatus] | None,
            live: Mapping[str, JobStatus] | None, *, ended_runs: bool = False) -> dict[str, JobStatus]:
    """One status per job: the live view while the job is active, else its accounting record.

    Accounting (``sacct``/``sacct -c``) has exit codes but may lag or (the completion file) only know
    finished jobs; the live view (``squeue``/``scontrol``) forgets jobs after MinJobAge. A job found in
    neither is MISSING, but only when the live view answered (otherwise we cannot know).
    ``ended_runs``: every accounting record of a job is a run that ended (``sacct -c``) — so a job that is
    active again has been requeued at least once per record (``squeue`` does not show restarts); a job whose
    run is winding down (``run_ended``, Slurm's COMPLETING) is not active again, and its record may be there.
    Otherwise (``sacct -D``, slurmdbd) the records are every run, the current one last once slurmdbd has it:
    the restarts it counted are kept while the live view is shown, plus the requeued run itself when that is
    still the last record (the job pending again before slurmdbd records its next run).
    """
    out: dict[str, JobStatus] = {}
    acc, liv = accounting or {}, live or {}
    for job_id in job_ids:
        a, lv = acc.get(job_id), liv.get(job_id)
        if lv is not None and lv.state.is_active and a is not None:
            if ended_runs:
                # A run that is winding down may already be one of the records: it is not a new run.
                last_ended = not lv.run_ended
            else:
                # The last record a run that ended (requeued, or failed with its node) while the job is active again
                last_ended = (a.state is JobState.REQUEUED or not a.state.is_active) and not lv.run_ended
            runs_before = a.restart_count + (1 if last_ended else 0)
            earlier = (*a.earlier_runs, *((PastRun(a.raw_state, a.nodes),) if last_ended else ()))
            out[job_id] = replace(lv, restart_count=max(lv.restart_count, runs_before), earlier_runs=earlier)
        elif lv is not None and (lv.state.is_active or a is None):
            out[job_id] = lv
        elif a is not None:
            out[job_id] = a
        elif live is not None:
            out[job_id] = JobStatus(job_id, JobState.MISSING, "the scheduler no longer knows this job")
    return out


# --- the one batched call -------------------------------------------------------------------------------------


def batch_script(chains: Sequence[Sequence[tuple[str, list[str]]]], tails: Sequence[str],
                 records: Sequence[str] = (), notes: Sequence[str] = (), blames: Sequence[str] = ()) -> str:
    """One POSIX sh script: each chain's commands (``a || b``) with their stdout/stderr/exit status
    between markers, then the last line of each file in ``tails``, the last EXIT_RECORD_LINES lines of each
    file in ``records`` (of their last TAIL_BYTES), the first FAILURE_BYTES of each file in ``notes`` and the
    first BLAME_BYTES of each file in ``blames``. Only regular files are read: a FIFO would block the poll, a
    device (a link to /dev/zero) would never end."""
    lines = [
        't=$(mktemp 2>/dev/null || echo "/tmp/hpctrain-status.$$")',
        f"sec() {{ printf '\\n{POLL_MARK} %s\\n' \"$*\"; }}",
        'run() { n=$1; shift; sec "$n" out; "$@" 2>"$t"; rc=$?; sec "$n" err; cat "$t"; sec "$n" rc $rc; '
        "return $rc; }",
    ]
    for chain in chains:
        lines.append(" || ".join(f"run {name} {shlex.join(argv)}" for name, argv in chain) + " || true")
    for i, path in enumerate(tails):
        q = shlex.quote(path)
        lines.append(f"sec tail{i} out; [ -f {q} ] && tail -c {TAIL_BYTES} -- {q} 2>/dev/null | tail -n 1")
    for i, path in enumerate(records):
        q = shlex.quote(path)
        lines.append(f"sec rec{i} out; [ -f {q} ] && tail -c {TAIL_BYTES} -- {q} 2>/dev/null | "
                     f"tail -n {EXIT_RECORD_LINES}")
    for i, path in enumerate(notes):
        q = shlex.quote(path)
        lines.append(f"sec note{i} out; [ -f {q} ] && head -c {FAILURE_BYTES} -- {q} 2>/dev/null")
    for i, path in enumerate(blames):
        q = shlex.quote(path)
        lines.append(f"sec blame{i} out; [ -f {q} ] && head -c {BLAME_BYTES} -- {q} 2>/dev/null")
    lines.append('rm -f "$t"; sec end')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GroupPoll:
    """The answer of one batched poll: job statuses (None when nothing answered), last metrics lines, the
    exit records, failure notes and blamed nodes of the run directories asked for; ``error_code`` fits
    ``error``."""

    statuses: dict[str, JobStatus] | None
    metrics: dict[str, dict[str, Any] | None]
    error: str = ""
    sources: tuple[str, ...] = ()  # the probes that answered, e.g. ("sacct -c", "squeue")
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # record path -> its JSON lines
    notes: dict[str, str] = field(default_factory=dict)  # failure-note path -> its line ('' when none)
    error_code: int = 0
    blames: dict[str, list[Blame]] = field(default_factory=dict)  # blamed-nodes.jsonl path -> its blames


def poll_scheduler(transport: Transport, scheduler: Scheduler, jobs: Mapping[str, str],
                   metrics_paths: Sequence[str] = (), *, record_paths: Sequence[str] = (),
                   note_paths: Sequence[str] = (), blame_paths: Sequence[str] = (),
                   timeout: float = STATUS_TIMEOUT_S) -> GroupPoll:
    """Status of ``jobs`` (job id -> run directory), the last metrics record of each path, the exit records
    (EXIT_LOG files), failure notes and blamed-node files asked for, in ONE ``transport.run``."""
    chains: list[list[StatusProbe]] = scheduler.status_probes(jobs) if jobs else []
    names = [[(f"p{c}_{i}", probe.argv) for i, probe in enumerate(chain)] for c, chain in enumerate(chains)]
    script = batch_script(names, list(metrics_paths), list(record_paths), list(note_paths), list(blame_paths))
    try:
        done = run_script(transport, script, timeout=timeout)
    except TransportError as exc:
        return GroupPoll(None, dict.fromkeys(metrics_paths), f"status poll on {transport.host} failed: {exc}",
                         error_code=exc.exit_code)
    sections = split_marked_sections(done.stdout, POLL_MARK)
    if "end" not in sections:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return GroupPoll(None, dict.fromkeys(metrics_paths),
                         f"status poll on {transport.host} did not finish: {detail}", error_code=EXIT_TRANSPORT)
    answers: dict[str, dict[str, JobStatus]] = {}
    ended_runs = False
    errors: list[str] = []
    sources: list[str] = []
    for c, chain in enumerate(chains):
        for i, probe in enumerate(chain):
            sec = sections.get(f"p{c}_{i}")
            if sec is None:
                continue
            rc, err = sec.get("rc", "1"), sec.get("err", "")
            if rc == "0" or is_unknown_job_error(err):
                try:
                    parsed = probe.parse(sec.get("out", "")) if rc == "0" else {}
                except ValueError as exc:
                    errors.append(f"{probe.name}: unreadable answer ({exc})")
                    continue
                answers[probe.role] = {**answers.get(probe.role, {}), **expand_array_ranges(parsed)}
                ended_runs = ended_runs or (probe.ended_runs and probe.role == "accounting")
                sources.append(probe.name)
                break
            errors.append(f"{probe.name}: {(err.strip().splitlines() or ['exit ' + rc])[-1]}")
    statuses: dict[str, JobStatus] | None = None
    if answers:
        statuses = combine(jobs, answers.get("accounting"), answers.get("live"), ended_runs=ended_runs)
    metrics = {path: last_json_record(sections.get(f"tail{i}", {}).get("out", ""))
               for i, path in enumerate(metrics_paths)}
    error = "" if statuses is not None or not jobs else (f"no status command answered on {transport.host}: "
                                                         + "; ".join(errors))
    records = {path: json_lines(sections.get(f"rec{i}", {}).get("out", "")) for i, path in enumerate(record_paths)}
    notes = {path: read_failure(sections.get(f"note{i}", {}).get("out", "")) for i, path in enumerate(note_paths)}
    blames = {path: parse_blames(sections.get(f"blame{i}", {}).get("out", "")) for i, path in enumerate(blame_paths)}
    return GroupPoll(statuses, metrics, error, tuple(sources), records, notes, EXIT_SCHEDULER if error else 0,
                     blames)


def last_json_record(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object (other lines, a cut or half-written one, are skipped)."""
    records = json_lines(text)
    return records[-1] if records else None


# --- what the run directories add -----------------------------------------------------------------------------


# sacct prints an exit status N >= 128 as N - 128 (its ExitCode "9:0" of a job script that exited 137).
ACCOUNTING_FOLD = 128


def apply_exit_records(registry: RunRegistry, statuses: Mapping[str, JobStatus] | None, runs: Mapping[str, Run],
                       records: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, JobStatus]:
    """Statuses completed from the batch scripts' own records (``EXIT_LOG`` of each run directory).

    Records are read for every job that is not active: one the scheduler no longer lists (MISSING: Cobalt's
    qstat forgets finished jobs, so does PBS without job history), one no status command could answer for
    (``statuses`` None), and one that ended by the scheduler's account (PBS with history still lists a job
    that resubmitted itself). ``resubmit`` (PBS/Cobalt after a checkpoint) adds the new job to the run's
    chain and the new job's records are read in turn (a whole resubmitted job may have run between two
    polls); ``exit`` with status 0 → COMPLETED, another status → FAILED with that exit code. A state the
    scheduler gave is kept; the records only fill in what it did not say (the exit code of a job that only
    ``squeue`` reports ended, before accounting has it) or said folded (sacct's 9 for the script's 137). A new
    job with no record yet is PENDING until the next poll asks the scheduler about it.
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
                state = JobState.COMPLETED if code == 0 else JobState.FAILED
                if not (told and current == job):
                    out[current] = JobStatus(current, state,
                                             "" if code == 0 else "the job script recorded a non-zero exit",
                                             exit_code=code)
                elif known is not None and known.state is state and known.exit_code in (None, code - ACCOUNTING_FOLD):
                    # The script's own status where the scheduler's says less (the state it gave stands): squeue
                    # has no exit code for an ended job accounting has not recorded yet, and sacct prints a
                    # status of 128 + S (a rank killed by signal S) as S ("9:0" for the log's 137)
                    out[current] = replace(known, exit_code=code)
                break
            else:
                break
    return out


def apply_failure_notes(statuses: Mapping[str, JobStatus], notes: Mapping[str, str]) -> dict[str, JobStatus]:
    """A FAILED job's reason becomes its run's failure note (``notes``: job id -> the note, '' for none):
    the first error a rank wrote says more than "the job exited with a non-zero exit code"."""
    out = dict(statuses)
    for job, note in notes.items():
        status = out.get(job)
        if note and status is not None and status.state is JobState.FAILED:
            out[job] = replace(status, reason_text=note)
    return out


def _known_requeues(registry: RunRegistry, run: Run, job_id: str) -> int:
    return sum(1 for s in registry.chain(run.run_id) if s.ok and s.job_id == job_id and s.kind == "requeue")


def lost_node_jobs(registry: RunRegistry, scheduler: Scheduler, statuses: Mapping[str, JobStatus],
                   runs: Mapping[str, Run]) -> list[str]:
    """The jobs whose run ended because a node failed, and whose chain does not say so yet: the job itself
    (its state), or a restart not yet recorded (an earlier run's state)."""
    lost = scheduler.node_failure_states
    found = []
    for job_id, status in statuses.items():
        run = runs.get(job_id)
        if run is None or not lost:
            continue
        new_runs = status.earlier_runs[_known_requeues(registry, run, job_id):]
        if status.raw_state in lost or any(r.state in lost for r in new_runs):
            found.append(job_id)
    return found


def explain_lost_nodes(transport: Transport, scheduler: Scheduler, run_dirs: Mapping[str, str]) -> dict[str, str]:
    """For each job (-> its run directory): which node it lost, in words, from the job's own output (one
    command per job: a node failure is rare). A job whose output names none gets the general words."""
    out = {}
    for job_id, run_dir in run_dirs.items():
        argv = scheduler.lost_nodes_argv(run_dir, job_id)
        nodes: list[str] = []
        if argv is not None:
            try:
                done = transport.run(argv, timeout=60, check=False)
                nodes = scheduler.parse_lost_nodes(done.stdout)
            except HpctrainError:
                nodes = []
        which = ", ".join(nodes) if nodes else "a node of the job"
        out[job_id] = f"a node failure ({which} stopped answering the scheduler)"
    return out


def apply_lost_nodes(statuses: Mapping[str, JobStatus], lost: Mapping[str, str],
                     scheduler: Scheduler) -> dict[str, JobStatus]:
    """A job that ended with its node says so first in its reason (before the ranks' own note of it)."""
    out = dict(statuses)
    for job, words in lost.items():
        status = out.get(job)
        if status is not None and status.raw_state in scheduler.node_failure_states:
            out[job] = replace(status, reason_text=words + (f"; {status.reason_text}" if status.reason_text else ""))
    return out


REQUEUED_AT_CHECKPOINT = f"stopped at a checkpoint (exit {EXIT_REQUEUE}); requeued"


def record_requeues(registry: RunRegistry, statuses: Mapping[str, JobStatus], runs: Mapping[str, Run],
                    lost: Mapping[str, str] | None = None, scheduler: Scheduler | None = None) -> int:
    """Add one ``requeue`` entry to a run's chain per restart of its job not yet recorded, and close the
    entry it continues: state ``requeued``, and why — the ranks stopped at a checkpoint (exit code 75), or the
    run lost a node and the scheduler ran the job again (``lost``: job id -> the words for it; the earlier run's
    state tells which, where accounting lists it).

    A requeued Slurm job (and a local job the controller re-ran) keeps its job id; the scheduler counts its
    restarts (``RestartCnt``, or ``sacct -c`` records). Counts only ever add entries: a source that cannot
    see restarts (``squeue``) never removes one. Returns how many entries were added.
    """
    added = 0
    failed_node = scheduler.node_failure_states if scheduler is not None else frozenset()
    for job_id, status in statuses.items():
        run = runs.get(job_id)
        if run is None or status.restart_count <= 0:
            continue
        known = _known_requeues(registry, run, job_id)
        for index in range(known, status.restart_count):
            previous = next(s for s in reversed(registry.chain(run.run_id)) if s.ok)
            ended = status.earlier_runs[index] if index < len(status.earlier_runs) else None
            if ended is not None and ended.state in failed_node:
                words = (lost or {}).get(job_id, "a node failure")
                registry.end_submission(run.run_id, previous.seq, JobState.REQUEUED.value,
                                        words + BY_SCHEDULER, None)
            else:
                registry.end_submission(run.run_id, previous.seq, JobState.REQUEUED.value, REQUEUED_AT_CHECKPOINT,
                                        EXIT_REQUEUE)
            registry.add_submission(run.run_id, job_id, "requeue", ok=True)
            added += 1
    return added


# --- polling runs from the registry ---------------------------------------------------------------------------


@dataclass
class _Group:
    """The runs of one (site, login node, ssh config, scheduler) that one transport call polls."""

    scheduler: Scheduler
    remote: str | None
    ssh_config: str | None
    members: list[tuple[Run, RunMeta, str | None]] = field(default_factory=list)


def poll_runs(registry: RunRegistry, runs: Sequence[Run], pool: TransportPool | None = None, *,
              progress: bool = True, ssh_config: str | None = None) -> list[RunView]:
    """Poll the active ones of ``runs`` (one call per (site, remote, ssh config)), store, and return views.

    The newest metrics record of each run is fetched too (and kept with the run, see ``run_record``) unless
    ``progress`` is False or the run's last record, read after its job ended, is kept already.
    """
    pool = pool or TransportPool()
    runs = [registry.get_run(r.run_id) for r in runs]  # callers may hold stale copies
    polled = _poll_once(registry, runs, pool, progress=progress, ssh_config=ssh_config)
    fresh = {run.run_id: registry.get_run(run.run_id) for run in runs}
    if progress:
        # Another process (``logs --follow``, a second ``status``) may have stored a run's end after this poll's
        # answer was read: the metrics read with it are from before the end. Read them again, the end now stored.
        late = [fresh[r.run_id] for r in runs
                if r.is_active and not fresh[r.run_id].is_active and r.run_id not in polled.seen_ended
                and not _last_progress_kept(registry, fresh[r.run_id])]
        if late:
            again = _poll_once(registry, late, pool, progress=True, ssh_config=ssh_config)
            polled.progress.update(again.progress)
    views = []
    for run in runs:
        error, code = polled.errors.get(run.run_id, ("", 0))
        record = polled.progress.get(run.run_id)
        views.append(view_of(registry, fresh[run.run_id],
                             progress_from_record(record, polled.totals.get(run.run_id)) if record else None,
                             error, code))
    return views


@dataclass
class _Polled:
    """What one round of polling found: per run id, why it could not be polled (text, exit code), the newest
    metrics record kept, and its step count; the runs whose end this round's answer showed (their metrics, or
    their having none, were read after it)."""

    errors: dict[str, tuple[str, int]] = field(default_factory=dict)
    seen_ended: set[str] = field(default_factory=set)
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    totals: dict[str, int | None] = field(default_factory=dict)


def _poll_once(registry: RunRegistry, runs: Sequence[Run], pool: TransportPool, *, progress: bool,
               ssh_config: str | None) -> _Polled:
    """One batched call per group of ``runs``: the states stored, the metrics records kept."""
    groups: dict[tuple[str, str | None, str | None, str], _Group] = {}
    out = _Polled()
    for run in runs:
        try:
            meta = read_meta(registry, run)
            scheduler = get_scheduler(meta.scheduler)
        except HpctrainError as exc:
            out.errors[run.run_id] = (str(exc), exc.exit_code)
            continue
        out.totals[run.run_id] = meta.total_steps
        cfg = ssh_config or meta.ssh_config
        key = (run.site, run.remote, cfg, meta.scheduler)
        group = groups.setdefault(key, _Group(scheduler, run.remote, cfg))
        group.members.append((run, meta, latest_job_id(registry, run.run_id)))
    for (site, *_), group in groups.items():
        active = {job: run for run, _, job in group.members if job and run.is_active}
        paths = {run.run_id: f"{run.run_dir}/{METRICS_FILE}" for run, _, job in group.members
                 if progress and (job in active or not _last_progress_kept(registry, run))}
        if not active and not paths:
            continue
        exit_logs = {job: f"{run.run_dir}/{EXIT_LOG}" for job, run in active.items()}
        notes = {job: f"{run.run_dir}/{FAILURE_FILE}" for job, run in active.items()}
        blamed = {job: f"{run.run_dir}/{BLAME_FILE}" for job, run in active.items()}
        result = poll_scheduler(pool.get(group.remote, group.ssh_config), group.scheduler,
                                {job: run.run_dir for job, run in active.items()}, list(paths.values()),
                                record_paths=list(exit_logs.values()), note_paths=list(notes.values()),
                                blame_paths=list(blamed.values()))
        for job, path in blamed.items():
            registry.record_blames(active[job].run_id, result.blames.get(path, []))
        statuses = apply_exit_records(registry, result.statuses, active,
                                      {job: result.records.get(path, []) for job, path in exit_logs.items()})
        statuses = apply_failure_notes(statuses, {job: result.notes.get(path, "") for job, path in notes.items()})
        if statuses:
            transport = pool.get(group.remote, group.ssh_config)
            lost = explain_lost_nodes(transport, group.scheduler, {
                job: active[job].run_dir for job in lost_node_jobs(registry, group.scheduler, statuses, active)})
            statuses = apply_lost_nodes(statuses, lost, group.scheduler)
            record_requeues(registry, statuses, active, lost, group.scheduler)
            registry.update_states(statuses, site=site)
        if result.statuses is None:
            for job, run in active.items():
                if job not in statuses:
                    out.errors[run.run_id] = (result.error, result.error_code)
        for run, _, job in group.members:
            # The script reads the metrics after the status commands: a job seen ended (here, or by a poll before
            # this one) wrote no record after this one.
            ended = job is not None and (not run.is_active or (job in statuses and statuses[job].state.is_terminal))
            if ended and run.run_id in paths and result.statuses is not None:
                out.seen_ended.add(run.run_id)
            record = result.metrics.get(paths.get(run.run_id, ""))
            if record:
                out.progress[run.run_id] = save_progress(registry, run.run_id, record,
                                                         after_end_of=job if ended else None)
    return out


def _last_progress_kept(registry: RunRegistry, run: Run) -> bool:
    """Whether the metrics record kept for ``run`` need not be read again: one read after its newest job ended
    (a run that never got a job: any record)."""
    kept = kept_progress(registry, run.run_id)
    return kept is not None and kept.after_end_of == latest_job_id(registry, run.run_id)
