"""Submit a job to a site — on this login node, over ssh from a laptop, or on this machine (``local``).

``submit_runs`` checks and registers (keeping the job off the nodes remembered as bad on the site);
``stage_and_submit`` is the one path from a checked spec to a job, used
by submit and resume alike: render, stage atomically beside the registry, copy into the run directory,
submit, record (every failure after registration is recorded as a failed attempt). ``submit`` is the Python
API and returns ``RunHandle`` objects with ``status()``, ``wait()``, ``logs()`` and ``cancel()``.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.errors import ConfigError, HpctrainError, SchedulerError
from hpctrain.submission.blamed_nodes import remembered_words
from hpctrain.submission.queue_limits import check_array_size, check_queued_jobs, check_usable_nodes
from hpctrain.submission.registry import RunRegistry, new_run_id
from hpctrain.submission.registry_rows import Run
from hpctrain.submission.run_record import (
    META_FILE,
    SITE_FILE,
    RunMeta,
    dump_site,
    read_meta,
    record_dir,
    write_record_file,
)
from hpctrain.submission.schedulers.base import DEPENDENCY_KINDS, Scheduler, get_scheduler, place
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import is_home_relative
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import CommandFailed, Completed, Transport, TransportPool
from hpctrain.submission.views import RunView, is_terminal, latest_job_id

if TYPE_CHECKING:
    from hpctrain.config.fit import Placement
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import SiteProfile

SUBMIT_TIMEOUT_S = 120.0


# A file copied into a run directory besides its spec and script: (local path, file name there).
StagedFile = tuple[str | os.PathLike[str], str]


# --- small helpers --------------------------------------------------------------------------------------------


def staged_name(name: str) -> str:
    """A file name a run directory may receive: one plain name, never a path out of the directory."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"{name!r} is not a plain file name for a run directory")
    return name


def parse_array(text: str) -> tuple[str, list[str]]:
    """``train.lr=1e-3,3e-3`` -> ("train.lr", ["1e-3", "3e-3"])."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",")] if sep else []
    if not key.strip() or not items or any(not v for v in items):
        raise ConfigError(f"--array {text!r}: expected KEY=V1,V2,..., e.g. train.lr=1e-3,3e-3,1e-2")
    return key.strip(), items


def parse_after(text: str) -> tuple[str, str]:
    """``RUN[:afterok|afterany|...]`` -> (run, kind)."""
    run, sep, kind = text.rpartition(":")
    if not sep or kind not in DEPENDENCY_KINDS:
        return text, "afterok"
    return run, kind


def _variant(job: JobSpec, assignment: str) -> JobSpec:
    """``job`` with one ``KEY=VALUE`` override applied and validated again."""
    from hpctrain.config.job import JobSpec, apply_assignment, parse_assignment

    parts, value = parse_assignment(assignment)
    data = job.model_dump(mode="json")
    apply_assignment(data, parts, value)
    try:
        return JobSpec.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"--array {assignment}: the spec is invalid with this value: {exc}") from None


def _expand_home(transport: Transport, path: str) -> str:
    """A ``~``/``$HOME`` path made absolute with the login node's HOME (one extra command)."""
    if not is_home_relative(path):
        return path
    home = transport.run(["sh", "-c", 'printf %s "$HOME"'], timeout=30).stdout.strip()
    rest = path.split("/", 1)[1] if "/" in path else ""
    return f"{home.rstrip('/')}/{rest}".rstrip("/")


def default_run_root(site: SiteProfile, remote: str | None) -> str:
    """``site.remote_root``, else ``$HPCTRAIN_RUNS``, else ``./runs`` (absolute)."""
    if site.remote_root:
        return site.remote_root
    if remote is not None:
        raise ConfigError(f"site {site.name!r} has no remote_root: where should run directories go on {remote}?",
                          key="remote_root", hint="set remote_root in the site profile or pass --run-root")
    return os.environ.get("HPCTRAIN_RUNS") or str(Path("runs").resolve())


def dry_run_dir(registry: RunRegistry) -> Path:
    """Where ``--dry-run`` leaves what it rendered: ``dry-run/`` beside the registry, one folder per try."""
    return Path(registry.path).parent / "dry-run"


# --- the result ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """What a submission produced: the runs (one per array task), the script, and the scheduler's words."""

    runs: list[Run]
    job_ids: list[str | None]
    script_path: str
    dry_run: bool = False
    message: str = ""
    excluded: dict[str, str] = field(default_factory=dict)  # node -> why: remembered as bad on the site


