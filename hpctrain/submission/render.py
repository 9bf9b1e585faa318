"""Site profile + job spec -> batch script text (directives, environment, the launch line).

``render_script`` checks the fit and the job (config/preflight.py) first, so an impossible spec is refused
before any text is written.
Scripts are deterministic (no timestamps): the same inputs always give the same bytes.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hpctrain.config.common import walltime_seconds
from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.origin import locate
from hpctrain.config.preflight import check_job
from hpctrain.config.site import SiteProfile
from hpctrain.errors import ConfigError
from hpctrain.exit_codes import EXIT_REQUEUE, REQUEUE_MARKER
from hpctrain.job_environment import JOB_ENVIRONMENT_ENV, STOP_SIGNAL_ENV, exported_paths
from hpctrain.submission.launchers import (
    LIST_BINDING,
    LaunchPlan,
    cpus_per_rank_for,
    get_launcher,
    hyperthreads_for,
    slurm_threads_per_core,
)
from hpctrain.submission.launchers.binding import rank_cpus, rank_devices
from hpctrain.submission.node_check_lines import excluded_nodes_line, node_check_lines, relaunch_lines
from hpctrain.submission.schedulers.base import RenderOptions, Scheduler, exit_record_line, get_scheduler, place
from hpctrain.submission.shell import comment, quote, quote_path, word
from hpctrain.submission.staging import plan_staging, staged_site, staging_lines, training_host_file
from hpctrain.text import writable_text

TEMPLATES = Path(__file__).resolve().parent / "schedulers" / "templates"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RenderedScript:
    """The script text and what it was made from (the launch argv is the exact list in its launch line)."""

    text: str
    scheduler: Scheduler
    placement: Placement
    launch_argv: list[str]


@cache
def load_template(name: str, folder: Path | None = None) -> string.Template:
    """A template from ``folder`` (a plug-in's own) where it has one, else from ``schedulers/templates/`` (``$$`` is
    a literal ``$``)."""
    path = folder / name if folder is not None and (folder / name).is_file() else TEMPLATES / name
    return string.Template(path.read_text(encoding="utf-8"))


_EMPTY = "\x00empty\x00"


def fill(name: str, folder: Path | None = None, **values: object) -> str:
    """Fill a template (``folder``: a plug-in's templates, before hpctrain's); a line holding only an empty piece is
    dropped. A missing value is a KeyError."""
    text = load_template(name, folder).substitute({k: (str(v) if str(v) else _EMPTY) for k, v in values.items()})
    return text.replace(_EMPTY + "\n", "").replace(_EMPTY, "")


def launcher_note_line(launcher: str, python: str, run_dir: str) -> str:
    """After a failed launch: the launcher's exit note (srun: the first rank it reports killed by a signal becomes
    the failure note, launchers/exit_note.py); launchers without one need no line (the ranks note it)."""
    exit_note = get_launcher(launcher).exit_note
    if exit_note is None:
        return ""
    note = exit_note(word(python), quote_path(run_dir))
    return (f'if [ "${{status}}" -ne 0 ] && [ "${{status}}" -ne {EXIT_REQUEUE} ]; then {note} || true; fi')


def no_requeue_lines(reason: str) -> list[str]:
    """Where the queue allows no requeue chain: the job ends with status 75 at its checkpoint and says how to go on."""
    text = (f"hpctrain: stopped at its checkpoint; no requeue: {comment(reason, limit=600)}; "
            "resume with: hpctrain resume RUN")
    return [f'if [ "${{status}}" -eq {EXIT_REQUEUE} ]; then', f"    echo {quote(text)} >&2", "fi"]


def python_for(site: SiteProfile, python: str | None) -> str:
    """The interpreter on the compute nodes: the site's, its venv's, the caller's, else ``python3``."""
    env = site.environment
    if env.python:
        return env.python
    if env.venv:
        return env.venv.rstrip("/") + "/bin/python"
    return python or "python3"


def launch_plan(job: JobSpec, site: SiteProfile, placement: Placement, python: str) -> LaunchPlan:
    """The launcher's view of the job on this site's node."""
    res, node = job.resources, placement.node
    ht = hyperthreads_for(node, res.ranks_per_node, res.threads_per_rank)
    cpu_list = (rank_cpus(node, res.ranks_per_node, res.threads_per_rank, ht) if site.cpu_bind == LIST_BINDING
                else ())
    return LaunchPlan(
        nodes=res.nodes, ranks_per_node=res.ranks_per_node, threads_per_rank=res.threads_per_rank,
        gpus_per_rank=res.gpus_per_rank, cpu_bind=site.cpu_bind, extra_args=tuple(site.launcher_args),
        hyperthreads=ht, cpus_per_rank=cpus_per_rank_for(node, res.threads_per_rank, ht),
        gpu_kind=node.gpu_kind, python=python, threads_per_core=slurm_threads_per_core(node, ht),
        cpu_list=cpu_list, devices=rank_devices(node, res.ranks_per_node, res.gpus_per_rank),
        host_file=training_host_file(job),
    )


