"""What MPI must be told before ``MPI_Init``: the PyPI mpich wheel on one node runs over shared memory only.

The wheel's MPICH (ch4, built with the UCX and libfabric netmods) starts UCX by default, and UCX exchanges the
address of every transport at ``MPI_Init`` even when all ranks share one node. That exchange failed once here
under ``srun --mpi=pmi2`` ("UCX ERROR failed to unpack address, invalid bandwidth 0.00", also reported as
pmodels/mpich#7417). On one node no network is needed: the libfabric netmod with its shared-memory provider
starts without it. A site's own MPI (mpi4py built against it) and multi-node jobs are left as they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType

from hpctrain.launch_env import detect_launch_env

# MPICH reads MPICH_CH4_NETMOD (MPIR_CVAR_CH4_NETMOD) and libfabric reads FI_PROVIDER during MPI_Init.
ONE_NODE_WHEEL = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "shm"}
# Any of these set by the user or the site means they chose the transport: hpctrain then sets nothing.
USER_CHOICES = ("MPICH_CH4_NETMOD", "MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "UCX_TLS", "MPI4PY_LIBMPI")


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


def import_mpi(environ: Mapping[str, str] | None = None) -> ModuleType:
    """``mpi4py.MPI`` (importing it calls ``MPI_Init``), after putting what ``one_node_settings`` asks for
    into this process's environment; ``environ`` (default ``os.environ``) is where the launcher's variables
    are read."""
    if "mpi4py.MPI" not in sys.modules:
        os.environ.update(one_node_settings(os.environ if environ is None else environ, mpich_wheel_in_use()))
    from mpi4py import MPI

    return MPI
