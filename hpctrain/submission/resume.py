"""Continue a stopped run: submit its job again in the same run directory, so it resumes from its checkpoint.

Used by ``hpctrain resume RUN`` from the login node or a laptop (the same transport as ``submit``, and the same
``stage_and_submit`` path, with the site profile recorded at submit). It refuses a run that is still active,
one without a checkpoint, and one whose newest checkpoint is its last step; the new job is recorded in the
run's chain as kind ``resume``. The new job is kept off the nodes the run blamed that its next attempt leaves out,
the nodes remembered as bad on its site and the nodes named with ``exclude``, less those named with ``include``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpctrain.checkpoint.manifest import MANIFEST, newest_step
from hpctrain.errors import CheckpointError, ConfigError, SchedulerError, TransportError
from hpctrain.exit_codes import EXIT_TRANSPORT
from hpctrain.submission.api import stage_and_submit
from hpctrain.submission.blamed_nodes import (
    checked_node_name,
    excluded_nodes,
    left_out_by_run,
    remembered_words,
    usable_node_names,
)
from hpctrain.submission.failure import NOTE_FILES
from hpctrain.submission.queue_limits import check_queued_jobs, check_usable_nodes
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import Run
from hpctrain.submission.run_record import SITE_FILE, read_meta, record_dir, run_site
from hpctrain.submission.schedulers.base import get_scheduler, place
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import TransportPool

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.submission.transport import Transport


@dataclass(frozen=True)
class Resumed:
    """What ``resume_run`` submitted: the run, the new job id, the step it will continue from and the nodes the
    new job is kept off (node -> why)."""

    run: Run
    job_id: str
    from_step: int
    total_steps: int
    excluded: dict[str, str] = field(default_factory=dict)


def checkpoint_dir(job: JobSpec, run_dir: str) -> str:
    """The run's checkpoint directory as the runtime resolves it (``checkpoint.dir`` under the run dir)."""
    directory = job.checkpoint.dir
    return directory if directory.startswith("/") else f"{run_dir.rstrip('/')}/{directory}"


def newest_checkpoint_step(transport: Transport, directory: str) -> int | None:
    """The newest step listed in ``DIRECTORY/manifest.json`` on the run's machine; None when there is none."""
    done = transport.run(["cat", "--", f"{directory}/{MANIFEST}"], timeout=60, check=False)
    if done.returncode != 0:
        return None
    try:
        return newest_step(done.stdout, directory)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{directory}/{MANIFEST} on {transport.host} is not a readable manifest ({exc})",
                              hint="`hpctrain run` rebuilds it from the step directories; inspect it by hand") from None


def resubmit_hint(registry: RunRegistry, run: Run) -> str:
    """How to start the run afresh, naming only files that exist here (what was staged for it)."""
    rec = record_dir(registry, run.run_id)
    spec, site = rec / "job.yaml", rec / SITE_FILE
    if not spec.is_file():
        return "submit your job spec again with `hpctrain submit`"
    words = ["hpctrain", "submit", str(spec), "--site", str(site) if site.is_file() else run.site]
    if run.remote:
        words += ["--remote", run.remote]
    return f"start it afresh: {shlex.join(words)}"


def _spec_of(registry: RunRegistry, run: Run, nodes: int | None, walltime: str | None,
             queue: str | None) -> JobSpec:
    from hpctrain.config.job import load_job

    staged = record_dir(registry, run.run_id) / "job.yaml"
    if not staged.is_file():
        raise ConfigError(f"the spec submitted for run {run.run_id} is gone", path=str(staged),
                          hint="resume it by hand: submit the run directory's job.yaml with --run-root")
    job = load_job(staged, nodes=nodes, walltime=walltime, queue=queue)
    original = load_job(staged)
    if job.resources.nodes > original.resources.nodes:
        raise ConfigError(f"--nodes {job.resources.nodes}: run {run.run_id} ran on {original.resources.nodes} "
                          "node(s); a continuation runs on the same or fewer nodes",
                          key="resources.nodes", hint="submit a new run to train on more nodes")
    return job


