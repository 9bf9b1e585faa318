"""Where the ranks of a torch.distributed group meet: rank 0's TCPStore address, found without a hand-typed
address (torchrun's variables, an MPI broadcast, the scheduler's node list), and whether MPI can bootstrap it.
"""

from __future__ import annotations

import socket
import zlib
from collections.abc import Mapping
from typing import Any

from hpctrain.errors import RuntimeFailure
from hpctrain.launch_env import LaunchEnv, scheduler_job_id, scheduler_nodes
from hpctrain.runtime.comm.mpi_env import import_mpi
from hpctrain.runtime.comm.timeouts import RENDEZVOUS_MIN_S


def mpi_bootstrap(env: LaunchEnv, timeout_s: float) -> Any:
    """The MPI module when the ranks can bootstrap over MPI (an MPI launcher started all of them and no
    MASTER_ADDR/MASTER_PORT names a store to meet at), else None."""
    if env.size < 2 or (env.master_addr and env.master_port):
        return None
    return import_mpi(timeout_s=timeout_s) if _mpi_world_size_if_launched(env, timeout_s) == env.size else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_from_job_id(job_id: str) -> int:
    """A port in [20000, 60000) every rank derives alike from the scheduler's job id (no typed address)."""
    return 20000 + zlib.crc32(job_id.encode()) % 40000


def _mpi_world_size_if_launched(env: LaunchEnv, timeout_s: float) -> int:
    if env.launcher not in ("hydra", "openmpi", "pals", "alps", "slurm"):
        return 0
    try:
        MPI = import_mpi(timeout_s=timeout_s)
    except ImportError:
        return 0
    return MPI.COMM_WORLD.Get_size()


def rendezvous_address(env: LaunchEnv, environ: Mapping[str, str],
                       timeout_s: float = RENDEZVOUS_MIN_S) -> tuple[str, int]:
    """Where rank 0's TCPStore listens, found without a hand-typed address.

    Order: MASTER_ADDR/MASTER_PORT (torchrun); rank 0's hostname and a free port broadcast over MPI when
    the job was started by an MPI launcher (within ``timeout_s``); the first node of the scheduler's node list
    with a port derived from the job id; localhost for a single process.
    """
    if env.master_addr and env.master_port:
        return env.master_addr, env.master_port
    if env.size > 1 and _mpi_world_size_if_launched(env, timeout_s) == env.size:
        return _address_over_mpi(import_mpi(), timeout_s)
    nodes = scheduler_nodes(environ)
    job_id = scheduler_job_id(environ)
    if env.size > 1 and nodes and job_id:
        return env.master_addr or nodes[0], env.master_port or port_from_job_id(job_id)
    if env.size == 1:
        return "127.0.0.1", env.master_port or _free_port()
    raise RuntimeFailure(
        f"rank {env.rank}: cannot find the rendezvous address for {env.size} ranks "
        f"(launcher {env.launcher}: no MASTER_ADDR/MASTER_PORT, no MPI, no scheduler node list)",
        hint="launch with srun/mpiexec inside a job, or with torchrun, or set MASTER_ADDR and MASTER_PORT",
    )


_ADDRESS_BYTES = 264  # a host name (at most 255 bytes), its length and the port


def _address_over_mpi(MPI: Any, timeout_s: float) -> tuple[str, int]:
    """Rank 0's host name and a free port, broadcast to every rank; a rank still waiting after ``timeout_s``
    fails with a message instead of waiting for ever (a broadcast has no timeout of its own)."""
    import time

    import numpy as np

    world = MPI.COMM_WORLD
    buf = np.zeros(_ADDRESS_BYTES, dtype=np.uint8)
    if world.Get_rank() == 0:
        host = socket.gethostname().encode()[:255]
        buf[0] = len(host)
        buf[1:1 + len(host)] = np.frombuffer(host, dtype=np.uint8)
        buf[256:264] = np.frombuffer(np.array([_free_port()], dtype="<i8").tobytes(), dtype=np.uint8)
    request = world.Ibcast(buf, root=0)
    deadline, pause = time.monotonic() + timeout_s, 0.001
    while not request.Test():  # ranks wait here while rank 0 starts: back off so they do not take its cores
        if time.monotonic() > deadline:
            raise RuntimeFailure(
                f"rank {world.Get_rank()}: rank 0's rendezvous address did not arrive over MPI within "
                f"{timeout_s:g} s (a rank upstream of this one, or rank 0, has not started)",
                hint="raise train.collective_timeout_s if start-up is this slow (or stage the environment to "
                     "node-local storage, docs/scaling.md)")
        time.sleep(pause)
        pause = min(0.05, 2 * pause)
    host = bytes(buf[1:1 + int(buf[0])]).decode()
    return host, int(np.frombuffer(buf[256:264].tobytes(), dtype="<i8")[0])
