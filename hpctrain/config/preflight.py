"""Everything that can be checked about a job before it waits in a queue, checked the way the ranks check it.

``check_job`` validates the model plug-in's ``model_args`` and ``data`` (its ``ModelSchema``), the learning-
rate schedule (config/schedule_rules.py, the rules the ranks use), the batch against the dataset, the
checkpoint interval and the data paths. It raises a ConfigError naming the file line (or the flag) and the
key; it returns warnings for what would run but is probably not meant. ``jobs validate``, every render
(render, submit, resume) and ``hpctrain run`` on the ranks call it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpctrain.config.catalog import find_schema, schema_module_name
from hpctrain.config.common import walltime_seconds
from hpctrain.config.job import JobSpec
from hpctrain.config.origin import locate
from hpctrain.config.plugin import ModelSchema
from hpctrain.config.schedule_rules import schedule_parameters
from hpctrain.config.scheduler_rules import scheduler_rules
from hpctrain.config.site import SiteProfile
from hpctrain.config.walltime import format_hms
from hpctrain.errors import ConfigError, ConfigErrors, HpctrainError
from hpctrain.user_frame import warn_outside


class PreflightWarning(UserWarning):
    """A job that will run, but probably not as meant (the CLI prints it as ``hpctrain: warning: ...``)."""


def check_job(job: JobSpec, site: SiteProfile | None = None, *, local_paths: bool, at_start: bool = False,
              world_size: int | None = None) -> list[str]:
    """Check ``job`` as its ranks will at start; returns warnings, raises ConfigError naming the key.

    ``local_paths``: the data files must exist on this machine (a submission from the machine the job runs
    on, or the ranks themselves); otherwise they are reported as not checked. A job submitted to a ``site``
    runs in its run directory, so its data paths must be absolute; ``at_start`` (the ranks) reads them from
    the current directory and does not repeat what only the submitter needs to hear. ``world_size`` defaults
    to the job's ranks (nodes x ranks_per_node).
    """
    origin = job.origin
    world = world_size or job.resources.ranks
    local_paths = local_paths or (site is not None and scheduler_rules(site.scheduler).runs_here)
    try:
        schema, missing = find_schema(job.model)
    except ConfigError as exc:
        raise locate(exc, origin) from None
    found: list[str] = []
    epoch_steps = None
    if schema is None:
        if not at_start:
            found.append(f"model {job.model}: {missing}, so its model_args and data are checked only when the "
                         f"ranks start; declare SCHEMA in {schema_module_name(job.model)} to check them here")
    else:
        args, data = schema.parse(job.model_args, job.data, origin)
        found += _plugin_checks(schema, args, data, job, world)
        epoch_steps = _epoch_steps(schema, args, data, job, world)
        found += _path_checks(schema.data_paths(args, data), job, local_paths=local_paths, at_start=at_start)
        if local_paths and not at_start:  # the ranks read the files themselves, one reader per node
            found += _file_checks(schema, args, data, job)
    try:
        schedule = schedule_parameters(job.schedule_config(), world, epoch_steps)
    except ConfigError as exc:
        raise locate(exc, origin) from None
    found += _schedule_warnings(job, schedule)
    found += _checkpoint_warnings(job)
    if not at_start:
        found += walltime_warnings(job)
    found += _precision_warnings(job, site)
    return found


def steps_per_epoch(job: JobSpec, world_size: int) -> int | None:
    """Whole steps in one epoch of the training data on ``world_size`` ranks, where the plug-in knows its size."""
    schema, _ = find_schema(job.model)
    if schema is None:
        return None
    args, data = schema.parse(job.model_args, job.data, job.origin)
    return _epoch_steps(schema, args, data, job, world_size)


def warn(messages: Iterable[str]) -> None:
    """Issue each message as a PreflightWarning at the caller's line outside hpctrain (a script's or notebook's
    ``hpctrain.submit(...)``), shown once per line for the same text."""
    for message in messages:
        warn_outside(message, PreflightWarning)


def _plugin_checks(schema: ModelSchema, args: Any, data: Any, job: JobSpec, world: int) -> list[str]:
    try:
        return list(schema.check(args, data, job, world))
    except HpctrainError as exc:
        raise (locate(exc, job.origin) if isinstance(exc, ConfigError) else exc) from None
    except Exception as exc:  # a user's schema hook is broken: name it, not a traceback
        raise locate(ConfigError(f"the schema of {job.model} failed in check(): {type(exc).__name__}: {exc}",
                                 key="model"), job.origin) from None


def _epoch_steps(schema: ModelSchema, args: Any, data: Any, job: JobSpec, world: int) -> int | None:
    size = schema.dataset_size(args, data)
    if size is None:
        return None
    per_step = job.train.batch_per_rank * world
    if size < per_step:
        raise locate(ConfigError(f"{size} samples cannot fill one step of {world} ranks x {job.train.batch_per_rank}",
                                 key="train.batch_per_rank", hint="lower batch_per_rank or use fewer ranks"),
                     job.origin)
    return size // per_step


def _path_checks(paths: dict[str, str], job: JobSpec, *, local_paths: bool, at_start: bool) -> list[str]:
    if not paths:
        return []
    problems = []
    for key, path in paths.items():
        if not at_start and not Path(path).is_absolute():
            problems.append(ConfigError(
                f"{path!r} is a relative path, but the ranks start in the run directory", key=key,
                hint="give an absolute path"))
        elif local_paths and not Path(path).exists():
            problems.append(ConfigError(f"{path} does not exist", key=key,
                                        hint="check the path: the ranks read it when they start"))
    if problems:
        raise locate(ConfigErrors(problems), job.origin)
    if local_paths or at_start:
        return []
    return [f"{', '.join(paths)}: not checked on this machine; the ranks read them where the job runs (submit "
            "without --remote and jobs validate --check-paths check them here)"]


def _file_checks(schema: ModelSchema, args: Any, data: Any, job: JobSpec) -> list[str]:
    try:
        return list(schema.check_files(args, data))
    except ConfigError as exc:
        raise locate(exc, job.origin) from None
    except HpctrainError:
        raise
    except Exception as exc:  # a user's schema hook is broken: name it, not a traceback
        raise locate(ConfigError(f"the schema of {job.model} failed in check_files(): {type(exc).__name__}: {exc}",
                                 key="model"), job.origin) from None


def _schedule_warnings(job: JobSpec, schedule: dict[str, Any]) -> list[str]:
    warmup, steps = schedule["warmup_steps"], job.train.steps
    if schedule["warmup_kind"] != "none" and warmup > steps:
        return [f"train.warmup lasts {warmup} steps, longer than train.steps ({steps}): "
                "the learning rate never reaches its peak"]
    return []


def _checkpoint_warnings(job: JobSpec) -> list[str]:
    # Only an interval the user chose: the default (100) on a short test job is not a mistake.
    every, steps = job.checkpoint.every_steps, job.train.steps
    if "every_steps" in job.checkpoint.model_fields_set and every > steps:
        return [f"checkpoint.every_steps ({every}) is more than train.steps ({steps}): no checkpoint before the "
                "end; a crash loses the whole run (the walltime signal still writes one)"]
    return []


# Time a run needs before the stop signal for training to be most of it: start-up (the interpreter, torch, the
# process group, the data and, after a requeue, the checkpoint read back) takes 20-60 s on an idle node and more
# under load, and Slurm may send the signal up to 60 s before it was asked for (docs/checkpoints.md).
MIN_RUN_BEFORE_SIGNAL_S = 180


def walltime_warnings(job: JobSpec) -> list[str]:
    """A walltime that leaves too little time between start-up and the stop signal: each run (and each requeue)
    then advances a few steps and the requeues run out. Says how much is left and the fix."""
    walltime = int(walltime_seconds(job.resources.walltime))
    lead = job.checkpoint.signal_lead_s
    window = walltime - lead
    if window >= MIN_RUN_BEFORE_SIGNAL_S:
        return []
    enough = format_hms(lead + MIN_RUN_BEFORE_SIGNAL_S)
    return [f"resources.walltime {job.resources.walltime} leaves {window} s per run before the stop signal "
            f"(checkpoint.signal_lead_s {lead} s before the end), and start-up takes 20-60 s of it, more under load: "
            f"a run may checkpoint after a few steps, and each of the {job.checkpoint.max_requeues} requeues "
            f"(checkpoint.max_requeues) advances as little; lengthen the walltime to {enough} or more, or lower "
            f"checkpoint.signal_lead_s"]


# Processor names of CPUs without AMX (bfloat16 convolutions emulated there): AMD, Xeon Phi, Xeons before Sapphire
# Rapids. Matched case-insensitively in a site's node.cpu; a name matching none of them is not judged.
NO_AMX_CPUS = ("amd", "epyc", "xeon phi", "knl", "haswell", "broadwell", "skylake", "cascade lake", "ice lake",
               "grace", "neoverse", "a64fx")


def cpu_has_amx(cpu: str | None, cpuinfo: Path | None = None) -> bool | None:
    """Whether nodes with processor ``cpu`` (a site's ``node.cpu``) have AMX; with ``cpuinfo`` (this machine's
    /proc/cpuinfo, for the local site) its flags decide. None: not known (nothing is said then)."""
    if cpuinfo is not None:
        try:
            flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), None)
        except OSError:
            flags = None
        if flags is not None:
            return "amx_tile" in flags.split()
    if not cpu:
        return None
    name = cpu.lower()
    return False if any(marker in name for marker in NO_AMX_CPUS) else None


def _precision_warnings(job: JobSpec, site: SiteProfile | None) -> list[str]:
    if job.train.precision != "bfloat16" or site is None or job.resources.gpus_per_rank > 0:
        return []
    node = site.node_for(job.resources.queue)
    local = scheduler_rules(site.scheduler).runs_here
    amx = cpu_has_amx(node.cpu, Path("/proc/cpuinfo") if local else None)
    if amx is not False:
        return []
    where = "this machine's CPU has" if local else f"the nodes of site {site.name!r} ({node.cpu}) have"
    return [f"train.precision is bfloat16 but {where} no AMX: bfloat16 convolutions are emulated there, slower "
            "than float32; use precision: auto (bfloat16 only where the hardware has it) or float32"]
