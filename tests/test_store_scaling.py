"""What torch.distributed ranks ask of the rendezvous store, counted on real gloo groups
(runtime/counting/store_counts.py): start-up calls per rank that do not grow with N, nothing per watchdog tick in
training, O(1) per rank at close, and no store at all when an MPI launcher started the ranks. docs/scaling.md,
"torch.distributed at scale".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "mp_helpers" / "comm_worker.py")
DROP = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC",
        "HPCTRAIN_")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def _run(launcher: str, n: int, steps: int, pause_s: float, out: Path, venv_bin: Path,
         **extra: str) -> list[dict[str, Any]]:
    """``n`` gloo ranks (rank 0 hosting the TCPStore under the local launcher; no store under mpiexec): one
    all-reduce at start-up, ``steps`` more ``pause_s`` apart, close; each rank's store counts."""
    out.mkdir(parents=True)
    python = str(venv_bin / "python")
    work = [python, WORKER, "store", str(steps), str(pause_s), str(out)]
    argv = ([str(venv_bin / "mpiexec"), "-n", str(n), *work] if launcher == "mpiexec" else
            [python, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", str(n), "--", *work])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env(**extra), cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == list(range(n))
    assert all(r["sum"] == [n * (n - 1) / 2] * 4 for r in records), records[0]  # the group really reduced
    return records


def _served(records: list[dict[str, Any]], phase: str) -> int:
    """Calls every rank sent to the server in ``phase``: what rank 0's TCPStore served."""
    return sum(r["totals"][phase] for r in records)


@pytest.mark.processes
def test_startup_store_calls_per_rank_do_not_grow_with_ranks(tmp_path: Path, venv_bin: Path) -> None:
    """Rank 0 serves 5 N + 1 calls at start-up (it served N (2 N + 1) when every rank read every other rank's gloo
    address from it: 10, 36, 136 at N = 2, 4, 8) and accepts two connections per rank."""
    per_rank = {}
    for n in (2, 4, 8):
        records = _run("local", n, 1, 0.0, tmp_path / f"n{n}", venv_bin)
        assert {r["server"] for r in records} == {"rank 0"} and {r["rendezvous"] for r in records} == {"store"}
        per_rank[n] = _served(records, "startup") / n
        assert sum(r["connections"] for r in records) == 2 * n
        # gloo's group connects its pairs lazily: at start-up only the exchange itself (its reads of a peer's
        # address come when the pair first carries a message, answered in the rank too: no store call in
        # training, test_training_sends_no_store_request_per_watchdog_tick)
        assert all(r["local_calls"] == 1 for r in records), [r["local_calls"] for r in records]
    assert per_rank[2] >= per_rank[4] >= per_rank[8], per_rank
    assert per_rank[8] <= 6, per_rank


@pytest.mark.processes
def test_a_full_mesh_reads_every_address_in_the_rank(tmp_path: Path, venv_bin: Path) -> None:
    """With lazy pairs off (TORCH_GLOO_LAZY_INIT=0) gloo connects the full mesh at start-up: its 2 N + 1 reads of
    the addresses are answered in the rank, from the one exchange, and rank 0 serves the same 5 N + 1 calls."""
    records = _run("local", 4, 1, 0.0, tmp_path / "mesh", venv_bin, TORCH_GLOO_LAZY_INIT="0")
    assert all(r["local_calls"] == 2 * 4 + 1 for r in records), [r["local_calls"] for r in records]
    assert _served(records, "startup") <= 6 * 4


@pytest.mark.processes
def test_training_sends_no_store_request_per_watchdog_tick(tmp_path: Path, venv_bin: Path) -> None:
    """Steps a watchdog tick apart: every rank's watchdog ticks at least ``steps`` times, and the server gets no
    call in training however many (the watchdog polled it every tick: N per tick). At close, one call per rank and
    one more by rank 0, whatever the number of steps."""
    for steps in (2, 8):
        records = _run("local", 4, steps, 0.5, tmp_path / f"k{steps}", venv_bin)
        assert all(r["tick_s"] <= 0.5 for r in records)
        assert _served(records, "train") == 0, [r["calls"] for r in records]
        assert _served(records, "close") == 4 + 1, [r["calls"] for r in records]


@pytest.mark.mpi
def test_gloo_under_mpiexec_bootstraps_over_mpi_without_a_store(tmp_path: Path, venv_bin: Path) -> None:
    records = _run("mpiexec", 4, 3, 0.5, tmp_path / "mpi", venv_bin)
    for r in records:
        assert (r["server"], r["rendezvous"], r["connections"], r["calls"]) == ("none", "mpi", 0, {}), r
        assert r["local_calls"] == 1, r  # the exchange; pairs connect lazily


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_store_listener_rearms_its_wait_and_answers_a_late_ranks_question() -> None:
    """A listener whose wait ended unanswered waits again on the same connection (no reply is mistaken for
    another's), answers a question with the collective it reached, and stops at close."""
    import torch.distributed as dist

    from hpctrain.runtime.comm.exchange_store import CountingStore
    from hpctrain.runtime.comm.liveness import StoreQueries

    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=10), wait_for_workers=False)
    calls: list[str] = []
    rearmed = threading.Event()

    def count(op: str) -> None:
        calls.append(op)
        if calls.count("wait") >= 4:
            rearmed.set()

    def connect() -> Any:
        client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10), wait_for_workers=False)
        return CountingStore(client, count)

    queries = StoreQueries(connect, 1, 2, lambda: 5, listen_s=0.2, abort_wait_s=0.2)
    assert rearmed.wait(30)
    server.set("hpctrain/ask/1", "7")
    server.wait(["hpctrain/now/1"], timedelta(seconds=30))
    assert server.get("hpctrain/now/1") == b"5"
    queries.close(server, serving=False, timeout_s=30)
    assert not queries._thread.is_alive()


def test_exchange_store_without_a_fallback_names_what_it_was_asked() -> None:
    from hpctrain.errors import RuntimeFailure
    from hpctrain.runtime.comm.exchange_store import ExchangeStore

    store = ExchangeStore(1, lambda prefix, value: [b"a", value, b"c"])
    store.set("pg/0/cpu/1", b"mine")
    assert [store.get(f"pg/0/cpu/{r}") for r in range(3)] == [b"a", b"mine", b"c"]
    store.wait(["pg/0/cpu/0", "pg/0/cpu/2"])
    assert store.check(["pg/0/cpu/2"]) and store.exchanges == 1
    with pytest.raises(RuntimeFailure, match="asked to add to 'barrier'"):
        store.add("barrier", 1)