def _export(name: str, value: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(f"{name!r} is not a valid environment variable name", key="env")
    return f"export {name}={quote(value)}"


def environment_lines(job: JobSpec, site: SiteProfile, placement: Placement, plan: LaunchPlan,
                      python: str) -> list[str]:
    """Modules, site setup, exports, venv activation and the MPI check, in that order."""
    env = site.environment
    lines: list[str] = []
    modules = list(env.modules) + (list(site.mpi.modules) if placement.backend == "mpi" else [])
    if modules:
        lines.append("# modules")
        lines += [f"module load {quote(m)}" for m in modules]
    if env.setup:
        lines.append("# site setup: the site admin's own shell lines, run as written")
        lines += list(env.setup)
    lines += collectives_lines(job, site)
    exported = {**env.env, **job.env}
    threads = str(plan.threads_per_rank)
    scheduler = get_scheduler(site.scheduler)
    launcher = get_launcher(scheduler.launcher_for(site))
    defaults = {"OMP_NUM_THREADS": threads}
    if plan.cpu_bind or launcher.pins_threads:
        defaults["OMP_PLACES"] = "threads" if plan.hyperthreads > 1 else "cores"
        defaults["OMP_PROC_BIND"] = "close"
    defaults.update({"HPCTRAIN_SITE": site.name, "HPCTRAIN_COMM_BACKEND": placement.backend,
                     STOP_SIGNAL_ENV: job.checkpoint.signal})
    plugins = exported_paths(launcher.job_environment, scheduler.job_environment)
    if plugins:  # the ranks import these job environments (hpctrain's own need no line)
        defaults[JOB_ENVIRONMENT_ENV] = plugins
    if job.resources.gpus_per_rank > 0 and placement.node.gpu_kind != "none":
        defaults["HPCTRAIN_GPU_KIND"] = placement.node.gpu_kind  # the ranks name it when torch lacks the backend
    if site.intel_extension:
        defaults["HPCTRAIN_INTEL_EXTENSION"] = "1"
    lines.append("# environment (site, then job, then hpctrain's defaults where neither set one)")
    lines += [_export(k, v) for k, v in exported.items()]
    lines += [_export(k, v) for k, v in defaults.items() if k not in exported]
    if env.venv:
        lines.append("# Python environment")
        lines.append(f"source {quote_path(env.venv.rstrip('/') + '/bin/activate')}")
    if placement.backend == "mpi":
        lines += mpi_check_lines(python, site.mpi.expected_library)
    return lines


def collectives_lines(job: JobSpec, site: SiteProfile) -> list[str]:
    """The site's collective-library block: its modules, its variables (the job's value where the job's env sets
    one, so that the setup lines see it) and its setup lines, under a comment naming the library and its page."""
    coll = site.environment.collectives
    if not (coll.modules or coll.env or coll.setup):
        return []
    what = f"collective library: {coll.library}" if coll.library else "collective library"
    where = f"site profile {site.name}" + (f", from {coll.source}" if coll.source else "")
    lines = ["# " + comment(f"{what} ({where}); a job's env overrides any of these", limit=400)]
    lines += [f"module load {quote(m)}" for m in coll.modules]
    lines += [_export(k, job.env.get(k, v)) for k, v in coll.env.items()]
    lines += list(coll.setup)
    return lines


def mpi_check_lines(python: str, expected: str | None) -> list[str]:
    """Log which MPI library mpi4py loads (without MPI_Init) and warn when it is not the site's.

    ``expected`` is data: it is assigned once as a quoted word and only ever used as ``"${expected_mpi}"``
    (never spliced into a double-quoted string, where a quote or ``$(...)`` in it would become code).
    """
    code = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
            "print(MPI.Get_library_version().splitlines()[0].strip())")
    lines = ["# which MPI library mpi4py uses (MPI is not initialised here)",
             f"mpi_library=$({quote_path(python)} -c {quote(code)} 2>&1) || mpi_library=\"mpi4py failed: "
             "${mpi_library}\"",
             'echo "hpctrain: MPI library: ${mpi_library}"']
    if expected:
        lines += [f"expected_mpi={quote(expected)}",
                  'case "${mpi_library}" in *"${expected_mpi}"*) ;; *)',
                  "    echo \"hpctrain: WARNING: expected the site's MPI (${expected_mpi}) but mpi4py uses"
                  " ${mpi_library}; rebuild mpi4py against it (see docs)\" >&2 ;;",
                  "esac"]
    return lines


def render_script(
    job: JobSpec,
    site: SiteProfile,
    *,
    run_dir: str,
    spec_path: str,
    python: str | None = None,
    command: list[str] | None = None,
    excluded_nodes: Sequence[str] = (),
) -> RenderedScript:
    """The batch script of ``job`` on ``site``; a FitError when it cannot fit.

    ``command`` replaces the rank command ``PYTHON -m hpctrain run SPEC --run-dir RUN_DIR`` (tests).
    ``excluded_nodes``: nodes the job must not train on (the scheduler's exclusion where it has one; the node
    check leaves them out of the training nodes in any case).
    """
    for flag, value in (("--run-dir", run_dir), ("--python", python), ("spec path", spec_path)):
        if value is not None and not writable_text(value):
            raise ConfigError(f"{flag} {value!r} holds bytes that are not UTF-8 text or a NUL; a script "
                              "cannot carry it", hint="use a path of UTF-8 characters")
    try:
        return _render(job, site, run_dir=run_dir, spec_path=spec_path, python=python, command=command,
                       excluded_nodes=tuple(dict.fromkeys(excluded_nodes)))
    except ConfigError as exc:
        # The fit and directive checks know a key, not where its value came from: name the spec's line or flag.
        raise locate(exc, job.origin) from None