# --- submission ----------------------------------------------------------------------------------------------


def submit_runs(
    job: JobSpec | str | os.PathLike[str],
    site: SiteProfile | str | None = None,
    *,
    remote: str | None = None,
    ssh_config: str | None = None,
    sets: Sequence[str] = (),
    nodes: int | None = None,
    walltime: str | None = None,
    queue: str | None = None,
    array: str | None = None,
    after: str | None = None,
    run_root: str | None = None,
    dry_run: bool = False,
    command: list[str] | None = None,
    registry: RunRegistry | None = None,
    pool: TransportPool | None = None,
    tasks: int | None = None,
    files: Sequence[Sequence[StagedFile]] = (),
) -> Submitted:
    """Check and register the runs, then ``stage_and_submit``; see the module docstring.

    ``tasks``: an array of this many tasks of the same spec (instead of ``array``'s variants), told apart by
    their ``files``; ``files[i]``: (local file, name) pairs copied into task i's run directory before the job
    is submitted (what a task reads besides its spec, e.g. a pickled callable).
    """
    job, site_profile, scheduler, overrides = _load(job, site, remote, sets, nodes, walltime, queue)
    assignments, is_array = _task_assignments(array, tasks, scheduler, site_profile)
    if files and len(files) != len(assignments):
        raise ValueError(f"files: {len(files)} lists for {len(assignments)} tasks")
    jobs, placement = _checked_variants(job, assignments, site_profile, remote)

    registry = registry or RunRegistry()
    pool = pool or TransportPool()
    excluded = remembered_words(registry.remembered_nodes(site_profile.name))
    dependency = _dependency(registry, after, site_profile, remote) if after is not None else None
    # The back-end refuses what it cannot do (arrays on Cobalt, dependencies locally) before we register.
    scheduler.submit_argv("job.sh", dependency=dependency, array="0-0" if is_array else None)
    transport = pool.get(remote, ssh_config)
    python = sys.executable if remote is None else None
    if command is None and (remote is not None or scheduler.runs_here):
        # The answer of the job's interpreter where the job runs (the login node, or this machine with no
        # scheduler; cached per machine), before anything is registered; --dry-run asks it too.
        from hpctrain.submission.interpreter import check_interpreter

        check_interpreter(transport, job, site_profile, python=python)
    root = run_root or default_run_root(site_profile, remote)
    root = _expand_home(transport, root).rstrip("/") or "/"
    base_id = new_run_id(job.name)

    if dry_run:
        return _dry_run(jobs, site_profile, scheduler, transport, registry, root, base_id, python, command,
                        is_array, excluded)
    check_queued_jobs(transport, site_profile, placement, len(jobs))
    excluded = check_usable_nodes(transport, site_profile, placement, job.resources.allocated_nodes, excluded)

    runs = _register(registry, jobs, site_profile, remote, root, base_id, overrides, assignments)
    job_ids = stage_and_submit(registry, transport, site_profile, runs, jobs, kind="submit",
                               submit_dir=f"{root}/{base_id}" if is_array else runs[0].run_dir,
                               array=is_array, python=python, command=command, dependency=dependency,
                               ssh_config=ssh_config, files=files, excluded_nodes=list(excluded))
    return Submitted([registry.get_run(r.run_id) for r in runs], list(job_ids),
                     str(record_dir(registry, runs[0].run_id) / "job.sh"), excluded=excluded)


def _load(job: JobSpec | str | os.PathLike[str], site: SiteProfile | str | None, remote: str | None,
          sets: Sequence[str], nodes: int | None, walltime: str | None, queue: str | None
          ) -> tuple[JobSpec, SiteProfile, Scheduler, list[str]]:
    """The job with its overrides applied, its site profile and back-end, and the overrides as KEY=VALUE."""
    from hpctrain.config.job import JobSpec, load_job
    from hpctrain.config.site import load_site

    extra = [*([f"resources.nodes={nodes}"] if nodes is not None else []),
             *([f"resources.walltime={walltime}"] if walltime is not None else []),
             *([f"resources.queue={queue}"] if queue is not None else [])]
    overrides = [*sets, *extra]
    if isinstance(job, JobSpec):
        for assignment in overrides:
            job = _variant(job, assignment)
    else:
        job = load_job(job, sets=list(sets), nodes=nodes, walltime=walltime, queue=queue)
    site_profile = site if not isinstance(site, str | type(None)) else load_site(site)
    scheduler = get_scheduler(site_profile.scheduler)
    if remote is not None and not scheduler.submits_over_ssh:
        raise ConfigError(f"--site {site_profile.name} runs on this machine ({scheduler.name} scheduler); it cannot "
                          "be used with --remote", hint="pick the remote machine's site profile")
    return job, site_profile, scheduler, overrides


