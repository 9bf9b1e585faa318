"""The communication back-ends by name: ``make_communicator(backend, timeout_s)`` builds the one a job asks for,
counted on its way when counting is on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hpctrain.errors import ConfigError
from hpctrain.launch_env import detect_launch_env
from hpctrain.runtime.comm.base import Communicator, SingleProcessCommunicator
from hpctrain.runtime.comm.mpi import MPICommunicator
from hpctrain.runtime.comm.torch_dist import TorchDistCommunicator
from hpctrain.runtime.counting.comm_counts import counted
from hpctrain.runtime.devices import DEVICE_TYPE, require_device_backend

BACKENDS = ("mpi", "gloo", "nccl", "xccl", "none")


def make_communicator(
    backend: str, timeout_s: float, environ: Mapping[str, str] | None = None
) -> Communicator:
    """``backend``: mpi | gloo | nccl | xccl | none (single process). ``timeout_s`` bounds every collective.

    With counting on (runtime/counting/work_counts.py) every call is counted on its way
    (runtime/counting/comm_counts.py).
    """
    return counted(_make_communicator(backend, timeout_s, environ))


def _make_communicator(backend: str, timeout_s: float, environ: Mapping[str, str] | None) -> Communicator:
    environ = os.environ if environ is None else environ
    if backend == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise ConfigError(
                "backend 'mpi' needs mpi4py", key="backend",
                hint="pip install mpi4py mpich (or build mpi4py against the site MPI, see docs/runtime.md)",
            ) from None
        env = detect_launch_env(environ)
        return MPICommunicator(timeout_s, local_rank=env.local_rank if env.launcher != "none" else None)
    if backend in ("gloo", "nccl", "xccl"):
        if backend in DEVICE_TYPE:  # this torch has the backend and the rank sees a device, or one line says why
            require_device_backend(backend, environ)
        return TorchDistCommunicator(backend, timeout_s, environ=environ)
    if backend == "none":
        env = detect_launch_env(environ)
        if env.size != 1:
            raise ConfigError(f"backend 'none' is single-process but the launcher started {env.size} ranks",
                              key="backend", hint="use mpi or gloo")
        return SingleProcessCommunicator(timeout_s)
    raise ConfigError(f"unknown communication backend {backend!r}", key="backend",
                      hint=f"use one of {', '.join(BACKENDS)}")