def resume_run(registry: RunRegistry, run_ref: str, *, nodes: int | None = None, walltime: str | None = None,
               queue: str | None = None, ssh_config: str | None = None,
               pool: TransportPool | None = None, exclude: Sequence[str] = (),
               include: Sequence[str] = ()) -> Resumed:
    """Submit a continuation of ``run_ref`` in its own run directory; see the module docstring."""
    pool = pool or TransportPool()
    for flag, names in (("--exclude", exclude), ("--include", include)):
        for name in names:
            checked_node_name(name, flag)  # before anything is asked of the run's machine
    run = registry.get_run(run_ref)
    cfg = ssh_config or read_meta(registry, run).ssh_config
    view = poll_runs(registry, [run], pool, progress=False, ssh_config=cfg)[0]
    if view.poll_error:
        error = TransportError if view.poll_error_code == EXIT_TRANSPORT else SchedulerError
        raise error(f"cannot tell whether run {run.run_id} is still active: {view.poll_error}")
    run = registry.get_run(run.run_id)
    if run.is_active:
        raise SchedulerError(f"run {run.run_id} is still {run.state.upper()} (job {view.job_id}); a continuation "
                             "would write into the same checkpoints",
                             hint=f"wait for it to end, or `hpctrain cancel {run.run_id}` first")
    job = _spec_of(registry, run, nodes, walltime, queue)
    site = run_site(registry, run)
    excluded = nodes_kept_off(registry, run, job.resources.spare_nodes, site.scheduler, exclude, include)
    transport = pool.get(run.remote, cfg)
    ckpt_dir = checkpoint_dir(job, run.run_dir)
    step = newest_checkpoint_step(transport, ckpt_dir)
    where = f"{ckpt_dir} on {transport.host}"
    if step is None:
        raise CheckpointError(f"run {run.run_id} has no checkpoint in {where}: there is nothing to resume from",
                              hint=resubmit_hint(registry, run))
    if step >= job.train.steps:
        raise CheckpointError(f"run {run.run_id} already completed all {job.train.steps} steps (checkpoint of step "
                              f"{step} in {where}); nothing to resume",
                              hint="raise train.steps in a new run to train longer")
    # The continuation is one more job in the queue: refused here when the user's queued jobs fill it.
    placement = place(job, site)
    check_queued_jobs(transport, site, placement, 1)
    excluded = check_usable_nodes(transport, site, placement, job.resources.allocated_nodes, excluded, exclude)
    # The run dir's job.yaml and job.sh are replaced (the runtime and a PBS/Cobalt resubmission read them);
    # the previous job's failure note goes, so that this job's status is not read from it.
    (job_id,) = stage_and_submit(registry, transport, site, [run], [job], kind="resume", submit_dir=run.run_dir,
                                 python=sys.executable if run.remote is None else None, ssh_config=cfg,
                                 remove=list(NOTE_FILES), excluded_nodes=list(excluded))
    return Resumed(registry.get_run(run.run_id), job_id, step, job.train.steps, excluded)


def nodes_kept_off(registry: RunRegistry, run: Run, spare_nodes: int, scheduler_name: str, exclude: Sequence[str],
                   include: Sequence[str]) -> dict[str, str]:
    """node -> why, for the nodes a continuation of ``run`` is kept off; a warning where the scheduler cannot keep
    a job off named nodes and the job has no spare node for the node check to put in their place."""
    from hpctrain.config.preflight import warn

    by_run = left_out_by_run(usable_node_names(registry.blames(run.run_id)), spare_nodes)
    remembered = remembered_words(registry.remembered_nodes(run.site))
    excluded = excluded_nodes(by_run, remembered, exclude, include)
    scheduler = get_scheduler(scheduler_name)
    if excluded and not scheduler.excludes_nodes and spare_nodes == 0:
        warn([f"{scheduler.name} cannot keep a job off named nodes: the scheduler may give "
              f"{', '.join(excluded)} to the continuation again; set resources.spare_nodes in the job spec so that "
              "the node check can train on other nodes"])
    return excluded