def _render(job: JobSpec, site: SiteProfile, *, run_dir: str, spec_path: str, python: str | None,
            command: list[str] | None, excluded_nodes: tuple[str, ...] = ()) -> RenderedScript:
    placement = place(job, site)
    # What would fail when the ranks start fails here; warnings are for jobs validate and submit to show.
    check_job(job, site, local_paths=False)
    scheduler = get_scheduler(site.scheduler)
    interpreter = python_for(site, python)
    staging = plan_staging(job, site, interpreter)  # None when the job copies nothing to node-local storage
    site = staged_site(site, staging)
    plan = launch_plan(job, site, placement, staging.launch_python() if staging else interpreter)
    rank_command = command if command is not None else [
        interpreter, "-m", "hpctrain", "run", spec_path, "--run-dir", run_dir]
    if staging is not None:
        rank_command = staging.rank_command(list(rank_command), job, site)
    launcher = scheduler.launcher_for(site)
    launch_argv = get_launcher(launcher)(list(rank_command), plan)

    options = RenderOptions(run_dir=run_dir, spec_path=spec_path, plan=plan,
                            excluded_nodes=excluded_nodes if scheduler.excludes_nodes else ())
    directives = scheduler.render_directives(job, site, placement, options)
    ckpt = job.checkpoint
    # comment() although names are validated: a model changed with model_copy(update=...) skips validation.
    header = ["# " + comment(f"hpctrain job {job.name} for site {site.name} ({scheduler.name}, launcher "
                             f"{launcher}, backend {placement.backend}); written by `hpctrain render`",
                             limit=400)]
    if job.description:
        header.append(f"# {comment(job.description)}")
    header += [f"# {comment(note, limit=600)}" for note in placement.notes]  # the execution queue, no requeue
    timer, timer_stop = "", ""
    if scheduler.needs_signal_timer:
        delay = max(walltime_seconds(job.resources.walltime) - ckpt.signal_lead_s, 1)
        # The walltime runs from the job's start: what the script spent before (staging) comes off the wait.
        timer = (f"( trap 'kill $! 2>/dev/null; exit 0' TERM; sleep $(({delay} > SECONDS ? {delay} - SECONDS : 1)) "
                 f"& wait $!; kill -s {ckpt.signal} $$ ) &\ntimer_pid=$!")
        timer_stop = 'kill "${timer_pid}" 2>/dev/null || true'
    folder = scheduler.template_dir
    prologue = fill(
        "prologue.tmpl", folder, run_dir=quote_path(run_dir), job_id_variable=scheduler.job_id_variable,
        signal=ckpt.signal,
        environment="\n".join(environment_lines(job, site, placement, plan, interpreter)
                               + node_check_lines(job, site, scheduler, launcher, interpreter, run_dir, excluded_nodes)
                               + (staging_lines(staging, job, site, launcher, scheduler.job_id_variable,
                                                exit_record_line(scheduler.job_id_variable)) if staging else [])),
    ).rstrip("\n")
    requeue = (scheduler.requeue_lines(quote_path(f"{run_dir.rstrip('/')}/job.sh"), ckpt.max_requeues)
               if placement.requeue else no_requeue_lines(placement.no_requeue_reason or "the queue allows no requeue"))
    launch_line = " ".join(word(w) for w in launch_argv)
    if job.resources.workdir:
        # A subshell that becomes the launcher: the ranks start there, this shell (logs, exit record) stays put.
        launch_line = f"( cd {quote_path(job.resources.workdir)} && exec {launch_line} )"
    relaunch_start, relaunch_end = relaunch_lines(job, scheduler, interpreter, run_dir, excluded_nodes)
    launch = fill("launch.tmpl", folder, signal=ckpt.signal, timer=timer, timer_stop=timer_stop,
                  relaunch_start=relaunch_start, relaunch_end=relaunch_end,
                  requeue_marker=REQUEUE_MARKER, exit_requeue=EXIT_REQUEUE,
                  exit_record=exit_record_line(scheduler.job_id_variable),
                  launch_line=launch_line,
                  launcher_note=launcher_note_line(launcher, interpreter, run_dir),
                  requeue="\n".join(excluded_nodes_line(job, scheduler, interpreter) + requeue)).rstrip("\n")
    note = string.Template(scheduler.script_note).substitute(signal=ckpt.signal, signal_lead_s=ckpt.signal_lead_s)
    text = fill(scheduler.template, folder, directives="\n".join(directives), header="\n".join(header), note=note,
                prologue=prologue, launch=launch)
    return RenderedScript(text=text, scheduler=scheduler, placement=placement, launch_argv=launch_argv)
