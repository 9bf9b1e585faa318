"""Submit a job to a site — on this login node, over ssh from a laptop, or on this machine (``local``).

``submit_runs`` does the work (check fit, register, stage job.yaml + job.sh, copy to the run dir, submit,
record); every failure after registration is recorded as a failed attempt. ``submit`` is the Python API and
returns ``RunHandle`` objects with ``status()``, ``wait()``, ``logs()`` and ``cancel()``.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.errors import ConfigError, HpctrainError, SchedulerError, TransportError
from hpctrain.submission.registry import Registry, Run, new_run_id
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import is_home_relative
from hpctrain.submission.tracking import (
    META_FILE,
    RunMeta,
    RunView,
    TransportPool,
    is_terminal,
    latest_job_id,
    poll_runs,
    read_meta,
    record_dir,
)
from hpctrain.submission.transport import CommandFailed, Completed, Transport

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import SiteProfile

SUBMIT_TIMEOUT_S = 120.0
# The variable a scheduler sets in each array task to its index.
ARRAY_INDEX_VARIABLE = {"slurm": "SLURM_ARRAY_TASK_ID", "pbs": "PBS_ARRAY_INDEX"}
LOG_NAMES = {"slurm": "slurm-{job_id}.out", "pbs": "pbs.out", "cobalt": "cobalt.output", "local": "job.out"}
DEPENDENCY_KINDS = ("afterok", "afterany")


# --- small helpers --------------------------------------------------------------------------------------------


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file beside its final name, then rename (never a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(mode)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise HpctrainError(f"cannot write {path}: {exc.strerror}", hint="free space or check permissions") from None


def parse_array(text: str) -> tuple[str, list[str]]:
    """``train.lr=1e-3,3e-3`` -> ("train.lr", ["1e-3", "3e-3"])."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",")] if sep else []
    if not key.strip() or not items or any(not v for v in items):
        raise ConfigError(f"--array {text!r}: expected KEY=V1,V2,..., e.g. train.lr=1e-3,3e-3,1e-2")
    return key.strip(), items


def parse_after(text: str) -> tuple[str, str]:
    """``RUN[:afterok|afterany]`` -> (run, kind)."""
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


