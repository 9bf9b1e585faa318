"""Tests of runtime/comm/p2p_allgather.py: the schedules in one process (every rank a thread, messages through the
queues of tests/test_p2p_allreduce.py) against a direct reference and the O(log N) bound, then over real gloo groups
under mpiexec: the Communicator's all-gathers, the module's counts against the schedule and the socket's against both,
and torch's ring measured the same way (so the bound can fail).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from hpctrain.runtime.comm import p2p_allgather as ag
from hpctrain.runtime.comm import p2p_allreduce as p2p
from hpctrain_bench import wire_counts
from tests.mp_helpers.gloo_ranks import run_gloo_ranks
from tests.test_p2p_allreduce import Mailboxes, run_in_threads


def message_bound(size: int) -> int:
    """The most messages one rank sends (or receives) in one all-gather: ceil(log2 N) + 2."""
    return (size - 1).bit_length() + 2


def allgather_threads(blocks: list[torch.Tensor]) -> tuple[list[list[torch.Tensor]], list[p2p.Tally]]:
    n = len(blocks)
    boxes = Mailboxes()
    counts = [b.numel() for b in blocks]
    outs: list[list[torch.Tensor]] = [[] for _ in range(n)]
    tallies = [p2p.Tally() for _ in range(n)]

    def rank_main(r: int) -> None:
        outs[r] = ag.allgather(blocks[r], counts, r, boxes.transport(r), tag=3, tally=tallies[r])

    run_in_threads(n, rank_main)
    return outs, tallies


def _blocks(counts: list[int], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(c, generator=g, dtype=torch.float64) * 1e3).to(dtype) for c in counts]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("n", list(range(1, 18)) + [31, 32, 33])
def test_every_rank_ends_with_every_block_in_rank_order(n: int) -> None:
    rng = random.Random(n)
    shapes = [[1] * n, [5] * n, [1000] * n, [0] * n,
              [rng.randrange(0, 40) for _ in range(n)],  # differing lengths, some empty
              [0 if r % 2 else 3 * r + 1 for r in range(n)]]
    for i, counts in enumerate(shapes):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            blocks = _blocks(counts, dtype, seed=100 * n + i)
            outs, tallies = allgather_threads(blocks)
            for r in range(n):
                assert len(outs[r]) == n
                for q in range(n):
                    assert outs[r][q].dtype == dtype and torch.equal(outs[r][q], blocks[q]), (n, counts, r, q)
                assert _bits(torch.cat(outs[r])) == _bits(torch.cat(outs[0]))  # the same bits on every rank
            # each rank receives exactly the blocks it does not hold, once
            item = blocks[0].element_size()
            for r, t in enumerate(tallies):
                assert t.received_bytes == item * (sum(counts) - counts[r]), (n, counts, r)


def test_integers_and_booleans_travel_as_their_bytes() -> None:
    blocks = [torch.arange(r, r + 4, dtype=torch.int64) * 10**12 for r in range(5)]
    outs, _ = allgather_threads(blocks)
    assert all(torch.equal(o[q], blocks[q]) for o in outs for q in range(5))
    flags = [torch.tensor([r % 2 == 0, True, False]) for r in range(6)]
    outs, _ = allgather_threads(flags)
    assert all(o[q].dtype == torch.bool and torch.equal(o[q], flags[q]) for o in outs for q in range(6))


@pytest.mark.parametrize("n", list(range(2, 18)) + [31, 32, 33, 100, 1000])
def test_messages_per_rank_are_logarithmic_and_the_peers_are_the_all_reduces(n: int) -> None:
    """At most ceil(log2 N) + 2 messages each way per rank (not the ring's N - 1), to the ranks the all-reduce
    already talks to (a lazily connected group opens no other pair)."""
    counts = [64] * n
    for r in range(n):
        rounds = ag.schedule(r, counts)
        sent, received = sum(x.sends for x in rounds), sum(x.receives for x in rounds)
        assert sent <= message_bound(n) and received <= message_bound(n), (n, r, rounds)
        assert message_bound(n) <= math.ceil(math.log2(n)) + 2
        assert sum(x.recv[1] - x.recv[0] for x in rounds) == 64 * (n - 1)
        peers = {x.peer for x in rounds}
        assert r not in peers
        assert peers <= {x.peer for x in p2p.schedule(r, n, 1, "recursive doubling")}, (n, r)
    if n >= 8:
        assert max(sum(x.sends for x in ag.schedule(r, counts)) for r in range(n)) < n - 1  # fewer than the ring


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8, 12, 16, 17])
def test_schedules_pair_up(n: int) -> None:
    """What a rank sends to a peer in its k-th message to that peer is what the peer receives from it in its k-th
    receive from this rank: the same range of the output."""
    counts = [(7 * r) % 5 for r in range(n)]
    sent: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    received: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for r in range(n):
        for x in ag.schedule(r, counts):
            assert not (x.sends and x.receives and x.send[0] < x.recv[1] and x.recv[0] < x.send[1])  # disjoint
            if x.sends:
                sent[(r, x.peer)].append(x.send)
            if x.receives:
                received[(x.peer, r)].append(x.recv)
    assert sent == received


def test_bad_arguments() -> None:
    transport = Mailboxes().transport(0)
    with pytest.raises(ValueError, match="counts say 3"):
        ag.allgather(torch.ones(2), [3, 3], 0, transport, 0)
    with pytest.raises(ValueError, match="negative"):
        ag.schedule(0, [1, -1])
    with pytest.raises(ValueError, match="outside"):
        ag.schedule(2, [1, 1])
    with pytest.raises(ValueError, match="holds 5 elements"):
        ag.run(torch.ones(5), [3, 3], 0, transport, 0)


def test_an_unknown_choice_of_gloo_all_gather_is_a_config_error() -> None:
    from hpctrain.errors import ConfigError
    from hpctrain.runtime.comm.backends import make_communicator

    with pytest.raises(ConfigError, match="HPCTRAIN_GLOO_ALLGATHER='ring' is not p2p or gloo"):
        make_communicator("gloo", 10, environ={"HPCTRAIN_GLOO_ALLGATHER": "ring"})


# ------------------------------------------------------------------------- real gloo groups under mpiexec

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "mp_helpers" / "p2p_allgather_worker.py")
K = 5  # all-gathers of each size in the counted window
SMALL, LARGE = 16, 100_000


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wire_counts.build(tmp_path_factory.mktemp("wire"))


def _gloo_ranks(n: int, out: Path, **extra: str) -> list[dict[str, Any]]:
    return run_gloo_ranks(WORKER, K, n, out, **extra)


def _expected(n: int, r: int, count: int) -> tuple[int, int, int]:
    rounds = ag.schedule(r, [4 * count] * n)
    return (sum(x.sends for x in rounds), sum(x.receives for x in rounds),
            sum(x.recv[1] - x.recv[0] for x in rounds))


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [3, 6])
def test_gloo_all_gathers_are_the_reference_on_every_rank_in_log_n_messages(tmp_path: Path, n: int) -> None:
    reports = _gloo_ranks(n, tmp_path)
    for case, first in reports[0]["results"].items():
        assert all(x["results"][case]["equal"] for x in reports), case
        assert all(x["results"][case]["digest"] == first["digest"] for x in reports), case  # the same bits
    for r, x in enumerate(reports):
        for name, count in (("small", SMALL), ("large", LARGE)):
            w = x["window"][name]
            sent, received, nbytes = _expected(n, r, count)
            assert (w["sent_messages"], w["received_messages"]) == (K * sent, K * received), (r, name)
            assert w["received_bytes"] == K * nbytes == K * 4 * count * (n - 1)
            assert sent <= message_bound(n) and received <= message_bound(n)
        assert set(x["peers"]) <= {q.peer for q in p2p.schedule(r, n, 1, "recursive doubling")}


def _socket_messages_per_call(reports: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    out = {}
    for r, x in enumerate(reports):
        for name in ("small", "large"):
            wire = x["window"][name]["wire"]
            assert wire is not None
            out[(r, name)] = wire["sent_messages"] / K
    return out


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 8])
def test_gloo_all_gather_messages_at_the_socket_are_the_schedules(tmp_path: Path, library: Path, n: int) -> None:
    """The interposer counts every send on the rank's TCP sockets (MPI stays on shared memory, so every
    connection is gloo's): 2 per message the rank sends and 1 per message it receives, nothing else, so at most
    3 (log2 N + 2) per all-gather and rank."""
    env = {**wire_counts.environment(library, environ={}), "MPIR_CVAR_NOLOCAL": "0"}
    reports = _gloo_ranks(n, tmp_path, **env)
    for r, x in enumerate(reports):
        for name in ("small", "large"):
            w = x["window"][name]
            assert w["wire"]["sent_messages"] == 2 * w["sent_messages"] + w["received_messages"], (r, name, w)
    assert max(_socket_messages_per_call(reports).values()) <= 3 * message_bound(n)


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_torchs_ring_all_gather_breaks_the_bound(tmp_path: Path, library: Path) -> None:
    """The bound above can fail: torch's ring all-gather over gloo (HPCTRAIN_GLOO_ALLGATHER=gloo) sends and
    receives at least N - 1 messages per rank, at the socket at least 3 (N - 1) per call, more than the p2p bound
    3 (log2 N + 2) at N = 8."""
    n = 8
    env = {**wire_counts.environment(library, environ={}), "MPIR_CVAR_NOLOCAL": "0",
           "HPCTRAIN_GLOO_ALLGATHER": "gloo"}
    reports = _gloo_ranks(n, tmp_path, **env)
    assert all(all(x["results"][c]["equal"] for c in x["results"]) for x in reports)
    per_call = _socket_messages_per_call(reports)
    assert min(per_call.values()) >= 3 * (n - 1) > 3 * message_bound(n), per_call
