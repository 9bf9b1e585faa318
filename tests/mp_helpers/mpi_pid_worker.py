"""Worker run under mpiexec by tests/test_comm.py: MPI_Init with hpctrain's settings, then one all-reduce.

``python mpi_pid_worker.py DIR`` writes DIR/pid-R (this process's PID, before ``MPI_Init``, so a rank that dies in
``MPI_Init`` still says which PID it had) and, once an all-reduce has worked, DIR/ok-R. No torch: it starts fast.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from hpctrain.runtime.comm.mpi_env import import_mpi  # noqa: E402


def main(out_dir: str) -> None:
    rank = os.environ["PMI_RANK"]
    with open(os.path.join(out_dir, f"pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    mpi = import_mpi()
    total = mpi.COMM_WORLD.allreduce(1)
    with open(os.path.join(out_dir, f"ok-{rank}"), "w") as f:
        f.write(f"{total} {os.environ.get('FI_PROVIDER')}")


if __name__ == "__main__":
    main(sys.argv[1])
