"""What MPI must be told before ``MPI_Init``: the PyPI mpich wheel on one node starts over loopback TCP.

The wheel's MPICH (ch4, built with the UCX and libfabric netmods) starts UCX by default, and UCX exchanges the
address of every transport at ``MPI_Init`` even when all ranks share one node. That exchange failed once here
under ``srun --mpi=pmi2`` ("UCX ERROR failed to unpack address, invalid bandwidth 0.00", also reported as
pmodels/mpich#7417). On one node the libfabric netmod is used instead, with its ``tcp`` provider on the loopback
interface. Not libfabric's shared-memory provider (``shm``): its address is the string ``fi_shm://<pid>:<uid>:<n>``,
whose length follows the number of digits in the rank's PID, and MPICH's address exchange at ``MPI_Init`` assumes
every rank's address has the length of its own. A job whose ranks' PIDs straddle a power of ten (9999 and 10000,
or a PID counter wrapping from 32767 to 300) aborted in ``MPI_Init`` with "Message truncated"
(tests/test_comm.py sets the PIDs to show it). A TCP address is a fixed-size ``sockaddr_in``. Messages between the
ranks go through MPICH's own shared memory either way (ch4's posix module), not through the netmod.
A site's own MPI (mpi4py built against it) and multi-node jobs are left as they are.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType

from hpctrain.launch_env import detect_launch_env

# MPICH reads MPICH_CH4_NETMOD (MPIR_CVAR_CH4_NETMOD), libfabric reads FI_PROVIDER and FI_TCP_IFACE during MPI_Init.
ONE_NODE_WHEEL = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}
# Any of these set by the user or the site means they chose the transport: hpctrain then sets nothing.
USER_CHOICES = ("MPICH_CH4_NETMOD", "MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE", "UCX_TLS",
                "MPI4PY_LIBMPI")


def mpich_wheel_in_use(prefix: str = sys.exec_prefix) -> bool:
    """Whether mpi4py will load the mpich wheel's ``libmpi``: mpi4py looks in this environment's ``lib/`` first."""
    try:
        dist = metadata.distribution("mpich")
    except metadata.PackageNotFoundError:
        return False
    wanted = (Path(prefix) / "lib" / "libmpi.so.12").resolve()
    return any(str(f).endswith("libmpi.so.12") and Path(str(dist.locate_file(f))).resolve() == wanted
               for f in dist.files or ())


def one_node_settings(environ: Mapping[str, str], wheel: bool) -> dict[str, str]:
    """The variables to set before ``MPI_Init`` (empty when the wheel is not used, the job spans nodes, or the
    user chose a transport)."""
    if not wheel or any(name in environ for name in USER_CHOICES):
        return {}
    env = detect_launch_env(environ)
    if env.local_size < env.size:  # ranks on other nodes: they need a network netmod
        return {}
    return dict(ONE_NODE_WHEEL)


def import_mpi(environ: Mapping[str, str] | None = None, timeout_s: float | None = None) -> ModuleType:
    """``mpi4py.MPI`` (importing it calls ``MPI_Init``), after putting what ``one_node_settings`` asks for
    into this process's environment; ``environ`` (default ``os.environ``) is where the launcher's variables
    are read. ``MPI_Init`` waits for every rank of the job: with ``timeout_s`` a rank still waiting after that
    long says so and is ended by its watcher process (its launcher then ends the others) instead of waiting for
    ever."""
    if "mpi4py.MPI" not in sys.modules:
        os.environ.update(one_node_settings(os.environ if environ is None else environ, mpich_wheel_in_use()))
        if timeout_s is not None:
            watcher = _start_init_watcher(timeout_s)
            try:
                from mpi4py import MPI
            finally:
                _stop_init_watcher(watcher)
            return MPI
    from mpi4py import MPI

    return MPI


def _start_init_watcher(timeout_s: float) -> int:
    """A child process that, unless stopped first, says after ``timeout_s`` that this rank's ``MPI_Init`` has not
    completed and ends the rank (SIGKILL: its launcher then ends the others). Not a thread: mpi4py calls
    ``MPI_Init_thread`` holding the GIL, so no Python thread of this process runs until ``MPI_Init`` returns —
    a timer thread fired only once the late rank had arrived, and lost the race to a cancel now and then
    (docs/runtime.md)."""
    from hpctrain.launch_env import rank_label

    message = (f"hpctrain: error: rank {rank_label(os.environ)}: MPI_Init did not complete within {timeout_s:g} s: "
               "a rank of this job has not started (slow start-up from the shared file system?); raise "
               "train.collective_timeout_s or stage the environment to node-local storage (docs/scaling.md)\n")
    rank_pid = os.getpid()
    child = os.fork()
    if child == 0:  # only sleep, write and kill here: nothing of the parent's state is used
        try:
            time.sleep(timeout_s)
            os.write(2, message.encode())
            os.kill(rank_pid, signal.SIGKILL)
        finally:
            os._exit(0)
    return child


def _stop_init_watcher(child: int) -> None:
    try:
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(child, 0)
