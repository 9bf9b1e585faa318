"""The executor's parameters, from one table: their types, their meaning, and the job spec they make.

``update_parameters`` and AutoExecutor's ``hpctrain_<name>=`` accept exactly the names of ``PARAMETERS``; any
other name gets the list of valid ones. The values become an hpctrain ``JobSpec`` (resources, checkpoint,
environment) whose errors name the parameter that set the bad value.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpctrain.config.origin import JobOrigin
from hpctrain.config.walltime import format_hms, parse_walltime
from hpctrain.config.yamlio import KeyPath, LoadedYaml
from hpctrain.errors import ConfigError

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import SiteProfile

# The job spec's "model" names the runner; its schema (runner_schema.py) declares no model_args and no data.
RUNNER_MODEL = "hpctrain.submitit_plugin.runner:main"
DEFAULT_WALLTIME = "01:00:00"
DEFAULT_NAME = "submitit"
MAX_SIGNAL_LEAD_S = 120  # hpctrain's default lead; shorter walltimes get a quarter of theirs (at least 10 s)


class ParameterError(ConfigError, ValueError):
    """A bad executor parameter (a ValueError too, as submitit's executors raise for parameters)."""


@dataclass(frozen=True)
class Parameter:
    """One parameter: the Python types it takes, what it means, and the job-spec key it sets (if any)."""

    types: tuple[type, ...]
    help: str
    spec_key: KeyPath | None = None


PARAMETERS: dict[str, Parameter] = {
    "site": Parameter((str, os.PathLike, object), "site profile: a name, a YAML file or a SiteProfile "
                      "(default: local)"),
    "remote": Parameter((str,), "ssh destination of the site's login node, e.g. alice@polaris.alcf.anl.gov "
                        "(default: submit from this machine)"),
    "ssh_config": Parameter((str,), "ssh config file for remote (default: ~/.ssh/config)"),
    "run_root": Parameter((str,), "where run directories go on the site (default: the profile's remote_root, "
                          "else $HPCTRAIN_RUNS, else ./runs)"),
    "python": Parameter((str,), "interpreter that runs the callable on the compute nodes (default: the "
                        "profile's, else this one when submitting from this machine, else python3)"),
    "name": Parameter((str,), "job name (default: the callable's name)", ("name",)),
    "nodes": Parameter((int,), "nodes", ("resources", "nodes")),
    "tasks_per_node": Parameter((int,), "tasks (ranks) per node: each runs the callable",
                                ("resources", "ranks_per_node")),
    "cpus_per_task": Parameter((int,), "CPU threads per task", ("resources", "threads_per_rank")),
    "gpus_per_node": Parameter((int,), "GPUs per node, shared out evenly between its tasks",
                               ("resources", "gpus_per_rank")),
    "mem_gb": Parameter((int, float), "memory per node in GB", ("resources", "memory_gb")),
    "timeout_min": Parameter((int, float), "walltime in minutes", ("resources", "walltime")),
    "walltime": Parameter((str,), "walltime as HH:MM:SS (instead of timeout_min)", ("resources", "walltime")),
    "queue": Parameter((str,), "queue or partition (default: the profile's default queue)", ("resources", "queue")),
    "account": Parameter((str,), "account or project to charge", ("resources", "account")),
    "signal": Parameter((str,), "checkpoint signal sent before the walltime (default: USR2)",
                        ("checkpoint", "signal")),
    "signal_lead_s": Parameter((int,), "seconds before the walltime the checkpoint signal comes (default: 120, "
                               "a quarter of shorter walltimes)", ("checkpoint", "signal_lead_s")),
    "comm_backend": Parameter((str,), "the site's communication set-up the job gets: auto, mpi, gloo or nccl "
                              "(default: auto, the profile's)", ("train", "comm_backend")),
    "env": Parameter((dict,), "extra environment variables for the tasks", ("env",)),
    "stderr_to_stdout": Parameter((bool,), "write each task's stderr into its stdout log"),
}
# AutoExecutor's shared parameters keep their names here.
GENERIC = ("name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node",
           "stderr_to_stdout")


def parameter_list() -> str:
    return "\n".join(f"  - {name}: {p.help}" for name, p in sorted(PARAMETERS.items()))


def check_values(values: Mapping[str, Any]) -> None:
    """Refuse unknown names (listing the valid ones) and values of the wrong type."""
    unknown = sorted(set(values) - set(PARAMETERS))
    if unknown:
        guesses = [g for u in unknown for g in difflib.get_close_matches(u, list(PARAMETERS), n=1, cutoff=0.6)]
        hint = (f"did you mean {', '.join(map(repr, guesses))}? " if guesses else "") + "valid parameters are:\n" \
            + parameter_list()
        raise ParameterError(f"Unavailable parameter(s): {unknown}", hint=hint)
    for name, value in values.items():
        types = PARAMETERS[name].types
        if value is None or object in types:
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise ParameterError(f"{name}={value!r}: expected {wanted}, got {type(value).__name__}", key=name)
    if "walltime" in values and "timeout_min" in values:
        raise ParameterError("walltime and timeout_min both set the walltime", key="walltime",
                             hint="give one of them")


def default_name(function: object) -> str:
    """A job name from a callable: its name (or its class's) as letters, digits, ``_.-``."""
    target = getattr(function, "func", function)  # functools.partial
    raw = getattr(target, "__name__", None) or type(target).__name__
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).lstrip("_.-")[:64].rstrip("_.-")
    return name or DEFAULT_NAME