def _task_assignments(array: str | None, tasks: int | None, scheduler: Scheduler, site_profile: SiteProfile
                      ) -> tuple[list[str | None], bool]:
    """One override per array task (None: the spec as it is), and whether the job is an array."""
    assignments: list[str | None] = [None]
    if array is not None and tasks is not None:
        raise ConfigError("an array is made of --array values or of a number of tasks, not both")
    if tasks is not None and tasks < 1:
        raise ConfigError(f"tasks={tasks}: an array needs at least one task")
    is_array = array is not None or (tasks or 1) > 1
    if is_array and scheduler.array_index_variable is None:
        raise SchedulerError(f"site {site_profile.name!r} ({scheduler.name}) cannot run job arrays",
                             hint="submit one run per value with --set instead")
    if array is not None:
        key, values = parse_array(array)
        assignments = [f"{key}={v}" for v in values]
    elif tasks is not None:
        assignments = [None] * tasks
    return assignments, is_array


def _checked_variants(job: JobSpec, assignments: list[str | None], site_profile: SiteProfile, remote: str | None
                      ) -> tuple[list[JobSpec], Placement]:
    """Each task's spec, checked before anything is registered or written, and where the job is placed."""
    from hpctrain.config.preflight import check_job, warn

    jobs = [job if a is None else _variant(job, a) for a in assignments]
    for j in jobs:
        placement = place(j, site_profile)
        # What would fail at start fails now; data paths are checked where the ranks will read them. The notes say
        # which execution queue the job lands in and whether it may requeue.
        warn([*placement.notes, *check_job(j, site_profile, local_paths=remote is None)])
    check_array_size(site_profile, placement, len(jobs))
    return jobs, placement


def _dependency(registry: RunRegistry, after: str, site: SiteProfile, remote: str | None) -> tuple[str, str]:
    parent_ref, kind = parse_after(after)
    parent = registry.get_run(parent_ref)
    if parent.site != site.name or parent.remote != remote:
        raise SchedulerError(f"--after {parent.run_id}: that run is on {parent.site} "
                             f"({parent.remote or 'login node'}), not on {site.name} ({remote or 'login node'})")
    parent_job = latest_job_id(registry, parent.run_id)
    if parent_job is None:
        raise SchedulerError(f"--after {parent.run_id}: that run has no submitted job to depend on")
    return kind, parent_job


def _register(registry: RunRegistry, jobs: list[JobSpec], site: SiteProfile, remote: str | None, root: str,
              base_id: str, overrides: list[str], assignments: list[str | None]) -> list[Run]:
    runs: list[Run] = []
    is_array = assignments != [None]
    for i, (j, a) in enumerate(zip(jobs, assignments, strict=True)):
        run_id = f"{base_id}_{i}" if is_array else base_id
        run_dir = f"{root}/{run_id}"
        runs.append(registry.create_run(
            j.name, site.name, j.spec_hash(), run_dir, remote=remote, spec_path=f"{run_dir}/job.yaml",
            overrides=overrides + ([a] if a else []), run_id=run_id,
            array_parent=f"{base_id}_0" if is_array else None, array_index=i if is_array else None))
    return runs


def _rank_command(site: SiteProfile, scheduler: Scheduler, python: str | None, command: list[str] | None,
                  array_dir: str | None) -> list[str] | None:
    """The rank command; for an array, wrapped so each task works in its own ``<array_dir>_<index>``."""
    if array_dir is None:
        return command
    from hpctrain.submission.render import python_for

    inner = command or [python_for(site, python), "-m", "hpctrain", "run", "job.yaml", "--run-dir", "."]
    # The scheduler sets the index variable in every task (and the launcher passes it on to the ranks).
    return ["bash", "-c", f'cd -- "${{0}}_${{{scheduler.array_index_variable}}}" && exec "$@"', array_dir, *inner]


