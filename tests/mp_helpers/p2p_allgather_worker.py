"""Worker for tests/test_p2p_allgather.py, started by the MPICH wheel's mpiexec: gloo ranks (MPI bootstrap).

``python p2p_allgather_worker.py K OUT_DIR``: through ``make_communicator("gloo")``, all-gathers of known inputs
(several shapes and dtypes, equal and differing lengths, empty blocks), then a window of K all-gathers of 16 and of K of
100,000 float32 per rank; writes ``OUT_DIR/rank-R.json`` with a digest of every result and whether it equals the
reference, the point-to-point module's own counts and the socket interposer's (hpctrain_bench/wire_counts.py, where it
is preloaded) in each window, and the rank's established TCP connections at the end. Under
``HPCTRAIN_GLOO_ALLGATHER=gloo`` the same calls go to torch's ring (the module's counts are then zero).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.runtime.comm.backends import make_communicator  # noqa: E402
from hpctrain.runtime.counting import wire  # noqa: E402
from hpctrain_bench import wire_counts  # noqa: E402
from tests.mp_helpers.p2p_worker import established_tcp_connections  # noqa: E402

SMALL, LARGE = 16, 100_000


def block(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 1_000_003 + salt)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 1000
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


def varlen(rank: int, size: int, salt: int) -> torch.Tensor:
    """Rank r's block: (r * 37 + salt) % 50 elements, every third rank none."""
    n = 0 if rank % 3 == 1 else (rank * 37 + salt) % 50 + 1
    return block(rank, (n,), torch.float32, salt)


def digest(ts: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def main(k: int, out_dir: str) -> None:
    comm = make_communicator("gloo", timeout_s=120)
    r, n = comm.rank, comm.size
    messages = comm.p2p_gather
    results: dict[str, dict[str, object]] = {}
    cases = [((), torch.float64, 1), ((7,), torch.float32, 2), ((3, 5), torch.int64, 3), ((33,), torch.bool, 4),
             ((1000,), torch.bfloat16, 5), ((0,), torch.float32, 6), ((2, 3000), torch.float32, 7)]
    for shape, dtype, salt in cases:
        got = comm.allgather(block(r, shape, dtype, salt), f"case {salt}")
        want = [block(q, shape, dtype, salt) for q in range(n)]
        results[f"allgather {shape} {dtype}"] = {"digest": digest(got), "equal": all(
            a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want, strict=True))}
    for salt in (11, 12):
        got = comm.allgather_varlen(varlen(r, n, salt), f"varlen {salt}")
        want = [varlen(q, n, salt) for q in range(n)]
        results[f"varlen {salt}"] = {"digest": digest(got), "equal": len(got) == n and all(
            torch.equal(a, b) for a, b in zip(got, want, strict=True))}
    window: dict[str, dict[str, object]] = {}
    for name, count in (("small", SMALL), ("large", LARGE)):
        tally = messages.allgather_tally if messages is not None else None
        before = wire.snapshot()
        sent0, received0 = (tally.sent_messages, tally.received_messages) if tally else (0, 0)
        bytes0 = tally.received_bytes if tally else 0
        for i in range(k):
            got = comm.allgather(torch.full((count,), float(r)), f"{name} {i}")
            assert all(torch.equal(g, torch.full((count,), float(q))) for q, g in enumerate(got)), name
        after = wire.snapshot()
        window[name] = {"sent_messages": (tally.sent_messages - sent0) if tally else 0,
                        "received_messages": (tally.received_messages - received0) if tally else 0,
                        "received_bytes": (tally.received_bytes - bytes0) if tally else 0,
                        "wire": None if after is None else wire_counts.totals(wire.difference(after, before))}
    report = {"rank": r, "size": n, "results": results, "window": window,
              "peers": sorted(messages.allgather_tally.peers) if messages is not None else [],
              "sockets": established_tcp_connections()}
    comm.close()
    (Path(out_dir) / f"rank-{r}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
