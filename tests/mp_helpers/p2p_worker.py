"""Worker for tests/test_p2p_allreduce.py, started by the MPICH wheel's mpiexec: gloo ranks (MPI bootstrap).

``python p2p_worker.py kill|sleep D TIMEOUT_S``: rank D is killed (SIGKILL), or sleeps, between two all-reduces;
every other rank prints how its next all-reduces (asynchronous, then blocking) ended: a peer's failure, or the
watchdog's message naming D.

``python p2p_worker.py K OUT_DIR``: through ``make_communicator("gloo")``, all-reduces of known inputs (sizes on both
sides of the algorithm switch, float32 and float64, sum and max, blocking and asynchronous), then a window of K
small and K large all-reduces; writes ``OUT_DIR/rank-R.json`` with a digest of every result, its largest error
against the float64 sum of every rank's inputs, the point-to-point module's own counts and the interposer's
(hpctrain_bench/wire_counts.py, where it is preloaded) in the window, and the rank's established TCP connections
(their ports) after init and at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.runtime.comm.backends import make_communicator  # noqa: E402
from hpctrain.runtime.counting import wire  # noqa: E402
from hpctrain_bench import wire_counts  # noqa: E402

SIZES = (1, 7, 300, 5000, 100_000)
SMALL, LARGE = 16, 100_000  # float32 elements: recursive doubling, Rabenseifner


def established_tcp_connections() -> list[tuple[int, int]]:
    """(local port, remote port) of this process's TCP connections in state ESTABLISHED (its socket inodes in
    /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:
                out.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
    return out


def inputs(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 1_000_003 + count)
    return (torch.randn(count, generator=g, dtype=torch.float64)
            * 10.0 ** torch.randint(-3, 4, (count,), generator=g)).to(dtype)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def main(k: int, out_dir: str) -> None:
    comm = make_communicator("gloo", timeout_s=120)
    r, n = comm.rank, comm.size
    p2p = comm.p2p
    assert p2p is not None, "the gloo communicator all-reduces by point-to-point messages"
    # Between two MPI barriers (shared memory, no socket): no rank has started an all-reduce, so no peer can have
    # connected to this one yet.
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    connections_at_start = established_tcp_connections()
    MPI.COMM_WORLD.Barrier()
    results: dict[str, dict[str, object]] = {}
    for dtype in (torch.float32, torch.float64):
        for count in SIZES:
            every = [inputs(q, count, dtype) for q in range(n)]
            reference = torch.stack([t.double() for t in every]).sum(0)
            scale = torch.stack([t.double().abs() for t in every]).sum(0)
            t = every[r].clone()
            comm.allreduce_(t, "sum", f"{dtype} {count}")
            error = float(((t.double() - reference).abs() / scale.clamp_min(1e-300)).max())
            results[f"sum {dtype} {count}"] = {"digest": digest(t), "error": error}
    handles = [(comm.allreduce_async_(t, "sum", f"bucket {i}"), t, i)
               for i, t in enumerate(inputs(r, 5000 + i, torch.float32) for i in range(3))]
    for h, t, i in handles:
        h.wait()
        every = torch.stack([inputs(q, 5000 + i, torch.float32).double() for q in range(n)])
        error = float(((t.double() - every.sum(0)).abs() / every.abs().sum(0).clamp_min(1e-300)).max())
        results[f"async {i}"] = {"digest": digest(t), "error": error}
    mx = inputs(r, 777, torch.float64)
    comm.allreduce_(mx, "max", "max")
    results["max"] = {"digest": digest(mx),
                      "error": float((mx - torch.stack([inputs(q, 777, torch.float64) for q in range(n)])
                                      .amax(0)).abs().max())}

    window: dict[str, dict[str, object]] = {}
    for name, count in (("small", SMALL), ("large", LARGE)):
        before, tally = wire.snapshot(), (p2p.tally.sent_messages, p2p.tally.received_messages)
        for i in range(k):
            t = torch.full((count,), float(r))
            comm.allreduce_(t, "sum", f"{name} {i}")
            assert torch.equal(t, torch.full((count,), float(n * (n - 1) // 2))), t
        after = wire.snapshot()
        window[name] = {"sent_messages": p2p.tally.sent_messages - tally[0],
                        "received_messages": p2p.tally.received_messages - tally[1],
                        "wire": None if after is None else wire_counts.totals(wire.difference(after, before))}
    connections = established_tcp_connections()
    report = {"rank": r, "size": n, "results": results, "window": window, "k": k,
              "peers": sorted(p2p.tally.peers), "sockets_at_start": connections_at_start, "sockets": connections}
    comm.close()
    (Path(out_dir) / f"rank-{r}.json").write_text(json.dumps(report))


def lose(how: str, victim: int, timeout_s: float) -> None:
    import signal

    from hpctrain.runtime.comm.base import is_peer_failure

    comm = make_communicator("gloo", timeout_s=timeout_s)
    r, n = comm.rank, comm.size
    for i in range(3):  # every pair of the schedules is connected by now
        comm.allreduce_(torch.full((1000,), float(r)), "sum", f"warm-up {i}")
    if r == victim and how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if r == victim:
        time.sleep(3600)
    try:
        handles = [comm.allreduce_async_(torch.full((5000,), float(r)), "sum", f"bucket {i}") for i in range(2)]
        for h in handles:
            h.wait()
        comm.allreduce_(torch.ones(2), "sum", "stop flag")
    except Exception as exc:  # noqa: BLE001 - what the rank saw is the test's subject
        print(f"rank {r} of {n}: peer failure {is_peer_failure(exc)}: {type(exc).__name__}: {exc}", flush=True)
        comm.abandon()
        sys.exit(1)
    print(f"rank {r}: all-reduces completed without rank {victim} (unexpected)", flush=True)


if __name__ == "__main__":
    if sys.argv[1] in ("kill", "sleep"):
        lose(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
    else:
        main(int(sys.argv[1]), sys.argv[2])
