"""Worker for tests/test_comm_counts.py, started by a real launcher (the MPICH wheel's mpiexec).

``python scale_worker.py counts BACKEND RUN_DIR``   makes a known set of collectives of known sizes through
                                                   ``make_communicator`` (counted when HPCTRAIN_COUNTERS=1),
                                                   checks the gathers' results, writes this rank's record
``python scale_worker.py ffn-input BACKEND RUN_DIR``  builds the FFN task of a small synthetic volume, takes one
                                                   batch, and writes this rank's record (with how its volume is
                                                   held), its epoch-0 coordinate share (share-R.npy) and the
                                                   table rows it was dealt (rows-R.npy)
``python scale_worker.py checkpoint ROOT``        per-node checkpoint files over gloo: two saves, a corrupt member,
                                                   a failed save; writes result-R.json and this rank's record
``python scale_worker.py checkpoint-saves ROOT``  two saves, nothing else (what a tracer counts); this rank's
                                                   record when HPCTRAIN_COUNTERS=1
``python scale_worker.py checkpoint-resume ROOT`` finds and loads the newest checkpoint of ``checkpoint-saves``;
                                                   writes resumed-R.json (the step and the states it loaded)
``python scale_worker.py rendezvous TIMEOUT DELAY STAGE DIR``  rank 0 is DELAY s late to MPI_Init (STAGE init:
                                                   late after the others wrote DIR/waiting-R, just before they
                                                   entered it) or to the address broadcast (address); every rank
                                                   prints the address it got over MPI or the error that ended its
                                                   wait
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.runtime.comm.backends import make_communicator  # noqa: E402
from hpctrain.runtime.counting import counters, work_counts  # noqa: E402

# (label, float32 elements): every rank all-reduces each of these this many times
ALLREDUCES = (("bucket 0", 1000), ("stop flag", 2))
REPEATS = 5


def counts(backend: str, run_dir: str) -> None:
    comm = make_communicator(backend, timeout_s=60)
    r, n = comm.rank, comm.size
    for _ in range(REPEATS):
        for label, k in ALLREDUCES:
            t = torch.full((k,), float(r))
            comm.allreduce_(t, "sum", label)
            assert torch.equal(t, torch.full((k,), float(n * (n - 1) / 2)))
    work_counts.step_done()  # what follows is counted in the "train" phase
    got = comm.gather(torch.tensor([r, 10 * r], dtype=torch.int64), root=0, label="checkpoint report")
    if r == 0:
        assert got is not None and [g.tolist() for g in got] == [[q, 10 * q] for q in range(n)]
    else:
        assert got is None
    varlen = comm.gather_varlen(torch.arange(r + 1, dtype=torch.float64), root=0, label="checkpoint files")
    if r == 0:
        assert varlen is not None and [v.tolist() for v in varlen] == [list(map(float, range(q + 1)))
                                                                        for q in range(n)]
    else:
        assert varlen is None
    comm.barrier("checkpoint done")
    comm.close()
    print(counters.write_record(run_dir, r, n, **work_counts.sections()), flush=True)


def rendezvous(timeout_s: float, delay_s: float, stage: str, sync_dir: str) -> None:
    import time
    from pathlib import Path

    from hpctrain.errors import RuntimeFailure
    from hpctrain.launch_env import detect_launch_env
    from hpctrain.runtime.comm.mpi_env import import_mpi
    from hpctrain.runtime.comm.rendezvous import rendezvous_address

    env = detect_launch_env(os.environ)
    if stage == "init":
        # Rank 0 is late counting from when the others enter MPI_Init, not from the launch: on a loaded machine a
        # rank's start-up (interpreter, imports) once took longer than the delay, and it then met rank 0 in
        # MPI_Init instead of waiting there for it.
        waiting = [Path(sync_dir) / f"waiting-{r}" for r in range(1, env.size)]
        if env.rank == 0:
            deadline = time.monotonic() + 120
            while not all(p.exists() for p in waiting) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(delay_s)
        else:
            waiting[env.rank - 1].touch()
    import_mpi(timeout_s=timeout_s if stage == "init" else 120.0)  # MPI_Init alone may take seconds here
    if stage == "address" and env.rank == 0:
        time.sleep(delay_s)
    try:
        host, port = rendezvous_address(env, os.environ, timeout_s)
        print(f"rank {env.rank} address {host}:{port}", flush=True)
    except RuntimeFailure as exc:
        print(f"rank {env.rank} failed: {exc}", flush=True)
    os._exit(0)  # a broadcast some rank gave up on is still posted: no MPI_Finalize


FFN_ARGS = {"depth": 1, "features": 4, "fov": [7, 7, 7], "deltas": [2, 2, 2]}
FFN_DATA = {"train": {"synthetic": {"shape": [20, 28, 28], "seed": 3}}}
FFN_SEED = 3


def ffn_input(backend: str, run_dir: str) -> None:
    from pathlib import Path

    import numpy as np

    from hpctrain.ffn.training.shards import epoch_share, rank_ranges
    from hpctrain.ffn.training.task import FFNTask
    from hpctrain.launch_env import detect_launch_env
    from hpctrain.models.task import TaskContext

    torch.set_num_threads(1)
    env = detect_launch_env(os.environ)
    comm = make_communicator(backend, timeout_s=120)
    ctx = TaskContext(model_args=FFN_ARGS, data=FFN_DATA, batch_per_rank=2, seed=FFN_SEED, rank=comm.rank,
                      world_size=comm.size, run_dir=Path(run_dir), device=torch.device("cpu"),
                      barrier=lambda: comm.barrier("data preparation"), local_rank=env.local_rank,
                      agree=lambda error: comm.agree(error, "data preparation"))  # as the trainer builds it
    task = FFNTask(ctx)
    task.next_batch()  # the first batch reads this rank's epoch-0 share
    volume = {"mapped": isinstance(task.image, np.memmap) and isinstance(task.labels, np.memmap),
              "bytes": int(task.image.nbytes + task.labels.nbytes), "local_rank": env.local_rank,
              "node": env.node_rank}
    counters.write_record(run_dir, comm.rank, comm.size, **work_counts.sections(), volume=volume,
                          coordinates={"count": task.coords.count})
    np.save(Path(run_dir) / f"share-{comm.rank}.npy", epoch_share(task.coords, comm.size, comm.rank, FFN_SEED, 0))
    rows = [np.arange(a, b) for a, b in rank_ranges(task.coords.count, comm.size, comm.rank, FFN_SEED, 0)]
    np.save(Path(run_dir) / f"rows-{comm.rank}.npy", np.concatenate(rows))
    (Path(run_dir) / "table.txt").write_text(str(task.coords.path))
    comm.close()


def _node_store(root: str, scratch_name: str, comm_timeout_s: float, node_timeout_s: float) -> tuple[Any, Any]:
    """A gloo communicator and a CheckpointStore under ``root`` whose node group is this stand-in node's ranks,
    handing state over in the node-local ``scratch_name``."""
    from hpctrain.checkpoint.exchange import CommExchange
    from hpctrain.checkpoint.store import CheckpointStore
    from hpctrain.checkpoint.store_fields import NodeGroup
    from hpctrain.config.staging import node_local_root
    from hpctrain.launch_env import detect_launch_env

    torch.set_num_threads(1)
    env = detect_launch_env(os.environ)
    comm = make_communicator("gloo", timeout_s=comm_timeout_s)
    scratch = node_local_root() / scratch_name  # type: ignore[operator]
    store = CheckpointStore(root, keep=3, rank=comm.rank, world_size=comm.size, exchange=CommExchange(comm),
                            node=NodeGroup(env.local_rank, env.local_size, scratch, timeout_s=node_timeout_s),
                            tally=work_counts.active())
    return comm, store


def checkpoint(root: str) -> None:
    import json
    from pathlib import Path

    from hpctrain.checkpoint.node_file import read_node_index
    from hpctrain.config.staging import node_local_root
    from hpctrain.errors import CheckpointError

    comm, store = _node_store(root, "hpctrain-checkpoint-test", 60, 600)
    r = comm.rank
    scratch = node_local_root() / "hpctrain-checkpoint-test"  # type: ignore[operator]
    shared = {"w": torch.arange(6.0)} if r == 0 else {}
    store.commit(store.save_async(1, shared, per_rank={"rank": r, "x": torch.full((4,), 10.0 + r)}))
    store.save(2, shared, per_rank={"rank": r, "x": torch.full((4,), 20.0 + r)})
    result: dict = {"after_save": store.latest_valid().step}  # type: ignore[union-attr]
    comm.barrier("test")
    if r == 3:  # one byte of rank 3's own state in its node's file of step 2: every rank must fall back
        path = Path(root) / "step-00000002" / "node-00002.pt"
        member = read_node_index(path).members[3]
        data = bytearray(path.read_bytes())
        data[member.offset + member.bytes // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    comm.barrier("test")
    ckpt = store.latest_valid()
    assert ckpt is not None
    got_shared, mine = store.load(ckpt)
    result.update(chosen=ckpt.step, rank_field=mine["rank"], x=mine["x"].tolist(), w=got_shared["w"].tolist())
    try:  # rank 1's state cannot be pickled: its node's local rank 0 must hear of it, not wait 600 s
        store.save(3, shared, per_rank={"rank": r, "bad": (lambda: 0)} if r == 1 else {"rank": r})
        result["error"] = None
    except CheckpointError as exc:
        result["error"] = str(exc)
    result["newest"] = store.checkpoints()[-1].step
    store.close()
    comm.barrier("test")
    result["scratch_left"] = scratch.exists()
    (Path(root) / f"result-{r}.json").write_text(json.dumps(result))
    counters.write_record(Path(root).parent, r, comm.size, **work_counts.sections())
    comm.close()


def checkpoint_saves(root: str) -> None:
    """Two saves (one in the background, one not) on stand-in nodes, nothing else: what a tracer counts."""
    from pathlib import Path

    comm, store = _node_store(root, "hpctrain-checkpoint-test", 120, 120)
    r = comm.rank
    shared = {"w": torch.arange(6.0)} if r == 0 else {}
    store.commit(store.save_async(1, shared, per_rank={"rank": r, "x": torch.full((4,), 10.0 + r)}))
    store.save(2, shared, per_rank={"rank": r, "x": torch.full((4,), 20.0 + r)})
    store.close()
    comm.barrier("test")
    counters.write_record(Path(root).parent, r, comm.size, **work_counts.sections())
    comm.close()


def checkpoint_resume(root: str) -> None:
    """A restart of ``checkpoint_saves``: the newest valid checkpoint, loaded on every rank."""
    import json
    from pathlib import Path

    comm, store = _node_store(root, "hpctrain-checkpoint-resume", 120, 120)
    r = comm.rank
    ckpt = store.latest_valid()
    assert ckpt is not None
    shared, mine = store.load(ckpt)
    assert mine is not None
    (Path(root) / f"resumed-{r}.json").write_text(json.dumps(
        {"step": ckpt.step, "w": shared["w"].tolist(), "rank": mine["rank"], "x": mine["x"].tolist()}))
    comm.barrier("test")
    store.close()
    comm.close()


if __name__ == "__main__":
    if sys.argv[1] == "counts":
        counts(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "ffn-input":
        ffn_input(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "checkpoint":
        checkpoint(sys.argv[2])
    elif sys.argv[1] == "checkpoint-saves":
        checkpoint_saves(sys.argv[2])
    elif sys.argv[1] == "checkpoint-resume":
        checkpoint_resume(sys.argv[2])
    else:
        rendezvous(float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5])
