"""Rank, size and node layout of this process, read from the launcher's environment variables.

The job environments (job_environment.py: the built-in back-ends' and the plug-in this job's script names) say
which variables each launcher sets; the first whose marker variable is present wins. Pure Python on purpose: no
torch/mpi4py import, so it is cheap and testable anywhere.
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.errors import RuntimeFailure
from hpctrain.job_environment import LOCAL, RankVariables, first_value, job_environments, rank_variables

# Set by a rendered script that stages to node-local storage, for the ranks: this job's directory there (read by
# config/staging.py, which stages into it, and runtime/counting/counters.py, which counts opens under it as node-local).
NODE_LOCAL_ENV = "HPCTRAIN_NODE_LOCAL"


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job. ``master_addr``/``master_port`` only when the launcher says."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    node_rank: int
    nodes: int
    launcher: str
    master_addr: str | None = None
    master_port: int | None = None


# hpctrain's local launcher sets exactly the torchrun-style variables of the ``local`` job environment.
ENV_ROW = LOCAL.ranks[0]


def torchrun_variables(rank: int, size: int, local_rank: int, local_size: int) -> dict[str, str]:
    """The variables a launcher without a process manager sets for one rank (the ``env`` row's first names)."""
    return {ENV_ROW.rank[0]: str(rank), ENV_ROW.size[0]: str(size), ENV_ROW.local_rank[0]: str(local_rank),
            ENV_ROW.local_size[0]: str(local_size)}


def rank_label(environ: Mapping[str, str]) -> str:
    """This process's rank as text for log lines, "?" when the launcher's variables cannot be read."""
    try:
        return str(detect_launch_env(environ).rank)
    except RuntimeFailure:
        return "?"


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return name, value
    return None


def _tasks_on_node(spec: str, node_rank: int) -> int:
    """Slurm's ``2(x3),1`` per-node task counts -> the count on node ``node_rank``."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(spec)
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[min(node_rank, len(counts) - 1)]


def _int(environ: Mapping[str, str], row: RankVariables, field: str, spec: tuple[str, str]) -> int:
    name, value = spec
    try:
        if field == "local_size" and "TASKS_PER_NODE" in name:
            node = _first(environ, row.node_rank)
            return _tasks_on_node(value, int(node[1]) if node else 0)
        return int(value)
    except ValueError:
        raise RuntimeFailure(
            f"launcher {row.name}: environment variable {name}={value!r} is not an integer",
            hint="the launcher set a malformed value; unset it or launch with srun/mpiexec/torchrun",
        ) from None


def detect_launch_env(environ: Mapping[str, str]) -> LaunchEnv:
    """Rank/size/local rank/node of this process from ``environ`` (pass ``os.environ``)."""
    for row in rank_variables(environ):
        if row.marker not in environ:
            continue
        got: dict[str, int] = {}
        for field in ("rank", "size", "local_rank", "local_size", "node_rank", "nodes"):
            spec = _first(environ, getattr(row, field))
            if spec is not None:
                got[field] = _int(environ, row, field, spec)
        if "rank" not in got or "size" not in got:
            raise RuntimeFailure(
                f"launcher {row.name} detected ({row.marker} is set) but rank/size variables "
                f"{'/'.join(row.rank)} and {'/'.join(row.size)} are missing",
                hint=f"unset {row.marker} or launch the job with {row.name}",
            )
        rank, size = got["rank"], got["size"]
        local_size = got.get("local_size") or _local_size_fallback(environ, size, got.get("nodes"))
        # ALPS without PMI_LOCAL_RANK: ranks are placed in blocks of ranks-per-node (aprun -N).
        local_rank = got.get("local_rank", rank % local_size)
        node_rank = got.get("node_rank", rank // local_size)
        nodes = got.get("nodes") or _nodes_fallback(environ, size, local_size)
        if not 0 <= rank < size or not 0 <= local_rank < local_size:
            raise RuntimeFailure(
                f"launcher {row.name}: rank {rank}/size {size}, local rank {local_rank}/local size "
                f"{local_size} are inconsistent",
                hint="check the launcher's variables (env | grep -E 'RANK|SIZE')",
            )
        master_addr = environ.get("MASTER_ADDR") or None
        port = environ.get("MASTER_PORT")
        return LaunchEnv(
            rank=rank, size=size, local_rank=local_rank, local_size=local_size, node_rank=node_rank,
            nodes=max(nodes, node_rank + 1), launcher=row.name, master_addr=master_addr,
            master_port=int(port) if port and port.isdigit() else None,
        )
    return LaunchEnv(rank=0, size=1, local_rank=0, local_size=1, node_rank=0, nodes=1, launcher="none")


def _local_size_fallback(environ: Mapping[str, str], size: int, node_count: int | None) -> int:
    """Ranks per node where the launcher does not say: the size over the launcher's node count, else over the
    scheduler's nodes."""
    if node_count:
        return math.ceil(size / node_count)
    nodes = scheduler_nodes(environ)
    return math.ceil(size / len(nodes)) if nodes else size


def _nodes_fallback(environ: Mapping[str, str], size: int, local_size: int) -> int:
    nodes = scheduler_nodes(environ)
    return len(nodes) if nodes else math.ceil(size / local_size)


def scheduler_nodes(environ: Mapping[str, str]) -> list[str]:
    """The job's hosts from the first scheduler whose variables are set (SLURM_JOB_NODELIST, PBS_NODEFILE, ...),
    or [] outside a job."""
    for env in job_environments(environ):
        nodes = env.nodes(environ)
        if nodes is not None:
            return nodes
    return []


def scheduler_job_id(environ: Mapping[str, str]) -> str | None:
    """The scheduler's job id (SLURM_JOB_ID, PBS_JOBID, COBALT_JOBID, a plug-in's), used to derive a rendezvous
    port."""
    for env in job_environments(environ):
        for name in env.job_id:
            if environ.get(name):
                return environ[name]
    return None


def job_id_of(environ: Mapping[str, str]) -> str:
    """The scheduler's id of this job as hpctrain records it (``M_I`` for task I of Slurm array M)."""
    for env in job_environments(environ):
        task = env.array_task(environ)
        if task is not None and env.array_id_format is not None:
            return env.array_id_format.format(job=task[0], index=task[1])
    return scheduler_job_id(environ) or environ.get("HPCTRAIN_LOCAL_JOB_ID") or "unknown"


def restarts_of(environ: Mapping[str, str]) -> int:
    """How many times this job was requeued (a scheduler that counts them says; the other back-ends' scripts pass
    the count in HPCTRAIN_RESTART_COUNT)."""
    for env in job_environments(environ):
        value = first_value(environ, env.restart_count) or ""
        if value.isdigit():
            return int(value)
    value = environ.get("HPCTRAIN_RESTART_COUNT", "")
    return int(value) if value.isdigit() else 0


def node_name(environ: Mapping[str, str]) -> str:
    """This node's name as its scheduler knows it (what an excluded-node list names: Slurm's SLURMD_NODENAME), else
    its host name."""
    for env in job_environments(environ):
        name = first_value(environ, env.node_name)
        if name:
            return name
    return socket.gethostname()