def _dry_run(jobs: list[JobSpec], site: SiteProfile, scheduler: Scheduler, transport: Transport,
             registry: RunRegistry, root: str, base_id: str, python: str | None, command: list[str] | None,
             is_array: bool, excluded: dict[str, str]) -> Submitted:
    from hpctrain.config.job import dump_job
    from hpctrain.submission.render import render_script

    run_dir = f"{root}/{base_id}"
    cmd = _rank_command(site, scheduler, python, command, run_dir if is_array else None)
    rendered = render_script(jobs[0], site, run_dir=run_dir, spec_path=f"{run_dir}/job.yaml", python=python,
                             command=cmd, excluded_nodes=list(excluded))
    stage = dry_run_dir(registry) / base_id
    write_record_file(stage / "job.sh", rendered.text, 0o755)
    for i, j in enumerate(jobs):
        write_record_file(stage / (f"job-{i}.yaml" if is_array else "job.yaml"), dump_job(j))
    message = ""
    test_argv = scheduler.test_only_argv("/dev/stdin")
    if test_argv is not None:
        done = transport.run(test_argv, timeout=SUBMIT_TIMEOUT_S, input=rendered.text.encode(), check=False)
        message = (done.stderr + done.stdout).strip()
        if done.returncode != 0:
            raise SchedulerError(f"{shlex.join(test_argv[:-1])} refused the script on {transport.host}: "
                                 f"{_last(message)}", hint=f"the script is in {stage / 'job.sh'}")
    return Submitted([], [], str(stage / "job.sh"), dry_run=True, message=message, excluded=excluded)


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def stage_and_submit(registry: RunRegistry, transport: Transport, site: SiteProfile, runs: list[Run],
                     jobs: list[JobSpec], *, kind: str, submit_dir: str, array: bool = False,
                     python: str | None = None, command: list[str] | None = None,
                     dependency: tuple[str, str] | None = None, ssh_config: str | None = None,
                     remove: Sequence[str] = (), files: Sequence[Sequence[StagedFile]] = (),
                     excluded_nodes: Sequence[str] = ()) -> list[str]:
    """Render, stage, copy and submit the job of ``runs`` (with ``array``: one array job, a task per run);
    record each run's new job (``kind``: submit or resume) and return the job ids.

    The script lives in ``submit_dir`` (an array's own directory, else the run directory); the submit
    command runs there. ``remove``: file names deleted from the run directories first (what a previous job
    left that must not be read as this one's: its failure note). ``files[i]``: (local file, name) pairs copied
    into ``runs[i]``'s directory with its spec. ``excluded_nodes``: nodes the job is kept off (``render_script``).
    Any failure is recorded as a failed attempt of every run and raised.
    """
    try:
        return _stage_and_submit(registry, transport, site, runs, jobs, kind, submit_dir, array, python, command,
                                 dependency, ssh_config, remove, files, excluded_nodes)
    except BaseException as exc:
        message = str(exc) if isinstance(exc, HpctrainError) else f"{type(exc).__name__}: {exc}"
        for run in runs:
            try:
                registry.add_submission(run.run_id, None, kind, ok=False, error=message or "interrupted")
            except HpctrainError:
                pass
        if isinstance(exc, HpctrainError) or not isinstance(exc, Exception):
            raise
        raise HpctrainError(f"submission of {jobs[0].name} failed: {message}") from exc


