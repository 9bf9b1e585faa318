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

from hpctrain.config.numbers import Bounds, NumberError, check_number
from hpctrain.config.origin import JobOrigin
from hpctrain.config.walltime import format_hms, parse_walltime
from hpctrain.config.yamlio import KeyPath, LoadedYaml
from hpctrain.errors import ConfigError, ConfigErrors, FitError

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
# Bounds checked before a value is converted (``round(inf * 60)`` raises): the job spec's own bounds follow.
NUMBER_BOUNDS: dict[str, Bounds] = {
    "timeout_min": Bounds(None, 366 * 24 * 60), "mem_gb": Bounds(None, float(1 << 20)),
    **{name: Bounds(None, 1_000_000) for name in ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node",
                                                  "signal_lead_s")},
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
        if float in types or int in types:
            try:
                check_number(value, name, NUMBER_BOUNDS.get(name, Bounds()), integer=float not in types)
            except NumberError as exc:
                raise ParameterError(str(exc), key=name) from None
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

    values = {k: v for k, v in values.items() if v is not None}  # None: the parameter's default
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


# The job-spec keys the parameters set, by the name a submitit user knows (walltime: see parameter_for).
_SPEC_KEYS: dict[str, str] = {".".join(p.spec_key): name for name, p in PARAMETERS.items()
                              if p.spec_key is not None and name != "walltime"}
_SPEC_KEYS["checkpoint.max_requeues"] = "max_num_timeout"
# What to do, said with the parameters, where a limit of the site refuses the value of a key.
_FIT_HINTS: dict[str, str] = {
    "resources.nodes": "lower nodes, or pick a queue (parameter queue) or a site (parameter site) that has more",
    "resources.walltime": "lower timeout_min (or walltime), or pick another queue (parameter queue); a "
                          "Checkpointable callable is requeued at the walltime and continues",
    "resources.ranks_per_node": "lower tasks_per_node or cpus_per_task",
    "resources.threads_per_rank": "lower cpus_per_task or tasks_per_node",
    "resources.gpus_per_rank": "set gpus_per_node=0, or pick a GPU queue (parameter queue) or site (parameter site)",
    "resources.memory_gb": "lower mem_gb (GB per node)",
    "resources.account": "set the executor parameter account (AutoExecutor: hpctrain_account=...), or the site "
                         "profile's account",
    "train.comm_backend": "or set comm_backend to auto, mpi or gloo",
}
_KEY_WORD = re.compile(r"\b(?:resources|checkpoint|train)\.[a-z_]+\b")
_REMOVE_KEY = re.compile(r"\bremove ((?:resources|checkpoint|train)\.[a-z_]+)\b")


def parameter_for(key: str, values: Mapping[str, Any]) -> str:
    """The parameter that sets job-spec key ``key`` (``resources.walltime`` -> ``timeout_min`` or ``walltime``);
    the key itself where none does."""
    if key == "resources.walltime" and values.get("walltime") is not None:
        return "walltime"
    return _SPEC_KEYS.get(key, key)


def text_in_parameter_words(text: str, values: Mapping[str, Any]) -> str:
    """``text`` with the job-spec keys it names (``resources.walltime``) replaced by the parameters' names."""
    return _KEY_WORD.sub(lambda m: parameter_for(m.group(0), values), text)


def unset_advice(name: str) -> str:
    """How to unset parameter ``name`` (its default applies again), in both spellings."""
    auto = name if name in GENERIC else f"hpctrain_{name}"
    return f"update_parameters({name}=None)" + ("" if auto == name else f" (AutoExecutor: {auto}=None)")


def _unset_instead_of_remove(hint: str | None, values: Mapping[str, Any]) -> str | None:
    """A hint to remove a job-spec key (``remove resources.queue for this site``) said as what a submitit user
    does: unset the parameter that set it, and how."""
    match = _REMOVE_KEY.search(hint or "")
    name = parameter_for(match.group(1), values) if match else None
    if hint is None or match is None or name not in PARAMETERS:
        return hint
    return f"{hint[:match.start()]}unset {name}{hint[match.end():]}: {unset_advice(name)}"


