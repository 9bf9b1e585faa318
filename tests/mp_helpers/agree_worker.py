"""One rank of a Communicator.agree test: rank FAILING passes a DataError, the others None; every rank prints what
it raised, then all-reduces once more (the group is intact) and closes. ``agree_worker.py BACKEND FAILING``."""

from __future__ import annotations

import sys

import torch

from hpctrain.errors import DataError
from hpctrain.runtime.comm.backends import make_communicator
from hpctrain.runtime.comm.base import RankFailure


def main() -> int:
    backend, failing = sys.argv[1], int(sys.argv[2])
    comm = make_communicator(backend, 60.0)
    comm.agree(None, "all well")  # nothing raised when every rank is well
    error = DataError("/data/vol.h5: no dataset 'image'", hint="datasets in the file: ['raw']") \
        if comm.rank == failing else None
    try:
        comm.agree(error, "data preparation")
    except RankFailure as exc:
        print(f"rank {comm.rank}: RankFailure from rank {exc.origin}, exit {exc.exit_code}: {exc.line}", flush=True)
    except DataError as exc:
        print(f"rank {comm.rank}: own DataError: {exc}", flush=True)
    total = torch.ones(1)
    comm.allreduce_(total, "sum", "after")
    print(f"rank {comm.rank}: sum after {int(total[0])}", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