def _stage_and_submit(registry: RunRegistry, transport: Transport, site: SiteProfile, runs: list[Run],
                      jobs: list[JobSpec], kind: str, submit_dir: str, is_array: bool, python: str | None,
                      command: list[str] | None, dependency: tuple[str, str] | None, ssh_config: str | None,
                      remove: Sequence[str], files: Sequence[Sequence[StagedFile]] = (),
                      excluded_nodes: Sequence[str] = ()) -> list[str]:
    from hpctrain.config.job import dump_job
    from hpctrain.submission.render import python_for, render_script
    from hpctrain.submission.staging import pack_environment

    scheduler = get_scheduler(site.scheduler)
    cmd = _rank_command(site, scheduler, python, command, submit_dir if is_array else None)
    rendered = render_script(jobs[0], site, run_dir=submit_dir, spec_path=f"{runs[0].run_dir}/job.yaml",
                             python=python, command=cmd, excluded_nodes=excluded_nodes)
    # A job that stages its Python environment reads it packed, where the script runs (reused while unchanged).
    pack_environment(transport, jobs[0], site, python_for(site, python), lambda p: _expand_home(transport, p))
    # Stage locally (atomic writes), then copy into the run directories (atomic on the other side too).
    staged: list[tuple[Path, str]] = []
    site_text = dump_site(site)
    for run, j in zip(runs, jobs, strict=True):
        rec = record_dir(registry, run.run_id)
        write_record_file(rec / "job.yaml", dump_job(j))
        write_record_file(rec / SITE_FILE, site_text)
        meta = RunMeta(scheduler=scheduler.name, ssh_config=ssh_config, total_steps=j.train.steps,
                       max_requeues=j.checkpoint.max_requeues, no_requeue=rendered.placement.no_requeue_reason,
                       spare_nodes=j.resources.spare_nodes)
        write_record_file(rec / META_FILE, meta.to_json())
        staged.append((rec / "job.yaml", f"{run.run_dir}/job.yaml"))
    for run, extra in zip(runs, files or [()] * len(runs), strict=True):
        staged += [(Path(local), f"{run.run_dir}/{staged_name(name)}") for local, name in extra]
    script_local = record_dir(registry, runs[0].run_id) / "job.sh"
    write_record_file(script_local, rendered.text, 0o755)
    script_remote = f"{submit_dir}/job.sh"
    staged.append((script_local, script_remote))

    for d in sorted({submit_dir, *(r.run_dir for r in runs)}):
        transport.mkdir_p(d)
    if remove:
        transport.run(["rm", "-f", "--", *(f"{r.run_dir}/{name}" for r in runs for name in remove)],
                      timeout=SUBMIT_TIMEOUT_S)
    for local, dest in staged:
        transport.put(local, dest)

    argv = scheduler.submit_argv(script_remote, dependency=dependency,
                                 array=f"0-{len(runs) - 1}" if is_array else None,
                                 array_dir=submit_dir if is_array else None)
    done = run_submit_command(transport, ["env", "-C", submit_dir, *argv], scheduler.name)
    master = scheduler.parse_job_id(done.stdout)
    job_ids = [scheduler.array_task_id(master, i) if is_array else master for i in range(len(runs))]
    for run, job_id in zip(runs, job_ids, strict=True):
        registry.add_submission(run.run_id, job_id, kind, ok=True)
    return job_ids


def run_submit_command(transport: Transport, argv: list[str], scheduler_name: str) -> Completed:
    """Run a submit command (``env -C DIR sbatch ...``); a refusal becomes one SchedulerError line."""
    try:
        return transport.run(argv, timeout=SUBMIT_TIMEOUT_S)
    except CommandFailed as exc:
        detail = _last(exc.completed.stderr or exc.completed.stdout)
        raise SchedulerError(f"{scheduler_name} on {transport.host} refused the job: {detail}") from None


# --- control ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cancelled:
    """What ``cancel_run`` did: ``sent`` is False when the run had no job or its job had already ended
    (``state`` then says how it ended) — nothing is sent to the scheduler then."""

    run_id: str
    job_id: str | None
    sent: bool
    state: str


def cancel_run(registry: RunRegistry, run: Run, pool: TransportPool | None = None) -> Cancelled:
    """Cancel a run's current job and record it; a run that has already ended is left alone.

    The run is polled first (one call), so a job that ended since the last ``status`` is not cancelled
    after the fact and its real end (completed, failed) is what the registry keeps.
    """
    pool = pool or TransportPool()
    job_id = latest_job_id(registry, run.run_id)
    if job_id is None:
        return Cancelled(run.run_id, None, False, run.state)
    meta = read_meta(registry, run)
    view = poll_runs(registry, [run], pool, progress=False)[0]
    if is_terminal(view.state):
        return Cancelled(run.run_id, job_id, False, view.state)
    argv = get_scheduler(meta.scheduler).cancel_argv(job_id, run.run_dir)
    try:
        pool.get(run.remote, meta.ssh_config).run(argv, timeout=SUBMIT_TIMEOUT_S)
    except CommandFailed as exc:
        detail = _last(exc.completed.stderr or exc.completed.stdout)
        raise SchedulerError(f"cancelling job {job_id} of run {run.run_id} failed: {detail}") from None
    registry.update_states({job_id: JobStatus(job_id, JobState.CANCELLED, "cancelled by the user")}, site=run.site)
    return Cancelled(run.run_id, job_id, True, JobState.CANCELLED.value)


def log_paths(registry: RunRegistry, run: Run, rank: int | None = None) -> list[str]:
    """Where the run's scheduler output (or rank N's own log) may be, most likely first."""
    if rank is not None:
        return [f"{run.run_dir}/rank-{rank}.log"]
    meta = read_meta(registry, run)
    job_id = latest_job_id(registry, run.run_id) or ""
    return [f"{run.run_dir}/{name}" for name in get_scheduler(meta.scheduler).log_names(job_id)]


