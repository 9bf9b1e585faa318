"""ffn/training/shards.py and ffn/training/node_volume.py: each rank reads K/N coordinates per epoch, one process
per node reads the training volume.

The rank-level tests run real ranks: 4 under the MPICH wheel's mpiexec (one node), and 2 real nodes of 2 ranks of
the cluster of namespace nodes (srun, gloo).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpctrain.errors import DataError
from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5
from hpctrain.ffn.training import node_volume
from hpctrain.ffn.training.coordinates import write_coordinates
from hpctrain.ffn.training.shards import (
    RECORD,
    CoordinateTable,
    chunk_size,
    coordinate_stream,
    epoch_share,
    rank_ranges,
    write_table,
)
from hpctrain.runtime.counting import work_counts
from tests.cluster_support import Cluster, srun
from tests.mp_helpers.nodes import clean_environment

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "mp_helpers" / "scale_worker.py")
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def _table(tmp_path: Path, count: int) -> CoordinateTable:
    """A table whose coordinate i is (i, 2i, 3i), so a coordinate names its row."""
    coords = np.stack([np.arange(count), 2 * np.arange(count), 3 * np.arange(count)], axis=1)
    return CoordinateTable(write_table(write_coordinates(tmp_path / "coords.npz", coords), tmp_path))


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> work_counts.WorkCounts:
    """Work counting on for this test only (no audit hook: that one cannot be removed from the test process)."""
    counts = work_counts.WorkCounts()
    monkeypatch.setattr(work_counts, "_counts", counts)
    return counts


@pytest.mark.parametrize(("count", "world"), [(10_007, 1), (10_007, 3), (10_007, 64), (100, 7), (65, 64)])
def test_ranks_shares_are_disjoint_whole_and_change_every_epoch(tmp_path: Path, count: int, world: int) -> None:
    table = _table(tmp_path, count)
    per_rank = count // world
    firsts = []
    for epoch in range(3):
        shares = [epoch_share(table, world, r, seed=5, epoch=epoch) for r in range(world)]
        rows = np.concatenate([s[:, 0] for s in shares])
        assert all(len(s) == per_rank for s in shares)
        assert len(np.unique(rows)) == per_rank * world  # disjoint: no coordinate twice in an epoch
        assert all(np.array_equal(s[:, 1], 2 * s[:, 0]) for s in shares)  # rows read whole, at their offsets
        firsts.append(shares[0][:, 0].tolist())
    if per_rank > 1:
        assert firsts[0] != firsts[1] != firsts[2]


def test_a_rank_reads_its_share_only_in_a_few_contiguous_reads(tmp_path: Path, counted: work_counts.WorkCounts) -> None:
    count, world = 200_000, 16
    table = _table(tmp_path, count)
    header = counted.inputs["coordinates"].bytes  # the .npy header, read once at open
    reads_before = counted.inputs["coordinates"].reads
    epoch_share(table, world, 5, seed=1, epoch=0)
    tally = counted.inputs["coordinates"]
    assert tally.by_epoch == {"0": (count // world) * RECORD}  # exactly this rank's K/N coordinates
    assert tally.bytes == header + (count // world) * RECORD
    # chunks of count // (world * 8) coordinates: about 8 of them, one more where the share starts mid-chunk,
    # one more where the rotation wraps around the end of the table
    assert tally.reads - reads_before <= 8 + 2 + 1
    assert chunk_size(count, world) == count // (world * 8)
    ranges = rank_ranges(count, world, 5, 1, 0)
    assert sum(b - a for a, b in ranges) == count // world


def test_stream_resumes_where_it_left_off_across_epochs(tmp_path: Path) -> None:
    table = _table(tmp_path, 103)
    full = [tuple(c) for _, c in zip(range(80), coordinate_stream(table, 1, 2, seed=4), strict=False)]
    resumed = [tuple(c) for _, c in zip(range(30), coordinate_stream(table, 1, 2, seed=4, start=50), strict=False)]
    assert resumed == full[50:80]  # 51 per epoch: crosses from epoch 0 into epoch 1


def test_table_is_written_once_and_a_bad_one_is_named(tmp_path: Path) -> None:
    coords = write_coordinates(tmp_path / "c.npz", np.zeros((10, 3), dtype=np.int64))
    first = write_table(coords, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert write_table(coords, tmp_path) == first and first.stat().st_mtime_ns == stamp
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 2), dtype=np.int64))
    with pytest.raises(DataError, match="coordinate table is \\(K, 3\\) int64"):
        CoordinateTable(wrong)
    with pytest.raises(DataError, match="cannot be shared by 11 ranks"):
        rank_ranges(10, 11, 0, 0, 0)


def test_one_process_copies_the_volume_and_every_rank_maps_it(tmp_path: Path, counted: work_counts.WorkCounts) -> None:
    image, labels = make_synthetic_volume((12, 16, 16), seed=1)
    h5 = write_hdf5(tmp_path / "v.h5", image, labels)
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    env = {"HPCTRAIN_NODE_LOCAL": str(node_dir)}
    calls: list[int] = []
    got = node_volume.node_volumes(f"{h5}:image", f"{h5}:labels", local_rank=0, run_dir=tmp_path,
                                   barrier=lambda: calls.append(1), in_memory_bytes=2**30, environ=env)
    assert isinstance(got[0], np.memmap) and np.array_equal(got[0], image) and np.array_equal(got[1], labels)
    assert len(calls) == 2 and list(node_dir.iterdir()) == []  # the copy is unlinked once mapped
    assert counted.inputs["volume"].bytes == image.nbytes + labels.nbytes
    # volumes already on node-local storage are opened where they are: no copy, nothing read twice
    local_h5 = write_hdf5(node_dir / "v.h5", image, labels)
    direct = node_volume.node_volumes(f"{local_h5}:image", f"{local_h5}:labels", local_rank=0, run_dir=tmp_path,
                                      barrier=lambda: calls.append(1), in_memory_bytes=2**30, environ=env)
    assert not isinstance(direct[0], np.memmap) and np.array_equal(direct[0], image)
    assert sorted(p.name for p in node_dir.iterdir()) == ["v.h5"] and len(calls) == 4


def _records(run_dir: Path, world: int) -> list[dict]:
    return [json.loads((run_dir / "counters" / f"rank-{r:05d}.json").read_text()) for r in range(world)]


def _check_ffn_input(run_dir: Path, world: int, readers: set[int]) -> None:
    records = _records(run_dir, world)
    count = records[0]["coordinates"]["count"]
    table = np.load((run_dir / "table.txt").read_text())
    for r in range(world):  # a rank's share is the rows it was dealt, read whole (coordinates repeat in a table)
        share, rows = np.load(run_dir / f"share-{r}.npy"), np.load(run_dir / f"rows-{r}.npy")
        assert len(share) == len(rows) == count // world
        assert sorted(map(tuple, share)) == sorted(map(tuple, table[rows]))
    dealt = np.concatenate([np.load(run_dir / f"rows-{r}.npy") for r in range(world)])
    assert len(np.unique(dealt)) == (count // world) * world  # disjoint across ranks
    for record in records:
        work, volume = record["work"], record["volume"]
        assert work["inputs"]["coordinates"]["by_epoch"] == {"0": (count // world) * RECORD}
        assert volume["mapped"], record
        read = work["inputs"].get("volume", {}).get("bytes", 0)
        assert read == (volume["bytes"] if record["rank"] in readers else 0), record
    assert {r["rank"] for r in records if r["volume"]["local_rank"] == 0} == readers
    # rank 0 prepares the data (partitions from the labels, statistics of the image) and writes its node's copy:
    # the shared path's volume bytes it reads are one volume's, the copy comes from what the preparation read
    assert records[0]["work"]["inputs"]["volume"]["bytes"] == records[0]["volume"]["bytes"], records[0]


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_four_ranks_under_mpiexec_read_their_share_and_the_volume_once(tmp_path: Path) -> None:
    out = subprocess.run([MPIEXEC, "-n", "4", sys.executable, WORKER, "ffn-input", "mpi", str(tmp_path)],
                         capture_output=True, text=True, timeout=380, cwd=REPO,
                         env=clean_environment(HPCTRAIN_COUNTERS="1"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check_ffn_input(tmp_path, 4, readers={0})


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_two_real_nodes_of_two_ranks_read_the_volume_once_per_node(cluster: Cluster, cluster_tmp: Path) -> None:
    """On the cluster of namespace nodes: each node's copy goes to its own /dev/shm (no staging), so the node that
    reads is the node whose ranks map it; the readers are told apart by the host they ran on."""
    run_dir = cluster_tmp / "run"
    out = srun(cluster, [sys.executable, WORKER, "ffn-input", "gloo", str(run_dir)], nodes=2, per_node=2,
               cwd=cluster_tmp, options=["--mpi=none"], timeout=500,
               env=clean_environment(HPCTRAIN_COUNTERS="1") | {"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    _check_ffn_input(run_dir, 4, readers={0, 2})
    hosts = {r["rank"]: r["host"] for r in _records(run_dir, 4)}
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and {hosts[0], hosts[2]} <= set(cluster.nodes), hosts
    for node in {hosts[0], hosts[2]}:  # each node's copy unlinked after mapping
        assert cluster.run(node, "sh", "-c", "ls -A /dev/shm | grep -c hpctrain-volume || true").stdout.strip() == "0"
