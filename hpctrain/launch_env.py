"""Rank, size and node layout of this process, read from the launcher's environment variables.

One table (``LAUNCHERS``) says which variables each launcher sets; the first row whose marker variable is
present wins. Pure Python on purpose: no torch/mpi4py import, so it is cheap and testable anywhere.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import RuntimeFailure

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


@dataclass(frozen=True)
class LauncherRow:
    """The variables one launcher sets. Each field lists candidates, first present wins."""

    name: str
    marker: str  # present only under this launcher (checked in table order)
    rank: tuple[str, ...]
    size: tuple[str, ...]
    local_rank: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    node_rank: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()


# Order matters: a launcher started inside another's allocation inherits the outer variables (mpirun or
# torchrun inside a Slurm batch script sees SLURM_*), so the innermost launchers come first.
# Sources: torch elastic docs (torchrun), Open MPI 5 docs "Environment variables set for MPI applications",
# MPICH/Intel hydra docs (MPI_LOCALRANKID, MPI_LOCALNRANKS), Slurm's mpi/cray_shasta plugin (PALS_* and
# PMI_LOCAL_RANK/PMI_LOCAL_SIZE; PBS's PALS mpiexec sets the same names), Cray ALPS (ALPS_APP_PE), Slurm
# srun output environment (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE).
LAUNCHERS: tuple[LauncherRow, ...] = (
    LauncherRow(
        "torchrun", "TORCHELASTIC_RUN_ID",
        rank=("RANK",), size=("WORLD_SIZE",), local_rank=("LOCAL_RANK",),
        local_size=("LOCAL_WORLD_SIZE",), node_rank=("GROUP_RANK",), nodes=("GROUP_WORLD_SIZE",),
    ),
    LauncherRow(
        "openmpi", "OMPI_COMM_WORLD_RANK",
        rank=("OMPI_COMM_WORLD_RANK",), size=("OMPI_COMM_WORLD_SIZE",),
        local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",), local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    LauncherRow(
        "pals", "PALS_RANKID",
        rank=("PALS_RANKID", "PMI_RANK"), size=("PMI_SIZE", "PALS_SIZE"),
        local_rank=("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"), local_size=("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
        node_rank=("PALS_NODEID",),
    ),
    LauncherRow(
        "alps", "ALPS_APP_PE",
        rank=("ALPS_APP_PE", "PMI_RANK"), size=("PMI_SIZE",),
        local_rank=("PMI_LOCAL_RANK",), local_size=("PMI_LOCAL_SIZE", "HPCTRAIN_RANKS_PER_NODE"),
    ),
    LauncherRow(
        "hydra", "MPI_LOCALRANKID",
        rank=("PMI_RANK",), size=("PMI_SIZE",),
        local_rank=("MPI_LOCALRANKID",), local_size=("MPI_LOCALNRANKS",),
    ),
    LauncherRow(
        "slurm", "SLURM_STEP_ID",
        rank=("SLURM_PROCID",), size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        local_rank=("SLURM_LOCALID",), local_size=("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"),
        node_rank=("SLURM_NODEID",), nodes=("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    ),
    # torchrun-style variables set by hand or by another tool (no TORCHELASTIC_RUN_ID): hpctrain's local
    # launcher sets exactly these (``torchrun_variables``).
    LauncherRow(
        "env", "WORLD_SIZE",
        rank=("RANK",), size=("WORLD_SIZE",), local_rank=("LOCAL_RANK",),
        local_size=("LOCAL_WORLD_SIZE",), node_rank=("GROUP_RANK", "NODE_RANK"), nodes=("GROUP_WORLD_SIZE",),
    ),
)
ENV_ROW = LAUNCHERS[-1]


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


def _int(environ: Mapping[str, str], row: LauncherRow, field: str, spec: tuple[str, str]) -> int:
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
    for row in LAUNCHERS:
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
        local_size = got.get("local_size") or _local_size_fallback(environ, size)
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


def _local_size_fallback(environ: Mapping[str, str], size: int) -> int:
    nodes = scheduler_nodes(environ)
    return math.ceil(size / len(nodes)) if nodes else size


def _nodes_fallback(environ: Mapping[str, str], size: int, local_size: int) -> int:
    nodes = scheduler_nodes(environ)
    return len(nodes) if nodes else math.ceil(size / local_size)


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """``nid[001-003,007],login1`` -> ``['nid001', 'nid002', 'nid003', 'nid007', 'login1']``.

    Handles zero padding, several bracket groups in one name (``r[1-2]n[01-02]``) and comma lists.
    """
    names: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        if item:
            names += _expand_one(item)
    return names


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    out: list[str] = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad range {rng!r} in node list {item!r}")
        width = len(lo)
        rests = _expand_one(tail)
        for n in range(int(lo), int(hi or lo) + 1):
            out += [head + str(n).zfill(width) + rest for rest in rests]
    return out


def read_pbs_nodefile(path: str | Path) -> list[str]:
    """Unique host names of a PBS node file, in first-seen order (PBS lists a host once per rank/cpu)."""
    seen: dict[str, None] = {}
    for line in Path(path).read_text().splitlines():
        host = line.strip()
        if host and not host.startswith("#"):
            seen.setdefault(host, None)
    return list(seen)


def scheduler_nodes(environ: Mapping[str, str]) -> list[str]:
    """The job's hosts from the scheduler (SLURM_JOB_NODELIST, else PBS_NODEFILE), or [] outside a job."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if nodelist:
        return expand_slurm_nodelist(nodelist)
    nodefile = environ.get("PBS_NODEFILE") or environ.get("COBALT_NODEFILE")
    if nodefile and Path(nodefile).is_file():
        return read_pbs_nodefile(nodefile)
    return []


def scheduler_job_id(environ: Mapping[str, str]) -> str | None:
    """The scheduler's job id (Slurm, PBS, Cobalt), used to derive a rendezvous port."""
    for name in ("SLURM_JOB_ID", "PBS_JOBID", "COBALT_JOBID"):
        if environ.get(name):
            return environ[name]
    return None