def read_log(registry: RunRegistry, run: Run, pool: TransportPool | None = None, *, rank: int | None = None,
             offset: int = 0) -> str:
    """The log's text from byte ``offset`` on ('' when it does not exist yet)."""
    pool = pool or TransportPool()
    paths = log_paths(registry, run, rank)
    meta = read_meta(registry, run)
    script = 'o=$1; shift; for f in "$@"; do if [ -f "$f" ]; then exec tail -c +"$o" -- "$f"; fi; done; ' \
             'echo "@@hpctrain-nolog" >&2'
    done = pool.get(run.remote, meta.ssh_config).run(["sh", "-c", script, "sh", str(offset + 1), *paths],
                                                     timeout=60, check=False)
    if "@@hpctrain-nolog" in done.stderr:
        if rank is not None:
            raise HpctrainError(f"run {run.run_id} has no log for rank {rank} ({paths[0]})",
                                hint="per-rank logs exist only when the launcher writes them "
                                     "(the local launcher with --log-dir); the scheduler log has all ranks")
        return ""
    return done.stdout


# --- the Python API --------------------------------------------------------------------------------------------


class RunHandle:
    """A submitted run, as submitit users know it: ``status()``, ``wait()``, ``logs()``, ``cancel()``."""

    def __init__(self, run_id: str, registry_path: str | os.PathLike[str] | None = None,
                 pool: TransportPool | None = None) -> None:
        self._registry_path = registry_path
        self._pool = pool or TransportPool()
        with self._registry() as reg:
            self.run_id = reg.get_run(run_id).run_id

    def _registry(self) -> RunRegistry:
        return RunRegistry(self._registry_path)

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, job_id={self.job_id!r})"

    @property
    def job_id(self) -> str | None:
        with self._registry() as reg:
            return latest_job_id(reg, self.run_id)

    @property
    def run(self) -> Run:
        with self._registry() as reg:
            return reg.get_run(self.run_id)

    def status(self) -> RunView:
        """Poll the scheduler once (if the run is active) and return the run's view (``reason`` names why
        a failed run failed: the first error a rank wrote)."""
        with self._registry() as reg:
            return poll_runs(reg, [reg.get_run(self.run_id)], self._pool)[0]

    def wait(self, timeout: float | None = None, poll_s: float = 2.0, max_poll_s: float = 30.0) -> RunView:
        """Poll with back-off until the run is terminal; raises HpctrainError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = poll_s
        while True:
            view = self.status()
            if is_terminal(view.state):
                return view
            if deadline is not None and time.monotonic() + delay > deadline:
                raise HpctrainError(f"run {self.run_id} still {view.state} after {timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 1.5, max_poll_s)

    def logs(self, rank: int | None = None) -> str:
        """The scheduler's output file (or rank N's log) as text."""
        with self._registry() as reg:
            return read_log(reg, reg.get_run(self.run_id), self._pool, rank=rank)

    def cancel(self) -> Cancelled:
        """Cancel the run's current job (nothing is sent when it has already ended)."""
        with self._registry() as reg:
            return cancel_run(reg, reg.get_run(self.run_id), self._pool)


def submit(job: JobSpec | str | os.PathLike[str], site: SiteProfile | str | None = None, *,
           remote: str | None = None, ssh_config: str | None = None, array: str | None = None,
           registry_path: str | os.PathLike[str] | None = None, pool: TransportPool | None = None,
           **options: Any) -> RunHandle | list[RunHandle] | Submitted:
    """Submit ``job`` (a JobSpec, a YAML path or a job spec's name) to ``site``; a RunHandle, or one per task with
    ``array``; with ``dry_run=True`` nothing is submitted and the Submitted record (``script_path``, the
    scheduler's ``message``) comes back instead.

    ``options``: sets, nodes, walltime, queue, after, run_root, command, dry_run (see ``submit_runs``).
    """
    pool = pool or TransportPool()
    with RunRegistry(registry_path) as reg:
        done = submit_runs(job, site, remote=remote, ssh_config=ssh_config, array=array, registry=reg, pool=pool,
                           **options)
    if done.dry_run:
        return done
    handles = [RunHandle(r.run_id, registry_path, pool) for r in done.runs]
    return handles if array is not None else handles[0]


def shell_command(text: str) -> list[str]:
    """``--command 'python -c ...'`` as an argv."""
    argv = shlex.split(text)
    if not argv:
        raise ConfigError("--command is empty")
    return argv


__all__ = ["Cancelled", "RunHandle", "RunView", "Submitted", "cancel_run", "read_log", "stage_and_submit",
           "submit", "submit_runs"]
