"""Continue a stopped run: submit its job again in the same run directory, so it resumes from its checkpoint.

Used by ``hpctrain resume RUN`` from the login node or a laptop (the same transport as ``submit``). It refuses
a run that is still active, one without a checkpoint, and one whose newest checkpoint is its last step; the
new job is recorded in the run's chain as kind ``resume``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpctrain.checkpoint.manifest import MANIFEST, newest_step
from hpctrain.errors import CheckpointError, ConfigError, HpctrainError, SchedulerError
from hpctrain.submission.registry import Registry, Run
from hpctrain.submission.tracking import TransportPool, poll_runs, read_meta, record_dir

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.submission.transport import Transport



@dataclass(frozen=True)
class Resumed:
    """What ``resume_run`` submitted: the run, the new job id and the step it will continue from."""

    run: Run
    job_id: str
    from_step: int
    total_steps: int


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


def _spec_of(registry: Registry, run: Run, nodes: int | None, walltime: str | None,
             queue: str | None) -> JobSpec:
    from hpctrain.config.job import load_job

    staged = record_dir(registry, run.run_id) / "job.yaml"
    if not staged.is_file():
        raise HpctrainError(f"the spec submitted for run {run.run_id} is gone ({staged})",
                            hint="resume it by hand: submit the run directory's job.yaml with --run-root")
    job = load_job(staged, nodes=nodes, walltime=walltime, queue=queue)
    original = load_job(staged)
    if job.resources.nodes > original.resources.nodes:
        raise ConfigError(f"--nodes {job.resources.nodes}: run {run.run_id} ran on {original.resources.nodes} "
                          "node(s); a continuation runs on the same or fewer nodes",
                          key="resources.nodes", hint="submit a new run to train on more nodes")
    return job


def resume_run(registry: Registry, run_ref: str, *, nodes: int | None = None, walltime: str | None = None,
               queue: str | None = None, ssh_config: str | None = None,
               pool: TransportPool | None = None) -> Resumed:
    """Submit a continuation of ``run_ref`` in its own run directory; see the module docstring."""
    from hpctrain.config.job import dump_job
    from hpctrain.config.site import load_site
    from hpctrain.submission.api import write_atomic
    from hpctrain.submission.render import render_script

    pool = pool or TransportPool()
    run = registry.get_run(run_ref)
    meta = read_meta(registry, run)
    cfg = ssh_config or meta.ssh_config
    view = poll_runs(registry, [run], pool, progress=False, ssh_config=cfg)[0]
    if view.poll_error:
        raise SchedulerError(f"cannot tell whether run {run.run_id} is still active: {view.poll_error}")
    run = registry.get_run(run.run_id)
    if run.is_active:
        raise SchedulerError(f"run {run.run_id} is still {run.state.upper()} (job {view.job_id}); a continuation "
                             "would write into the same checkpoints",
                             hint=f"wait for it to end, or `hpctrain cancel {run.run_id}` first")
    job = _spec_of(registry, run, nodes, walltime, queue)
    site = load_site(run.site)
    transport = pool.get(run.remote, cfg)
    ckpt_dir = checkpoint_dir(job, run.run_dir)
    step = newest_checkpoint_step(transport, ckpt_dir)
    where = f"{ckpt_dir} on {transport.host}"
    if step is None:
        raise CheckpointError(f"run {run.run_id} has no checkpoint in {where}: there is nothing to resume from",
                              hint=f"submit the job again: hpctrain submit {run.run_dir}/job.yaml --site {run.site}")
    if step >= job.train.steps:
        raise HpctrainError(f"run {run.run_id} already completed all {job.train.steps} steps (checkpoint of step "
                            f"{step} in {where}); nothing to resume",
                            hint="raise train.steps in a new run to train longer")

    python = sys.executable if run.remote is None else None
    spec_path = f"{run.run_dir}/job.yaml"
    rendered = render_script(job, site, run_dir=run.run_dir, spec_path=spec_path, python=python)
    rec = record_dir(registry, run.run_id)
    # The run dir's job.yaml and job.sh are replaced: the runtime and a PBS/Cobalt resubmission read them.
    write_atomic(rec / "job.yaml", dump_job(job))
    write_atomic(rec / "job.sh", rendered.text, 0o755)
    try:
        transport.put(rec / "job.yaml", spec_path)
        transport.put(rec / "job.sh", f"{run.run_dir}/job.sh")
        job_id = _submit(job, site.scheduler, transport, run.run_dir)
    except HpctrainError as exc:
        registry.add_submission(run.run_id, None, "resume", ok=False, error=str(exc))
        raise
    registry.add_submission(run.run_id, job_id, "resume", ok=True)
    return Resumed(registry.get_run(run.run_id), job_id, step, job.train.steps)


def _submit(job: JobSpec, scheduler_name: str, transport: Transport, run_dir: str) -> str:
    from hpctrain.config.common import walltime_seconds
    from hpctrain.submission.api import run_submit_command
    from hpctrain.submission.schedulers.base import get_scheduler

    script = f"{run_dir}/job.sh"
    if scheduler_name == "local":
        from hpctrain.submission.schedulers import local_controller

        ckpt = job.checkpoint
        return local_controller.start(script, run_dir, walltime_s=int(walltime_seconds(job.resources.walltime)),
                                      signal_name=ckpt.signal, signal_lead_s=ckpt.signal_lead_s,
                                      max_requeues=ckpt.max_requeues)
    scheduler = get_scheduler(scheduler_name)
    done = run_submit_command(transport, ["env", "-C", run_dir, *scheduler.submit_argv(script)])
    return scheduler.parse_job_id(done.stdout)