# --- the result ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """What a submission produced: the runs (one per array task), the script, and the scheduler's words."""

    runs: list[Run]
    job_ids: list[str | None]
    script_path: str
    dry_run: bool = False
    message: str = ""


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
    registry: Registry | None = None,
    pool: TransportPool | None = None,
) -> Submitted:
    """Check, register, stage, copy and submit; see the module docstring."""
    from hpctrain.config.fit import check_fit
    from hpctrain.config.job import JobSpec, load_job
    from hpctrain.config.preflight import check_job, warn
    from hpctrain.config.site import load_site
    from hpctrain.submission.schedulers.base import get_scheduler

    overrides = list(sets)
    if isinstance(job, JobSpec):
        if sets or nodes is not None or walltime is not None or queue is not None:
            extra = [*sets, *([f"resources.nodes={nodes}"] if nodes is not None else []),
                     *([f"resources.walltime={walltime}"] if walltime is not None else []),
                     *([f"resources.queue={queue}"] if queue is not None else [])]
            for assignment in extra:
                job = _variant(job, assignment)
    else:
        job = load_job(job, sets=list(sets), nodes=nodes, walltime=walltime, queue=queue)
        overrides += ([f"resources.nodes={nodes}"] if nodes is not None else []) + \
            ([f"resources.walltime={walltime}"] if walltime is not None else []) + \
            ([f"resources.queue={queue}"] if queue is not None else [])
    site_profile = site if not isinstance(site, str | type(None)) else load_site(site)
    scheduler = get_scheduler(site_profile.scheduler)
    if remote is not None and site_profile.scheduler == "local":
        raise ConfigError("--site local runs on this machine; it cannot be used with --remote",
                          hint="pick the remote machine's site profile")

    # Variants (one per array task), each checked before anything is registered or written.
    assignments: list[str | None] = [None]
    if array is not None:
        if site_profile.scheduler not in ARRAY_INDEX_VARIABLE:
            raise SchedulerError(f"site {site_profile.name!r} ({site_profile.scheduler}) cannot run job arrays",
                                 hint="submit one run per value with --set instead")
        key, values = parse_array(array)
        assignments = [f"{key}={v}" for v in values]
    jobs = [job if a is None else _variant(job, a) for a in assignments]
    for j in jobs:
        check_fit(j, site_profile)
        # What would fail at start fails now; data paths are checked where the ranks will read them.
        warn(check_job(j, site_profile, local_paths=remote is None))

    registry = registry or Registry()
    pool = pool or TransportPool()
    transport = pool.get(remote, ssh_config)

    dependency = None
    if after is not None:
        parent_ref, kind = parse_after(after)
        parent = registry.get_run(parent_ref)
        if parent.site != site_profile.name or parent.remote != remote:
            raise SchedulerError(f"--after {parent.run_id}: that run is on {parent.site} "
                                 f"({parent.remote or 'login node'}), not on {site_profile.name} "
                                 f"({remote or 'login node'})")
        parent_job = latest_job_id(registry, parent.run_id)
        if parent_job is None:
            raise SchedulerError(f"--after {parent.run_id}: that run has no submitted job to depend on")
        dependency = (kind, parent_job)
    # The back-end refuses what it cannot do (arrays on Cobalt, dependencies locally) before we register.
    scheduler.submit_argv("job.sh", dependency=dependency, array="0-0" if array else None)

    root = run_root or default_run_root(site_profile, remote)
    root = _expand_home(transport, root).rstrip("/") or "/"
    python = sys.executable if remote is None else None
    base_id = new_run_id(job.name)

    if dry_run:
        return _dry_run(jobs, site_profile, scheduler, transport, registry, root, base_id, python, command,
                        array is not None)

    runs = _register(registry, jobs, site_profile, remote, root, base_id, overrides, assignments)
    try:
        return _stage_and_submit(runs, jobs, site_profile, scheduler, transport, registry, root, base_id,
                                 python, command, dependency, ssh_config, array is not None)
    except BaseException as exc:
        message = str(exc) if isinstance(exc, HpctrainError) else f"{type(exc).__name__}: {exc}"
        for run in runs:
            try:
                registry.add_submission(run.run_id, None, "submit", ok=False, error=message or "interrupted")
            except HpctrainError:
                pass
        if isinstance(exc, HpctrainError) or not isinstance(exc, Exception):
            raise
        raise HpctrainError(f"submission of {job.name} failed: {message}") from exc


