"""runtime/counting/comm_counts.py and runtime/counting/work_counts.py: every call counted with its bytes, messages per
algorithm.

The model of each algorithm is checked against hand-worked trees; the counts are checked exactly on real ranks
started by the MPICH wheel's mpiexec (MPI and gloo), with a known number of collectives of known sizes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.runtime.counting import comm_counts
from hpctrain.runtime.counting.comm_counts import traffic

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
WORKER = str(ROOT / "tests" / "mp_helpers" / "scale_worker.py")


def _sent(backend: str, kind: str, nbytes: int, rank: int, size: int) -> tuple[int, int, int, int]:
    t, _ = traffic(backend, kind, nbytes, rank, size)
    return t.sent_messages, t.sent_bytes, t.received_messages, t.received_bytes


def test_mpich_allreduce_follows_log2_of_the_ranks() -> None:
    # short: recursive doubling, log2(p) exchanges of the whole vector
    assert [_sent("mpi", "allreduce", 800, 0, p)[0] for p in (2, 4, 8, 16, 32, 64)] == [1, 2, 3, 4, 5, 6]
    # long: reduce-scatter + allgather, 2 log2(p) messages carrying 2 n (p-1)/p bytes
    assert _sent("mpi", "allreduce", 4096, 5, 8) == (6, 2 * 4096 * 7 // 8, 6, 2 * 4096 * 7 // 8)
    # 6 ranks: ranks 0 and 2 hand their vector to 1 and 3 and get the result back; the other 4 run 2 rounds
    assert _sent("mpi", "allreduce", 100, 0, 6) == (1, 100, 1, 100)
    assert _sent("mpi", "allreduce", 100, 1, 6) == (3, 300, 3, 300)
    assert _sent("mpi", "allreduce", 100, 5, 6) == (2, 200, 2, 200)


def test_binomial_trees_for_broadcast_and_gather() -> None:
    # 8 ranks from root 0: children 0 -> {4, 2, 1}, 2 -> {3}, 4 -> {6, 5}, 6 -> {7}
    children = [_sent("mpi", "broadcast", 64, r, 8)[0] for r in range(8)]
    assert children == [3, 0, 1, 0, 2, 0, 1, 0]
    assert [_sent("mpi", "broadcast", 64, r, 8)[2] for r in range(8)] == [0] + [1] * 7
    # gather up the same tree: each rank but the root sends once, with its whole subtree's share
    gather = [_sent("mpi", "gather", 10, r, 8) for r in range(8)]
    assert [g[0] for g in gather] == [0] + [1] * 7
    assert [g[1] for g in gather] == [0, 10, 20, 10, 40, 10, 20, 10]
    assert gather[0][2:] == (3, 70)  # the root receives log2(8) messages carrying everyone else's share
    # gloo's gather is linear: the root receives from every rank
    assert _sent("gloo", "gather", 10, 0, 8)[2:] == (7, 70)
    assert _sent("gloo", "allreduce", 800, 3, 8)[:2] == (14, 2 * 800 * 7 // 8)  # gloo's own ring
    # hpctrain's all-reduce over gloo: recursive doubling (small), Rabenseifner (large), one fold at N = 6
    assert _sent("p2p", "allreduce", 800, 3, 8)[:2] == (3, 3 * 800)
    assert _sent("p2p", "allreduce", 8000, 3, 8)[:2] == (6, 2 * 8000 * 7 // 8)
    assert _sent("p2p", "allreduce", 8000, 0, 6)[:2] == (1, 8000)
    assert _sent("p2p", "allreduce", 8000, 1, 6)[:2] == (5, 2 * 8000 * 3 // 4 + 8000)


@pytest.mark.processes
def test_counting_is_off_without_the_switch() -> None:
    code = ("import hpctrain.runtime.comm.backends as c; from hpctrain.runtime.counting import work_counts;"
            "comm = c.make_communicator('none', 10, environ={}); print(type(comm).__name__, work_counts.active())")
    env = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_COUNTERS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    assert out.stdout.split() == ["SingleProcessCommunicator", "None"]


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC",
            "HPCTRAIN_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("backend", "n"), [("mpi", 4), ("mpi", 3), ("gloo", 4)])
def test_counts_are_exact_for_known_collectives_on_real_ranks(tmp_path: Path, backend: str, n: int) -> None:
    from tests.mp_helpers.scale_worker import ALLREDUCES, REPEATS

    out = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, WORKER, "counts", backend, str(tmp_path)],
                         capture_output=True, text=True, timeout=200, cwd=ROOT, env=_clean_env(HPCTRAIN_COUNTERS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads((tmp_path / "counters" / f"rank-{r:05d}.json").read_text()) for r in range(n)]
    for r, record in enumerate(records):
        work = record["work"]
        assert work["steps"] == 1
        startup, train = work["traffic"]["startup"], work["traffic"]["train"]
        reduced_as = "p2p" if backend == "gloo" else backend  # gloo's all-reduces are hpctrain's own
        for label, k in ALLREDUCES:
            cat = comm_counts.traffic(reduced_as, "allreduce", 4 * k, r, n, element_size=4)[0]
            got = startup["gradients" if label.startswith("bucket") else label]
            assert got["calls"] == REPEATS and got["payload_bytes"] == REPEATS * 4 * k
            assert got["sent_messages"] == REPEATS * cat.sent_messages
            assert got["sent_bytes"] == REPEATS * cat.sent_bytes
        # the checkpoint category: one fixed gather (16 bytes), one varlen gather (an 8-byte max all-reduce and a
        # gather of 8 + 8n padded bytes) and a barrier
        ckpt = train["checkpoint"]
        assert ckpt["calls"] == 4
        assert ckpt["payload_bytes"] == 16 + 8 + (8 + 8 * n) + 0
        expected = [comm_counts.traffic(reduced_as if kind == "allreduce" else backend, kind, b, r, n,
                                        element_size=8)[0]
                    for kind, b in (("gather", 16), ("allreduce", 8), ("gather", 8 + 8 * n), ("barrier", 0))]
        assert ckpt["sent_messages"] == sum(t.sent_messages for t in expected)
        assert ckpt["received_messages"] == sum(t.received_messages for t in expected)
        assert set(startup) | set(train) <= {"gradients", "stop flag", "checkpoint"}


def test_one_setting_orders_every_timeout() -> None:
    from hpctrain.runtime.comm.timeouts import PROCESS_GROUP_MARGIN_S, RENDEZVOUS_MIN_S, Timeouts

    for setting in (5.0, 20.0, 300.0, 3600.0):
        t = Timeouts.from_setting(setting)
        assert t.collective_s == setting
        assert t.store_s >= t.collective_s and t.rendezvous_s == max(setting, RENDEZVOUS_MIN_S)
        # the back-end's own timeout comes after the watchdog's deadline plus the longest grace it may take
        assert t.process_group_s == setting + PROCESS_GROUP_MARGIN_S > setting + 11


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_rank_0_address_comes_over_mpi_and_a_late_rank_0_is_a_message_not_a_hang(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # Ranks leave with os._exit after printing: without auto-cleanup hydra does not kill the others meanwhile.
        sync_dir = tmp_path / "-".join(args)
        sync_dir.mkdir()
        argv = [MPIEXEC, "-disable-auto-cleanup", "-n", "3", sys.executable, WORKER, "rendezvous", *args,
                str(sync_dir)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT, env=_clean_env())

    ok = run("60", "0", "address")
    got = re.findall(r"rank (\d) address ([^:\s]+:\d+)", ok.stdout)  # lines of ranks may interleave
    assert sorted(r for r, _ in got) == ["0", "1", "2"] and len({a for _, a in got}) == 1, ok.stdout
    # rank 0 late to the broadcast: the others give up after the rendezvous timeout, with a message
    late = run("2", "8", "address")
    failed = re.findall(r"rank (\d) failed: rank \d: rank 0's rendezvous address did not arrive over MPI within 2 s",
                        late.stdout)
    assert sorted(failed) == ["1", "2"], late.stdout + late.stderr[-2000:]
    # rank 0 late to MPI_Init (the others wait inside it): they say so and exit instead of waiting for ever
    stuck = run("2", "20", "init")
    assert stuck.returncode != 0
    assert "MPI_Init did not complete within 2 s" in stuck.stderr, stuck.stderr[-2000:]
    assert not re.findall(r"rank [12] address", stuck.stdout)  # rank 0 itself may pass MPI_Init once it arrives