def in_parameter_words(error: ConfigError, values: Mapping[str, Any]) -> ConfigError:
    """``error`` (of the job spec the parameters made) said with the parameters' names: its key, the job-spec
    keys in its text, and for a limit of the site, what to change."""
    if isinstance(error, ConfigErrors):
        return ConfigErrors([in_parameter_words(e, values) for e in error.errors])

    def words(text: str | None) -> str | None:
        return None if text is None else text_in_parameter_words(text, values)

    key = error.key
    hint = _FIT_HINTS.get(key or "", error.hint) if isinstance(error, FitError) else error.hint
    name = parameter_for(key, values) if key else None
    hint = _unset_instead_of_remove(hint, values)
    if name is not None and values.get(name) == "":
        hint = f"to go back to the default, unset {name}: {unset_advice(name)}"
    if name is not None and error.path and error.path.startswith(f"parameter {name}="):
        name = None  # the place already names the parameter
    return type(error)(words(error.message) or "", path=error.path, line=error.line, key=name, hint=words(hint))


class IgnoredParameterWarning(UserWarning):
    """Parameters of another submitit executor (``slurm_*``) that AutoExecutor drops with cluster="hpctrain"."""


# SlurmExecutor's parameters -> the hpctrain parameter (AutoExecutor's spelling) or where the setting lives.
_SLURM_PARAMETERS: dict[str, str] = {
    "partition": "hpctrain_queue", "account": "hpctrain_account", "job_name": "name", "mem": "mem_gb",
    "ntasks_per_node": "tasks_per_node", "signal_delay_s": "hpctrain_signal_lead_s", "nodes": "nodes",
    "cpus_per_task": "cpus_per_task", "gpus_per_node": "gpus_per_node", "num_gpus": "gpus_per_node",
    "timeout_min": "timeout_min", "mem_gb": "mem_gb", "tasks_per_node": "tasks_per_node", "name": "name",
    "stderr_to_stdout": "stderr_to_stdout", "qos": "hpctrain_queue (a queue of the site profile names its qos)",
    "setup": "the site profile's environment (modules, setup, venv)", "srun_args": "the site profile's launcher_args",
    "use_srun": "the site profile's launcher",
    "array_parallelism": "nothing: arrays run as wide as the scheduler lets them",
    "max_num_timeout": "hpctrain_max_num_timeout",
}
_SLURM_ELSEWHERE = "a directive in the site profile (its directives, or a queue's)"


def slurm_equivalent(name: str, value: object) -> str:
    """What to write instead of ``slurm_<name>=value`` with cluster="hpctrain"."""
    if name == "time":
        return f"hpctrain_walltime={value!r}" if isinstance(value, str) else f"timeout_min={value!r}"
    ours = _SLURM_PARAMETERS.get(name, _SLURM_ELSEWHERE)
    return f"{ours}={value!r}" if re.fullmatch(r"[a-z_]+", ours) else ours


def ignored_slurm_parameters(given: Mapping[str, Any]) -> str | None:
    """The warning for the ``slurm_*`` names among ``given`` (None if there are none)."""
    slurm = {k[len("slurm_"):]: v for k, v in given.items() if k.startswith("slurm_")}
    if not slurm:
        return None
    said = "; ".join(f"slurm_{k}={v!r}: use {slurm_equivalent(k, v)}" for k, v in sorted(slurm.items()))
    return (f'AutoExecutor ignores SlurmExecutor\'s parameters with cluster="hpctrain" ({said}). '
            "hpctrain's parameters: hpctrain.submitit_plugin.params.PARAMETERS (docs/submitit.md)")


def load_site_value(site: object) -> SiteProfile:
    """The site profile a ``site`` parameter names (a SiteProfile is used as it is)."""
    from hpctrain.config.site import SiteProfile, load_site

    if isinstance(site, SiteProfile):
        return site
    if site is not None and not isinstance(site, str | os.PathLike):
        raise ParameterError(f"site={site!r}: expected a profile name, a YAML file or a SiteProfile", key="site")
    return load_site(None if site is None else os.fspath(site))