def _register(registry: Registry, jobs: list[JobSpec], site: SiteProfile, remote: str | None, root: str,
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


def _rank_command(site: SiteProfile, python: str | None, command: list[str] | None, array_dir: str | None,
                  index_var: str) -> list[str] | None:
    """The rank command; for an array, wrapped so each task works in its own ``<array_dir>_<index>``."""
    if array_dir is None:
        return command
    from hpctrain.submission.render import python_for

    inner = command or [python_for(site, python), "-m", "hpctrain", "run", "job.yaml", "--run-dir", "."]
    # The scheduler sets the index variable in every task (and srun passes it on to the ranks).
    return ["bash", "-c", f'cd -- "${{0}}_${{{index_var}}}" && exec "$@"', array_dir, *inner]


def _dry_run(jobs: list[JobSpec], site: SiteProfile, scheduler: Any, transport: Transport, registry: Registry,
             root: str, base_id: str, python: str | None, command: list[str] | None, is_array: bool) -> Submitted:
    from hpctrain.config.job import dump_job
    from hpctrain.submission.render import render_script

    run_dir = f"{root}/{base_id}"
    cmd = _rank_command(site, python, command, run_dir if is_array else None,
                        ARRAY_INDEX_VARIABLE.get(site.scheduler, ""))
    rendered = render_script(jobs[0], site, run_dir=run_dir, spec_path=f"{run_dir}/job.yaml", python=python,
                             command=cmd)
    stage = Path(registry.path).parent / "dry-run" / base_id
    write_atomic(stage / "job.sh", rendered.text, 0o755)
    for i, j in enumerate(jobs):
        write_atomic(stage / (f"job-{i}.yaml" if is_array else "job.yaml"), dump_job(j))
    message = ""
    test_argv = scheduler.test_only_argv("/dev/stdin")
    if site.scheduler == "local":
        test_argv = ["bash", "-n", "/dev/stdin"]
    if test_argv is not None:
        done = transport.run(test_argv, timeout=SUBMIT_TIMEOUT_S, input=rendered.text.encode(), check=False)
        message = (done.stderr + done.stdout).strip()
        if done.returncode != 0:
            raise SchedulerError(f"{test_argv[0]} {'--test-only ' if test_argv[0] == 'sbatch' else ''}"
                                 f"refused the script on {transport.host}: {_last(message)}",
                                 hint=f"the script is in {stage / 'job.sh'}")
    return Submitted([], [], str(stage / "job.sh"), dry_run=True, message=message)


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _stage_and_submit(runs: list[Run], jobs: list[JobSpec], site: SiteProfile, scheduler: Any,
                      transport: Transport, registry: Registry, root: str, base_id: str, python: str | None,
                      command: list[str] | None, dependency: tuple[str, str] | None, ssh_config: str | None,
                      is_array: bool) -> Submitted:
    from hpctrain.config.common import walltime_seconds
    from hpctrain.config.job import dump_job
    from hpctrain.submission.render import render_script

    index_var = ARRAY_INDEX_VARIABLE.get(site.scheduler, "")
    submit_dir = f"{root}/{base_id}" if is_array else runs[0].run_dir
    cmd = _rank_command(site, python, command, submit_dir if is_array else None, index_var)
    rendered = render_script(jobs[0], site, run_dir=submit_dir, spec_path=f"{runs[0].run_dir}/job.yaml",
                             python=python, command=cmd)
    # Stage locally (atomic writes), then copy into the run directories (atomic on the other side too).
    staged: list[tuple[Path, str]] = []
    for run, j in zip(runs, jobs, strict=True):
        rec = record_dir(registry, run.run_id)
        write_atomic(rec / "job.yaml", dump_job(j))
        staged.append((rec / "job.yaml", f"{run.run_dir}/job.yaml"))
    script_local = record_dir(registry, runs[0].run_id) / "job.sh"
    write_atomic(script_local, rendered.text, 0o755)
    script_remote = f"{submit_dir}/job.sh"
    staged.append((script_local, script_remote))
    log_name = LOG_NAMES.get(site.scheduler, "")
    for run, j in zip(runs, jobs, strict=True):
        meta = RunMeta(scheduler=site.scheduler, ssh_config=ssh_config,
                       log_name=("slurm-{job_id}.out" if is_array and site.scheduler == "slurm" else log_name),
                       total_steps=j.train.steps)
        write_atomic(record_dir(registry, run.run_id) / META_FILE, meta.to_json())

    for d in sorted({submit_dir, *(r.run_dir for r in runs)}):
        transport.mkdir_p(d)
    for local, dest in staged:
        transport.put(local, dest)

    if site.scheduler == "local":
        from hpctrain.submission.schedulers import local_controller

        job = jobs[0]
        job_id = local_controller.start(script_remote, runs[0].run_dir,
                                        walltime_s=int(walltime_seconds(job.resources.walltime)),
                                        signal_name=job.checkpoint.signal, signal_lead_s=job.checkpoint.signal_lead_s,
                                        max_requeues=job.checkpoint.max_requeues)
        registry.add_submission(runs[0].run_id, job_id, "submit", ok=True)
        return Submitted([registry.get_run(runs[0].run_id)], [job_id], str(script_local))

    array_range = f"0-{len(runs) - 1}" if is_array else None
    argv = scheduler.submit_argv(script_remote, dependency=dependency, array=array_range)
    if is_array and site.scheduler == "slurm":
        # Each task's output goes to its own run directory (command-line options beat #SBATCH lines).
        out = f"--output={root}/{base_id}_%a/slurm-%A_%a.out"
        argv = [*argv[:-1], out, out.replace("--output", "--error"), argv[-1]]
    done = run_submit_command(transport, ["env", "-C", submit_dir, *argv])
    master = scheduler.parse_job_id(done.stdout)
    job_ids: list[str | None] = []
    for i, run in enumerate(runs):
        job_id = _task_id(master, i) if is_array else master
        registry.add_submission(run.run_id, job_id, "submit", ok=True)
        job_ids.append(job_id)
    return Submitted([registry.get_run(r.run_id) for r in runs], job_ids, str(script_local),
                     message=done.stdout.strip())


def _task_id(master: str, index: int) -> str:
    """Slurm ``123`` -> ``123_4``; PBS ``123[].server`` -> ``123[4].server``."""
    if "[]" in master:
        return master.replace("[]", f"[{index}]", 1)
    return f"{master}_{index}"


def run_submit_command(transport: Transport, argv: list[str]) -> Completed:
    """Run a submit command (``env -C DIR sbatch ...``); a refusal becomes one SchedulerError line."""
    try:
        return transport.run(argv, timeout=SUBMIT_TIMEOUT_S)
    except CommandFailed as exc:
        detail = _last(exc.completed.stderr or exc.completed.stdout)
        prog = argv[3] if argv[:2] == ["env", "-C"] else argv[0]
        raise SchedulerError(f"{prog} on {transport.host} refused the job: {detail}") from None


# --- control ---------------------------------------------------------------------------------------------------


def cancel_run(registry: Registry, run: Run, pool: TransportPool | None = None) -> str | None:
    """Cancel a run's current job and record it; returns the job id (None when nothing was submitted)."""
    pool = pool or TransportPool()
    job_id = latest_job_id(registry, run.run_id)
    if job_id is None:
        return None
    meta = read_meta(registry, run)
    if meta.scheduler == "local":
        from hpctrain.submission.schedulers import local_controller

        local_controller.cancel(run.run_dir)
    else:
        from hpctrain.submission.schedulers.base import get_scheduler

        argv = get_scheduler(meta.scheduler).cancel_argv(job_id)
        try:
            pool.get(run.remote, meta.ssh_config).run(argv, timeout=SUBMIT_TIMEOUT_S)
        except CommandFailed as exc:
            detail = _last(exc.completed.stderr or exc.completed.stdout)
            raise SchedulerError(f"{argv[0]} {job_id} failed: {detail}") from None
    if run.is_active:
        registry.update_states({job_id: JobStatus(job_id, JobState.CANCELLED, "cancelled by the user")},
                               site=run.site)
    return job_id


def log_paths(registry: Registry, run: Run, rank: int | None = None) -> list[str]:
    """Where the run's scheduler output (or rank N's own log) may be, most likely first.

    PBS falls back to its default ``job.sh.o<seq>`` (what a server that ignores ``#PBS -o`` writes, e.g.
    the torque wrappers over Slurm).
    """
    if rank is not None:
        return [f"{run.run_dir}/rank-{rank}.log"]
    meta = read_meta(registry, run)
    job_id = latest_job_id(registry, run.run_id) or ""
    if not meta.log_name:
        raise SchedulerError(f"no known log file for scheduler {meta.scheduler}")
    paths = [f"{run.run_dir}/{meta.log_name.format(job_id=job_id)}"]
    if meta.scheduler == "pbs":
        paths.append(f"{run.run_dir}/job.sh.o{job_id.split('.')[0]}")
    return paths


def read_log(registry: Registry, run: Run, pool: TransportPool | None = None, *, rank: int | None = None,
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

    def _registry(self) -> Registry:
        return Registry(self._registry_path)

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
        """Poll the scheduler once (if the run is active) and return the run's view."""
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

    def cancel(self) -> None:
        """Cancel the run's current job."""
        with self._registry() as reg:
            cancel_run(reg, reg.get_run(self.run_id), self._pool)


def submit(job: JobSpec | str | os.PathLike[str], site: SiteProfile | str | None = None, *,
           remote: str | None = None, ssh_config: str | None = None, array: str | None = None,
           registry_path: str | os.PathLike[str] | None = None, pool: TransportPool | None = None,
           **options: Any) -> RunHandle | list[RunHandle]:
    """Submit ``job`` (a JobSpec or a YAML path) to ``site``; a RunHandle, or one per task with ``array``.

    ``options``: sets, nodes, walltime, queue, after, run_root, command (see ``submit_runs``).
    """
    pool = pool or TransportPool()
    with Registry(registry_path) as reg:
        done = submit_runs(job, site, remote=remote, ssh_config=ssh_config, array=array, registry=reg, pool=pool,
                           **options)
    handles = [RunHandle(r.run_id, registry_path, pool) for r in done.runs]
    return handles if array is not None else handles[0]


def shell_command(text: str) -> list[str]:
    """``--command 'python -c ...'`` as an argv."""
    argv = shlex.split(text)
    if not argv:
        raise ConfigError("--command is empty")
    return argv


__all__ = ["RunHandle", "RunView", "Submitted", "cancel_run", "read_log", "submit", "submit_runs",
           "TransportError"]
