"""Tests of runtime/comm/p2p_allreduce.py: the schedules in one process (every rank a thread, messages through queues)
against float64 references and the O(log N) bound, then over real gloo groups under mpiexec (tests further down).
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hpctrain.runtime.comm import p2p_allreduce as p2p
from hpctrain_bench import wire_counts
from tests.mp_helpers.gloo_ranks import run_gloo_ranks


def message_bound(size: int) -> int:
    """The most messages one rank sends (or receives) in one all-reduce: 2 ceil(log2 N) + 2."""
    return 2 * (size - 1).bit_length() + 2


class _Done:
    def wait(self) -> None:
        return None


class _Recv:
    def __init__(self, box: queue.Queue[torch.Tensor], into: torch.Tensor) -> None:
        self._box, self._into = box, into

    def wait(self) -> None:
        got = self._box.get(timeout=30)
        assert got.shape == self._into.shape, (got.shape, self._into.shape)
        self._into.copy_(got)


class Mailboxes:
    """One FIFO per (sender, receiver, tag): a message is matched by its peer and tag, in order."""

    def __init__(self) -> None:
        self._boxes: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = defaultdict(queue.Queue)
        self._lock = threading.Lock()

    def box(self, src: int, dst: int, tag: int) -> queue.Queue[torch.Tensor]:
        with self._lock:
            return self._boxes[(src, dst, tag)]

    def transport(self, rank: int) -> p2p.Transport:
        boxes = self

        class _T:
            def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> _Done:
                boxes.box(rank, peer, tag).put(tensor.clone())
                return _Done()

            def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> _Recv:
                return _Recv(boxes.box(peer, rank, tag), tensor)

        return _T()


def allreduce_threads(inputs: list[torch.Tensor], op: str, kind: str | None = None,
                      ) -> tuple[list[torch.Tensor], list[p2p.Tally]]:
    n = len(inputs)
    boxes = Mailboxes()
    outs = [t.clone() for t in inputs]
    tallies = [p2p.Tally() for _ in range(n)]

    def rank_main(r: int) -> None:
        rounds = None if kind is None else p2p.schedule(r, n, outs[r].numel(), kind)
        p2p.run(outs[r], op, r, n, boxes.transport(r), tag=7, tally=tallies[r], rounds=rounds)

    run_in_threads(n, rank_main)
    return outs, tallies


def run_in_threads(n: int, rank_main: Callable[[int], None]) -> None:
    """``rank_main(r)`` for r = 0 .. n-1, each in its own thread (the ranks exchange through Mailboxes); every
    rank's exception is the test's failure."""
    errors: list[BaseException] = []

    def guarded(r: int) -> None:
        try:
            rank_main(r)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def _inputs(n: int, count: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(count, generator=g, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (count,),
                                                                                       generator=g)).to(dtype)
            for _ in range(n)]


@pytest.mark.parametrize("kind", ["recursive doubling", "rabenseifner"])
@pytest.mark.parametrize("n", list(range(1, 18)) + [31, 32, 33])
def test_every_rank_ends_with_the_same_bits_close_to_the_float64_sum(n: int, kind: str) -> None:
    for count in (1, 5, n, 3 * n + 1, 1000):
        inputs = _inputs(n, count, torch.float32, seed=n * 1000 + count)
        outs, _ = allreduce_threads(inputs, "sum", kind)
        reference = torch.stack([t.double() for t in inputs]).sum(0)
        scale = torch.stack([t.double().abs() for t in inputs]).sum(0)
        for r in range(n):
            assert torch.equal(outs[r], outs[0]), (n, count, r)  # bit-identical on every rank
        assert torch.all((outs[0].double() - reference).abs() <= 1e-6 * scale + 1e-30), (n, count)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 13])
def test_max_and_min_are_exact(n: int, op: str) -> None:
    inputs = _inputs(n, 700, torch.float64, seed=n)
    outs, _ = allreduce_threads(inputs, op)
    want = torch.stack(inputs).amax(0) if op == "max" else torch.stack(inputs).amin(0)
    assert all(torch.equal(o, want) for o in outs)


def test_integers_and_half_precision() -> None:
    ints = [torch.arange(10, dtype=torch.int64) * (r + 1) for r in range(6)]
    outs, _ = allreduce_threads(ints, "sum")
    assert all(torch.equal(o, torch.arange(10, dtype=torch.int64) * 21) for o in outs)
    halves = [torch.full((3000,), 0.5, dtype=torch.bfloat16) for _ in range(5)]
    outs, _ = allreduce_threads(halves, "sum")
    assert all(torch.equal(o, torch.full((3000,), 2.5, dtype=torch.bfloat16)) for o in outs)


@pytest.mark.parametrize("n", list(range(2, 18)) + [31, 32, 33, 100])
def test_messages_and_peers_per_rank_are_logarithmic(n: int) -> None:
    for count, item in ((4, 8), (100_000, 4)):
        kind = p2p.algorithm(count, item, n)
        assert kind == ("recursive doubling" if count == 4 else "rabenseifner")
        for r in range(n):
            rounds = p2p.schedule(r, n, count, kind)
            sent = sum(x.sends for x in rounds)
            received = sum(x.receives for x in rounds)
            assert sent <= message_bound(n) and received <= message_bound(n), (n, r, rounds)
            assert len({x.peer for x in rounds}) <= math.ceil(math.log2(n)) + 1
            assert r not in {x.peer for x in rounds}


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 16, 17])
def test_schedules_pair_up(n: int) -> None:
    """What a rank sends to a peer in its k-th round with that peer is what the peer receives from it in its
    k-th round with this rank: same length, in the same order."""
    for count in (3, 1000):
        kind = p2p.algorithm(count, 4, n)
        sent: dict[tuple[int, int], list[int]] = defaultdict(list)
        received: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in range(n):
            for x in p2p.schedule(r, n, count, kind):
                if x.sends:
                    sent[(r, x.peer)].append(x.send[1] - x.send[0])
                if x.receives:
                    received[(x.peer, r)].append(x.recv[1] - x.recv[0])
        assert sent == received


def test_rabenseifner_sends_2_p_minus_1_over_p_of_the_buffer_plus_the_fold() -> None:
    """A power of two: 2 (N-1)/N of the buffer per rank. Otherwise the ranks that fold send the whole buffer
    once more (the result back to their partner)."""
    count = 4096
    for n in (2, 4, 8, 16, 6, 12):
        p = 1 << (n.bit_length() - 1)
        for r in range(n):
            rounds = p2p.schedule(r, n, count, "rabenseifner")
            sent = sum(x.send[1] - x.send[0] for x in rounds)
            folds = r < 2 * (n - p)
            assert sent == (count if folds and r % 2 == 0 else 2 * count * (p - 1) // p + count * folds), (n, r)


def test_the_tally_counts_what_the_schedule_says() -> None:
    outs, tallies = allreduce_threads(_inputs(6, 2000, torch.float32), "sum")
    for r, t in enumerate(tallies):
        rounds = p2p.schedule(r, 6, 2000, "rabenseifner")
        assert t.calls == 1 and t.sent_messages == sum(x.sends for x in rounds)
        assert t.sent_bytes == 4 * sum(x.send[1] - x.send[0] for x in rounds)
    assert sum(t.sent_messages for t in tallies) == sum(t.received_messages for t in tallies)


def test_an_unknown_choice_of_gloo_all_reduce_is_a_config_error() -> None:
    from hpctrain.errors import ConfigError
    from hpctrain.runtime.comm.backends import make_communicator

    with pytest.raises(ConfigError, match="HPCTRAIN_GLOO_ALLREDUCE='ring' is not p2p or gloo"):
        make_communicator("gloo", 10, environ={"HPCTRAIN_GLOO_ALLREDUCE": "ring"})


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="op"):
        p2p.run(torch.ones(3), "prod", 0, 2, Mailboxes().transport(0), 0)
    with pytest.raises(ValueError, match="1-D"):
        p2p.run(torch.ones(3, 2), "sum", 0, 2, Mailboxes().transport(0), 0)
    with pytest.raises(ValueError, match="algorithm"):
        p2p.schedule(0, 4, 10, "ring")


# ------------------------------------------------------------------------- real gloo groups under mpiexec

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
WORKER = str(ROOT / "tests" / "mp_helpers" / "p2p_worker.py")
K = 5  # all-reduces of each size in the counted window


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wire_counts.build(tmp_path_factory.mktemp("wire"))


def _gloo_ranks(n: int, out: Path, **extra: str) -> list[dict[str, Any]]:
    return run_gloo_ranks(WORKER, K, n, out, **extra)


def _connected(reports: list[dict[str, Any]], key: str) -> list[set[int]]:
    """Per rank, the ranks at the other end of its TCP connections: on one host a connection is one rank's
    (local port, remote port) and the other's (remote port, local port). Counted by peer, not by socket: when
    two ranks connect to each other at the same moment, a pair may hold two sockets for a while."""
    owner = {(a, b): x["rank"] for x in reports for a, b in x[key]}
    return [{owner[(b, a)] for a, b in x[key] if (b, a) in owner} for x in reports]


def _expected(n: int, r: int, count: int) -> tuple[int, int]:
    rounds = p2p.schedule(r, n, count, p2p.algorithm(count, 4, n))
    return sum(x.sends for x in rounds), sum(x.receives for x in rounds)


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [3, 6, 8])
def test_gloo_ranks_end_with_the_same_bits_in_log_n_messages(tmp_path: Path, n: int) -> None:
    reports = _gloo_ranks(n, tmp_path)
    for case, first in reports[0]["results"].items():
        assert all(x["results"][case]["digest"] == first["digest"] for x in reports), case  # the same bits
        assert all(x["results"][case]["error"] <= (0 if case == "max" else 2e-6) for x in reports), case
    bound = message_bound(n)
    for r, x in enumerate(reports):
        for name, count in (("small", 16), ("large", 100_000)):
            sent, received = x["window"][name]["sent_messages"], x["window"][name]["received_messages"]
            assert (sent, received) == tuple(K * e for e in _expected(n, r, count)), (r, name)
            assert sent <= K * bound and received <= K * bound
        assert len(x["peers"]) <= math.ceil(math.log2(n)) + 1
    # gloo connects a pair when it first carries a message: none at start-up, then the peers of the schedule
    assert all(x["sockets_at_start"] == [] for x in reports)
    assert _connected(reports, "sockets") == [set(x["peers"]) for x in reports]


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_gloo_messages_at_the_socket_are_the_schedules(tmp_path: Path, library: Path, n: int) -> None:
    """The interposer counts every send on the rank's TCP sockets (MPI stays on shared memory here, so every
    connection is gloo's): per message it sends, gloo's transport writes 2 (a notice and the data), per message
    it receives 1 (that it is ready), nothing else in the window."""
    env = {**wire_counts.environment(library, environ={}), "MPIR_CVAR_NOLOCAL": "0"}
    reports = _gloo_ranks(n, tmp_path, **env)
    per_call = {}
    for r, x in enumerate(reports):
        for name in ("small", "large"):
            w = x["window"][name]
            assert w["wire"] is not None
            assert w["wire"]["sent_messages"] == 2 * w["sent_messages"] + w["received_messages"], (r, name, w)
            per_call[(r, name)] = w["wire"]["sent_messages"] / K
    assert max(per_call.values()) <= 3 * message_bound(n)
    assert [len(c) for c in _connected(reports, "sockets")] == [max(1, int(math.log2(n)))] * n


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_without_lazy_pairs_gloo_connects_the_full_mesh(tmp_path: Path) -> None:
    """The connection count above can fail: with TORCH_GLOO_LAZY_INIT=0 every rank holds N - 1 at start-up."""
    reports = _gloo_ranks(6, tmp_path, TORCH_GLOO_LAZY_INIT="0")
    assert _connected(reports, "sockets_at_start") == [set(range(6)) - {r} for r in range(6)]


def _stop_a_rank(n: int, victim: int, timeout_s: int) -> subprocess.CompletedProcess[str]:
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC",
            "HPCTRAIN_", "MPIR_CVAR_", "LD_PRELOAD", "TORCH_GLOO_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1")
    # a hang is the subprocess timeout, far beyond the collective timeout and the watchdog's grace
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, WORKER, "sleep", str(victim), str(timeout_s)],
                          capture_output=True, text=True, timeout=200, cwd=ROOT, env=env)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_stuck_rank_is_named_by_the_watchdog_during_a_p2p_allreduce() -> None:
    """Rank 2 of 6 stops before the asynchronous all-reduces (run on the helper thread): the others' watchdog
    names it and aborts the job, as for gloo's own collectives."""
    out = _stop_a_rank(6, 2, 6)
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "rank 2 did not arrive at collective #4 (allreduce, bucket 0) within 6 s" in said, said[-3000:]
    assert "unexpected" not in said


@pytest.mark.processes
@pytest.mark.timeout(400)
def test_a_killed_rank_ends_its_peers_p2p_allreduces(tmp_path: Path) -> None:
    """Rank 2 of 6 is killed (SIGKILL) between all-reduces. The ranks are started one by one, with no launcher to
    stop the others when one dies (tests/mp_helpers/nodes.py): each survivor's next all-reduce ends in a peer's
    failure (or, where it waits on a live rank, its watchdog's message), it leaves with exit 1 — not a hang, and
    not std::terminate from a gloo receive left running under the destroyed group."""
    from tests.mp_helpers.nodes import run_on_nodes

    results = run_on_nodes([sys.executable, WORKER, "kill", "2", "20"], 1, 6, [tmp_path], timeout=300)
    assert results[2].returncode == -9
    for r, done in enumerate(results):
        if r == 2:
            continue
        assert done.returncode == 1, (r, done.returncode, done.stdout[-3000:])
        said = done.stdout
        assert (f"rank {r} of 6: peer failure True" in said or "did not arrive" in said
                or "is unreachable" in said), (r, said[-3000:])
        assert "unexpected" not in said
