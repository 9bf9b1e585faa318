"""Worker for tests/test_wire_counts.py, started by the MPICH wheel's mpiexec with the interposer preloaded.

``python wire_worker.py K OUT_DIR``: through ``make_communicator("mpi")`` (counted by the Python counter when
HPCTRAIN_COUNTERS=1) K all-reduces of 64 bytes, then K exchanges with a partner rank (``sendrecv``), then the
communicator's close; writes ``OUT_DIR/rank-R.json`` with the interposer's counts in each of the two windows, its
counts over the whole process, and the Python counter's calls.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.runtime.comm.backends import make_communicator  # noqa: E402
from hpctrain.runtime.counting import counters, wire, work_counts  # noqa: E402

ELEMENTS = 16  # float32: 64 bytes per all-reduce and per exchange


def main(k: int, out_dir: str) -> None:
    comm = make_communicator("mpi", timeout_s=120)
    r, n = comm.rank, comm.size
    comm.barrier("start")
    before = wire.snapshot()
    for i in range(k):
        t = torch.full((ELEMENTS,), float(r))
        comm.allreduce_(t, "sum", f"bucket {i}")
        assert torch.equal(t, torch.full((ELEMENTS,), float(n * (n - 1) / 2)))
    comm.barrier("between")
    middle = wire.snapshot()
    for _ in range(k):
        got = comm.sendrecv(torch.full((ELEMENTS,), float(r)), peer=r ^ 1)
        assert torch.equal(got, torch.full((ELEMENTS,), float(r ^ 1)))
    comm.barrier("end")
    after = wire.snapshot()
    comm.close()
    assert before is not None and middle is not None and after is not None
    python_calls = sum(t["calls"] for phase in work_counts.sections()["work"]["traffic"].values()
                       for t in phase.values())
    result = {"rank": r, "size": n, "allreduce": wire.difference(middle, before),
              "sendrecv": wire.difference(after, middle), "whole": wire.snapshot(),
              "python_calls": python_calls, "counting": counters.enabled()}
    (Path(out_dir) / f"rank-{r}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