def _walltime(values: Mapping[str, Any]) -> str | int:
    if values.get("walltime") is not None:
        return str(values["walltime"])
    minutes = values.get("timeout_min")
    if minutes is None:
        return DEFAULT_WALLTIME
    return format_hms(round(minutes * 60)) if minutes > 0 else minutes


def _lead(walltime: str | int) -> int:
    try:
        seconds = parse_walltime(walltime)
    except (ValueError, ConfigError):
        return MAX_SIGNAL_LEAD_S  # the spec's validation names the walltime
    return min(MAX_SIGNAL_LEAD_S, max(10, seconds // 4))


def build_job(values: Mapping[str, Any], *, max_requeues: int, name: str) -> JobSpec:
    """The job spec the parameters make (validated; errors name the parameter that set the value)."""
    from hpctrain.config.job import JobSpec
    from hpctrain.config.validation import validate_model

    tasks = values.get("tasks_per_node", 1)
    gpus = values.get("gpus_per_node", 0)
    if isinstance(tasks, int) and tasks > 0 and gpus % tasks:
        raise ParameterError(f"gpus_per_node={gpus} is not a multiple of tasks_per_node={tasks}", key="gpus_per_node",
                             hint="hpctrain gives every task the same number of GPUs")
    walltime = _walltime(values)
    resources: dict[str, Any] = {"nodes": values.get("nodes", 1), "ranks_per_node": tasks,
                                 "threads_per_rank": values.get("cpus_per_task", 1),
                                 "gpus_per_rank": gpus // tasks if isinstance(tasks, int) and tasks > 0 else gpus,
                                 "walltime": walltime}
    for key, spec_key in (("queue", "queue"), ("account", "account"), ("mem_gb", "memory_gb")):
        if values.get(key) is not None:
            resources[spec_key] = values[key]
    checkpoint = {"max_requeues": max_requeues, "signal": values.get("signal", "USR2"),
                  "signal_lead_s": values.get("signal_lead_s", _lead(walltime))}
    data = {"name": values.get("name") or name, "description": "a Python callable submitted through submitit",
            "model": RUNNER_MODEL,
            "train": {"steps": 1, "batch_per_rank": 1, "lr": 1.0, "comm_backend": values.get("comm_backend", "auto")},
            "resources": resources, "checkpoint": checkpoint, "env": dict(values.get("env") or {})}
    origins: dict[KeyPath, str] = {("checkpoint", "max_requeues"): f"max_num_timeout={max_requeues!r}"}
    for key, value in values.items():
        spec_key = PARAMETERS[key].spec_key
        if spec_key is not None and value is not None:
            origins[spec_key] = f"parameter {key}={value!r}"
    loaded = LoadedYaml(data, {}, "executor parameters")
    job = validate_model(JobSpec, loaded, data, origins)
    job._origin = JobOrigin(loaded, origins)
    return job


def load_site_value(site: object) -> SiteProfile:
    """The site profile a ``site`` parameter names (a SiteProfile is used as it is)."""
    from hpctrain.config.site import SiteProfile, load_site

    if isinstance(site, SiteProfile):
        return site
    if site is not None and not isinstance(site, str | os.PathLike):
        raise ParameterError(f"site={site!r}: expected a profile name, a YAML file or a SiteProfile", key="site")
    return load_site(None if site is None else os.fspath(site))
