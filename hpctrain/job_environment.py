"""The job-side half of a scheduler or launcher plug-in: which environment variables say, inside the allocation, where
a process sits (rank, size, local rank and size, node index and count) and which job it belongs to (job id, node
list, array index, restart count, the signal sent before the walltime).

A back-end names its ``JobEnvironment`` by import path (``module:attribute``); the rendered script of a plug-in
hpctrain does not ship exports that path as ``HPCTRAIN_JOB_ENVIRONMENT``, and each rank imports just that module:
no entry-point scan and no pydantic on a rank. hpctrain's own back-ends' environments are ``BUILTIN`` below.
Pure Python: it is read on every rank of a job of thousands of nodes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hpctrain.node_lists import expand_slurm_nodelist, read_pbs_nodefile

# Exported by a rendered script whose scheduler or launcher is a plug-in: the import paths of their job
# environments, comma-separated, innermost (the launcher's) first.
JOB_ENVIRONMENT_ENV = "HPCTRAIN_JOB_ENVIRONMENT"
STOP_SIGNAL_ENV = "HPCTRAIN_STOP_SIGNAL"  # the job's checkpoint signal, exported by every rendered script


@dataclass(frozen=True)
class RankVariables:
    """The variables one launcher sets for each process it starts. Each field lists candidates, first present wins;
    ``marker`` is set only under this launcher."""

    name: str
    marker: str
    rank: tuple[str, ...]
    size: tuple[str, ...]
    local_rank: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    node_rank: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobEnvironment:
    """What one back-end sets in its jobs. A launcher fills ``ranks``; a scheduler the job fields. ``node_list``
    names variables in Slurm's hostlist syntax (``nid[001-004]``), ``node_file`` variables naming a file of one
    host per line; a back-end whose node list reads otherwise overrides ``nodes``. ``array_job_id`` with
    ``array_index`` make the id hpctrain records, as ``array_id_format`` writes it (None: ``job_id`` already
    names the task). ``node_name``: the variable naming, in each process, the node it runs on as the scheduler
    names it (else the host name is used). ``walltime_signal``: the
    signal the scheduler sends before the walltime whatever the job asked (None: the job's checkpoint signal,
    ``HPCTRAIN_STOP_SIGNAL``, sent by the scheduler where the script asks it or by the script's own timer)."""

    name: str
    ranks: tuple[RankVariables, ...] = ()
    job_id: tuple[str, ...] = ()
    node_list: tuple[str, ...] = ()
    node_file: tuple[str, ...] = ()
    array_job_id: tuple[str, ...] = ()
    array_index: tuple[str, ...] = ()
    array_id_format: str | None = "{job}_{index}"
    restart_count: tuple[str, ...] = ()
    walltime_signal: str | None = None
    node_name: tuple[str, ...] = ()

    def nodes(self, environ: Mapping[str, str]) -> list[str] | None:
        """The job's hosts, None when this back-end's variables are not set."""
        listed = first_value(environ, self.node_list)
        if listed:
            return expand_slurm_nodelist(listed)
        path = first_value(environ, self.node_file)
        if path and Path(path).is_file():
            return read_pbs_nodefile(path)
        return None

    def array_task(self, environ: Mapping[str, str]) -> tuple[str, str] | None:
        """(array job id, index) in an array task of this back-end, else None."""
        job, index = first_value(environ, self.array_job_id), first_value(environ, self.array_index)
        return (job, index) if job and index else None


def first_value(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` set to something non-empty."""
    for name in names:
        if environ.get(name):
            return environ[name]
    return None


# Sources: torch elastic docs (torchrun), Open MPI 5 docs "Environment variables set for MPI applications",
# MPICH/Intel hydra docs (MPI_LOCALRANKID, MPI_LOCALNRANKS), Slurm's mpi/cray_shasta plugin (PALS_* and
# PMI_LOCAL_RANK/PMI_LOCAL_SIZE; PBS's PALS mpiexec sets the same names), Cray ALPS (ALPS_APP_PE), Slurm
# srun output environment (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE).
TORCHRUN = JobEnvironment("torchrun", ranks=(RankVariables(
    "torchrun", "TORCHELASTIC_RUN_ID", rank=("RANK",), size=("WORLD_SIZE",), local_rank=("LOCAL_RANK",),
    local_size=("LOCAL_WORLD_SIZE",), node_rank=("GROUP_RANK",), nodes=("GROUP_WORLD_SIZE",)),))
OPENMPI = JobEnvironment("openmpi", ranks=(RankVariables(
    "openmpi", "OMPI_COMM_WORLD_RANK", rank=("OMPI_COMM_WORLD_RANK",), size=("OMPI_COMM_WORLD_SIZE",),
    local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",), local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",)),))
PALS = JobEnvironment("pals", ranks=(RankVariables(
    "pals", "PALS_RANKID", rank=("PALS_RANKID", "PMI_RANK"), size=("PMI_SIZE", "PALS_SIZE"),
    local_rank=("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"), local_size=("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
    node_rank=("PALS_NODEID",)),))
ALPS = JobEnvironment("alps", ranks=(RankVariables(
    "alps", "ALPS_APP_PE", rank=("ALPS_APP_PE", "PMI_RANK"), size=("PMI_SIZE",),
    local_rank=("PMI_LOCAL_RANK",), local_size=("PMI_LOCAL_SIZE", "HPCTRAIN_RANKS_PER_NODE")),))
HYDRA = JobEnvironment("hydra", ranks=(RankVariables(
    "hydra", "MPI_LOCALRANKID", rank=("PMI_RANK",), size=("PMI_SIZE",),
    local_rank=("MPI_LOCALRANKID",), local_size=("MPI_LOCALNRANKS",)),))
SLURM = JobEnvironment(
    "slurm", ranks=(RankVariables(
        "slurm", "SLURM_STEP_ID", rank=("SLURM_PROCID",), size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        local_rank=("SLURM_LOCALID",), local_size=("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"),
        node_rank=("SLURM_NODEID",), nodes=("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")),),
    job_id=("SLURM_JOB_ID",), node_list=("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    array_job_id=("SLURM_ARRAY_JOB_ID",), array_index=("SLURM_ARRAY_TASK_ID",),
    restart_count=("SLURM_RESTART_COUNT",), node_name=("SLURMD_NODENAME",))
PBS = JobEnvironment("pbs", job_id=("PBS_JOBID",), node_file=("PBS_NODEFILE",), array_job_id=("PBS_ARRAY_ID",),
                     array_index=("PBS_ARRAY_INDEX",), array_id_format=None)  # PBS_JOBID is 12[3].server
COBALT = JobEnvironment("cobalt", job_id=("COBALT_JOBID",), node_file=("COBALT_NODEFILE",))
# torchrun-style variables set by hand or by another tool (no TORCHELASTIC_RUN_ID): hpctrain's local launcher sets
# exactly these (``torchrun_variables``).
LOCAL = JobEnvironment("local", ranks=(RankVariables(
    "env", "WORLD_SIZE", rank=("RANK",), size=("WORLD_SIZE",), local_rank=("LOCAL_RANK",),
    local_size=("LOCAL_WORLD_SIZE",), node_rank=("GROUP_RANK", "NODE_RANK"), nodes=("GROUP_WORLD_SIZE",)),))

# Order matters: a launcher started inside another's allocation inherits the outer variables (mpirun or torchrun
# inside a Slurm batch script sees SLURM_*), so the innermost launchers come first. A plug-in's environments
# (HPCTRAIN_JOB_ENVIRONMENT) come right after torchrun, which a user may start inside any allocation.
BUILTIN: tuple[JobEnvironment, ...] = (TORCHRUN, OPENMPI, PALS, ALPS, HYDRA, SLURM, PBS, COBALT, LOCAL)
BUILTIN_PATHS = frozenset(f"{__name__}:{env.name.upper()}" for env in BUILTIN)


@cache
def load_job_environment(path: str) -> JobEnvironment:
    """The ``JobEnvironment`` at ``module:attribute``; a ValueError naming the path when it is not one."""
    module_name, _, attribute = path.strip().partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{JOB_ENVIRONMENT_ENV}: cannot load {path!r}: {exc}") from None
    if not isinstance(found, JobEnvironment):
        raise ValueError(f"{JOB_ENVIRONMENT_ENV}: {path!r} is not a JobEnvironment")
    return found


def job_environments(environ: Mapping[str, str]) -> tuple[JobEnvironment, ...]:
    """Every job environment to ask, in precedence order: torchrun, the plug-ins' this job's script names, the
    built-ins."""
    named = environ.get(JOB_ENVIRONMENT_ENV, "")
    plugins = tuple(load_job_environment(p) for p in named.split(",") if p.strip() and p.strip() not in BUILTIN_PATHS)
    return (BUILTIN[0], *plugins, *BUILTIN[1:])


def rank_variables(environ: Mapping[str, str]) -> tuple[RankVariables, ...]:
    """Every launcher's rank variables, in precedence order."""
    return tuple(row for env in job_environments(environ) for row in env.ranks)


def stop_signal(environ: Mapping[str, str]) -> str | None:
    """The signal this job gets before its walltime: a back-end's own, else the one its script names."""
    for env in job_environments(environ):
        if env.walltime_signal and first_value(environ, env.job_id):
            return env.walltime_signal
    return environ.get(STOP_SIGNAL_ENV) or None


def exported_paths(*paths: str) -> str:
    """The value of HPCTRAIN_JOB_ENVIRONMENT for a script whose back-ends name ``paths`` ("" when all are built-in,
    so a built-in back-end's script does not carry the line)."""
    return ",".join(dict.fromkeys(p for p in paths if p and p not in BUILTIN_PATHS))
