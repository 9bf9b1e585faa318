"""One checkpoint file per node: checkpoint/node_file.py, the manifest's grammar for it, and the store's per-node
layout on real ranks.

The ranks are 2 "nodes" of 2 processes on this machine (tests/mp_helpers/nodes.py: torchrun's variables, gloo,
and a node-local directory per node), the stand-in for a multi-node job this machine allows. Exact resume and
the corrupt-file fallback through ``hpctrain run`` (default layout: node) are in tests/test_resume.py.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import shutil
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from hpctrain.checkpoint.manifest import (
    FORMAT_VERSION,
    Checkpoint,
    FileRecord,
    NodeFiles,
    file_digest,
    node_filename,
    rank_runs,
)
from hpctrain.checkpoint.node_file import pack, read_member, read_node_index
from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.checkpoint.store_fields import NodeGroup
from tests.mp_helpers.nodes import run_on_nodes

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "mp_helpers" / "scale_worker.py")


def _states(tmp_path: Path, ranks: list[int]) -> list[tuple[int, Path]]:
    out = []
    for r in ranks:
        path = tmp_path / f"r{r}.pt"
        torch.save({"rank": r, "x": torch.full((100,), float(r))}, path)
        out.append((r, path))
    return out


def test_node_file_round_trip_reads_one_member_at_a_time(tmp_path: Path) -> None:
    members = _states(tmp_path, [4, 5, 6])
    node = tmp_path / "node-00004.pt"
    with open(node, "wb") as f:
        written = pack(f, members, "sha256")
    read = read_node_index(node)
    index = read.members
    assert read.checksum == "sha256" and sorted(index) == [4, 5, 6] and list(written.members) == [4, 5, 6]
    for r, path in members:
        assert read_member(node, r) == path.read_bytes()
        assert torch.load(io.BytesIO(read_member(node, r)), weights_only=True)["rank"] == r
    with pytest.raises(ValueError, match="no state of rank 7"):
        read_member(node, 7)
    data = bytearray(node.read_bytes())
    data[index[5].offset + 10] ^= 0x01  # one bit of rank 5's state
    node.write_bytes(bytes(data))
    assert read_member(node, 4) == members[0][1].read_bytes()  # the others are still readable
    with pytest.raises(ValueError, match="rank 5's member is corrupt"):
        read_member(node, 5)
    node.write_bytes(bytes(data[:-3]))
    with pytest.raises(ValueError, match="trailer"):
        read_node_index(node)


def test_manifest_names_node_files_and_the_ranks_they_hold() -> None:
    assert node_filename(64) == "node-00064.pt" and rank_runs([3, 1, 2, 7]) == ((1, 4), (7, 8))
    rec = FileRecord.from_json({"name": "node-00064.pt", "bytes": 10, "digest": "ab", "rank": None,
                                "ranks": [[64, 128]]})
    assert rec.holds(64) and rec.holds(127) and not rec.holds(128) and rec.to_json()["ranks"] == [[64, 128]]
    for bad in ({"ranks": []}, {"ranks": [[5, 5]]}, {"ranks": [[-1, 2]]}, {}):
        with pytest.raises(ValueError, match="does not say which ranks"):
            FileRecord.from_json({"name": "node-00000.pt", "bytes": 1, "digest": "x", **bad})
    for name in ("node-1.pt", "../node-00000.pt", "node-00000.pt.tmp"):
        with pytest.raises(ValueError, match="not a checkpoint file name"):
            FileRecord.from_json({"name": name, "bytes": 1, "digest": "x", "ranks": [[0, 1]]})
    ckpt = Checkpoint(3, Path("/x"), 4, (FileRecord("shared.pt", 1, "a"), rec,
                                         FileRecord("rank-00002.pt", 1, "b", 2)), "sha256", "now")
    assert ckpt.file_for_rank(100) is rec and ckpt.file_for_rank(2).name == "rank-00002.pt"  # type: ignore[union-attr]
    assert ckpt.file_for_rank(0) is None


@pytest.mark.processes
@pytest.mark.timeout(400)
def test_two_nodes_write_one_file_each_resume_fall_back_and_fail_together(tmp_path: Path) -> None:
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for d in nodes:
        d.mkdir()
    root = tmp_path / "run" / "checkpoints"
    results = run_on_nodes([sys.executable, WORKER, "checkpoint", str(root)], 2, 2, nodes, timeout=380,
                           HPCTRAIN_COUNTERS="1")
    assert [r.returncode for r in results] == [0] * 4, "\n".join(r.stdout[-3000:] for r in results)

    entries = json.loads((root / "manifest.json").read_text())["checkpoints"]
    assert [e["step"] for e in entries] == [1, 2]
    for e in entries:  # 4 ranks, 3 files: the shared state listed, the node files described (2 files of 2 ranks)
        assert [f["name"] for f in e["files"]] == ["shared.pt"] and e["format_version"] == 2
        assert e["nodes"]["count"] == 2 and e["nodes"]["ranks_per_file"] == 2
        ckpt = Checkpoint.from_json(root, e)
        assert [(f.name, f.ranks) for f in ckpt.all_files()] == [
            ("shared.pt", ()), ("node-00000.pt", ((0, 2),)), ("node-00002.pt", ((2, 4),))]
    out = [json.loads((root / f"result-{r}.json").read_text()) for r in range(4)]
    assert all(o["after_save"] == 2 for o in out)
    assert all(o["chosen"] == 1 for o in out)  # rank 3's member of step 2 was damaged: every rank fell back
    assert [(o["rank_field"], o["x"]) for o in out] == [(r, [10.0 + r] * 4) for r in range(4)]
    assert all(o["w"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] for o in out)
    # a rank whose state could not be written failed the save on every rank, naming it; step 2 stays the newest
    assert all(o["error"] and "rank 1" in o["error"] for o in out), [o["error"] for o in out]
    assert all(o["newest"] == 2 for o in out) and not (root / "step-00000003").exists()
    assert not any(o["scratch_left"] for o in out) and [list(d.iterdir()) for d in nodes] == [[], []]

    records = [json.loads((tmp_path / "run" / "counters" / f"rank-{r:05d}.json").read_text()) for r in range(4)]
    for record in records:  # per save: rank 0 writes shared.pt and its node's file, rank 2 its node's file
        r, saves = record["rank"], record["work"]["checkpoints"]
        shared_files = {0: 2, 1: 0, 2: 1, 3: 0}[r]
        for step in ("1", "2"):
            assert saves[step]["files"] == shared_files and saves[step]["node_local_files"] == 1, record

    # elastic restart on one rank: only shared.pt is read, so step 2 (with its damaged member) is usable
    single = CheckpointStore(root)
    ckpt = single.latest_valid()
    assert ckpt is not None and ckpt.step == 2
    shared, mine = single.load(ckpt, warn=False)
    assert mine is None and shared["w"].tolist() == out[0]["w"]


def _benchmark() -> Any:
    """benchmarks/checkpoint_scale.py: the tracing and counting this file's count tests share with it."""
    spec = importlib.util.spec_from_file_location("checkpoint_scale", REPO / "benchmarks" / "checkpoint_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.processes
@pytest.mark.parametrize("per_node", [1, 4])
def test_per_save_step_directory_work_is_per_node_not_per_rank(tmp_path: Path, per_node: int) -> None:
    """2 stand-in nodes of 1 and of 4 ranks, every process traced: one mkdir of the step directory (rank 0), and an
    fsync of it only by the ranks that wrote into it; per save at most nodes + 2, whatever the ranks per node."""
    assert shutil.which("strace"), "strace counts the ranks' system calls: run bash scripts/install.sh"
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for d in nodes:
        d.mkdir()
    root, traces = tmp_path / "ckpt", tmp_path / "traces"
    traces.mkdir()
    tracer = ["strace", "-f", "-ff", "-qq", "-y", "-e", "trace=mkdir,mkdirat,fsync,fdatasync", "-o",
              str(traces / "t")]
    results = run_on_nodes([*tracer, sys.executable, WORKER, "checkpoint-saves", str(root)], 2, per_node, nodes,
                           timeout=380)
    assert [r.returncode for r in results] == [0] * len(results), "\n".join(r.stdout for r in results)
    for step in (1, 2):
        ops = _benchmark().step_dir_ops(traces, root / f"step-{step:08d}")
        assert ops == {"mkdir": 1, "fsync": len(nodes)}, (step, ops)
        assert ops["mkdir"] + ops["fsync"] <= len(nodes) + 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_checkpoint_shared_work_grows_with_nodes_not_ranks(tmp_path: Path) -> None:
    """2 and 6 ranks on stand-in nodes of 2 (a middle node too), every rank traced (benchmarks/checkpoint_scale.py):
    per save one mkdir of the step directory and one fsync per node; rank 0 receives the same bytes of records at
    every size (one fixed-size all-reduce, no gather); manifest and marker do not grow; at resume the node's
    reader alone reads the manifest and shared.pt, once each, the other ranks none of it, and every rank reads
    its own member of its node file, not the whole file and no other node's."""
    assert shutil.which("strace"), "strace counts the ranks' system calls: run bash scripts/install.sh"
    bench = _benchmark()
    found = []
    for n_nodes in (1, 3):
        m = bench.measure(n_nodes, 2, tmp_path / f"n{n_nodes}")
        for ops in m["step_dir_ops"]:
            assert ops == {"mkdir": 1, "fsync": n_nodes} and sum(ops.values()) <= n_nodes + 2, (n_nodes, ops)
        assert "node-" not in m["manifest"] and "node-" not in m["marker"] and f'"count": {n_nodes}' in m["marker"]
        manifest_bytes = len(m["manifest"].encode())
        for r, got in enumerate(m["resume"]):
            assert got["resumed"] == {"step": 2, "w": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "rank": r, "x": [20.0 + r] * 4}
            reader = r % 2 == 0
            assert got["shared"] == (manifest_bytes + m["shared_pt_bytes"] if reader else 0), (n_nodes, r, got)
            own = node_filename(r - r % 2)
            assert list(got["node_files"]) == [own], (n_nodes, r, got)
            assert 0 < got["node_files"][own] < m["node_file_bytes"][own], (n_nodes, r, got)
        found.append((m["rank0_record_bytes"], manifest_bytes, len(m["marker"].encode())))
    assert found[0][0][0] > 0 and found == [found[0]] * 2, found  # the same at 2 and 6 ranks


class _Threads:
    """An all-gather among ``n`` threads of this process: each thread is one rank of an in-process job."""

    def __init__(self, n: int) -> None:
        self.n, self.slots, self.barrier = n, [None] * n, threading.Barrier(n, timeout=60)

    def gather_for(self, rank: int) -> Callable[[object], list[object]]:
        def gather(obj: object) -> list[object]:
            self.slots[rank] = obj
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out
        return gather


def _on_threads(fn: Callable[[int], object], n: int) -> list[object]:
    """``fn(rank)`` on ``n`` threads at once; their results, or the first exception raised."""
    with ThreadPoolExecutor(n) as pool:
        return [f.result() for f in [pool.submit(fn, r) for r in range(n)]]


def _stores(root: Path, scratch: Path, n: int, per_node: int) -> list[CheckpointStore]:
    threads = _Threads(n)
    return [CheckpointStore(root, keep=3, rank=r, world_size=n, gather=threads.gather_for(r),
                            node=NodeGroup(r % per_node, per_node, scratch / f"node{r // per_node}" / "x", 60))
            for r in range(n)]


def _save_two(root: Path, scratch: Path, states: Callable[[int, int], dict | None]) -> None:
    stores = _stores(root, scratch, 4, 2)

    def save(r: int) -> None:
        for step in (1, 2):
            stores[r].save(step, {"w": torch.full((3,), float(step))} if r == 0 else {}, per_rank=states(step, r))
        stores[r].close()
    _on_threads(save, 4)


def _resume(root: Path, scratch: Path) -> list[tuple[int, list[float], dict | None]]:
    stores = _stores(root, scratch, 4, 2)

    def resume(r: int) -> tuple[int, list[float], dict | None]:
        ckpt = stores[r].latest_valid()
        assert ckpt is not None
        shared, mine = stores[r].load(ckpt)
        return ckpt.step, shared["w"].tolist(), mine
    return _on_threads(resume, 4)  # type: ignore[return-value]


def test_a_tampered_index_sum_falls_back_on_every_rank(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every rank's own member is intact, but the node indices no longer add up to what the commit recorded (a
    node file of another save): every rank skips the step, together."""
    root, scratch = tmp_path / "ckpt", tmp_path / "local"
    _save_two(root, scratch, lambda step, r: {"x": torch.full((2,), 10.0 * step + r)})
    assert [s for s, _, _ in _resume(root, scratch)] == [2] * 4
    marker = root / "step-00000002" / "complete.json"
    total = json.loads(marker.read_text())["nodes"]["index_sum"]
    for path in (root / "manifest.json", marker):
        text = path.read_text()
        assert text.count(total) == 1
        path.write_text(text.replace(total, f"{int(total[:16], 16) + 1:016x}{total[16:]}"))
    caplog.set_level(logging.WARNING, "hpctrain.checkpoint")
    got = _resume(root, scratch)
    assert [(s, w, mine["x"].tolist()) for s, w, mine in got] == [(1, [1.0] * 3, [10.0 + r] * 2) for r in range(4)]
    assert any("do not add up" in m for m in caplog.messages), caplog.messages


def test_nodes_that_are_not_regular_are_listed_and_resume(tmp_path: Path) -> None:
    """A rank without state (its node file holds one rank, the other two): the node files cannot be described by
    count and size, so their records are gathered and listed (format 1, as before); resume reads them."""
    root, scratch = tmp_path / "ckpt", tmp_path / "local"
    _save_two(root, scratch, lambda step, r: None if r == 1 else {"x": torch.full((2,), 10.0 * step + r)})
    entry = json.loads((root / "manifest.json").read_text())["checkpoints"][-1]
    assert entry["format_version"] == 1 and "nodes" not in entry
    assert {f["name"]: f.get("ranks") for f in entry["files"]} == {"shared.pt": None, "node-00000.pt": [[0, 1]],
                                                                   "node-00002.pt": [[2, 4]]}
    got = _resume(root, scratch)
    assert [(s, w) for s, w, _ in got] == [(2, [2.0] * 3)] * 4
    assert [None if m is None else m["x"].tolist() for _, _, m in got] == [[20.0] * 2, None, [22.0] * 2, [23.0] * 2]


def test_a_checkpoint_of_the_previous_format_resumes_exactly(tmp_path: Path) -> None:
    """The entry an earlier hpctrain wrote lists every node file with its size and digest (format 1): this one
    reads it, every rank its own state; and an entry of a newer format is refused, naming its version."""
    root, scratch = tmp_path / "ckpt", tmp_path / "local"
    _save_two(root, scratch, lambda step, r: {"x": torch.full((2,), 10.0 * step + r)})
    manifest = json.loads((root / "manifest.json").read_text())
    for e in manifest["checkpoints"]:
        sdir = root / e["dir"]
        for first in (0, 2):
            size, digest = file_digest(sdir / node_filename(first), e["checksum"])
            e["files"].append({"name": node_filename(first), "bytes": size, "digest": digest, "rank": None,
                               "ranks": [[first, first + 2]]})
        del e["nodes"]
        e["format_version"] = 1
        (sdir / "complete.json").write_text(json.dumps(e))
    manifest["format_version"] = 1
    (root / "manifest.json").write_text(json.dumps(manifest))
    got = _resume(root, scratch)
    assert [(s, w, m["x"].tolist()) for s, w, m in got] == [(2, [2.0] * 3, [20.0 + r] * 2) for r in range(4)]
    newer = {**manifest["checkpoints"][-1], "format_version": FORMAT_VERSION + 1}
    with pytest.raises(ValueError, match=f"format version {FORMAT_VERSION + 1} is newer"):
        Checkpoint.from_json(root, newer)


def test_resume_copies_leave_node_local_storage_at_the_next_save(tmp_path: Path) -> None:
    """The node's reader leaves the manifest and shared.pt in node-local storage for its node's ranks; the next
    save (every rank of the node has handed its state over, so none is still loading) removes them."""
    root, scratch = tmp_path / "ckpt", tmp_path / "local"
    _save_two(root, scratch, lambda step, r: {"x": torch.full((2,), 10.0 * step + r)})
    stores = _stores(root, scratch, 4, 2)

    def resume_then_save(r: int) -> list[str]:
        ckpt = stores[r].latest_valid()
        assert ckpt is not None
        stores[r].load(ckpt)
        left = sorted(p.name for p in (scratch / f"node{r // 2}" / "x" / "resume").iterdir())
        stores[r].save(3, {"w": torch.zeros(3)} if r == 0 else {}, per_rank={"x": torch.zeros(2)})
        return left
    assert _on_threads(resume_then_save, 4) == [["entries.json", "shared.pt.00000002"]] * 4
    assert not (scratch / "node0" / "x" / "resume").exists() and not (scratch / "node1" / "x" / "resume").exists()


def test_node_files_record_rejects_malformed_descriptions() -> None:
    good = {"count": 2, "ranks_per_file": 4, "index_sum": "0" * 128}
    nodes = NodeFiles.from_json(good)
    assert nodes.record_for(5) == FileRecord("node-00004.pt", -1, "", None, ((4, 8),)) and nodes.record_for(8) is None
    assert NodeFiles.from_json(nodes.to_json()) == nodes
    for bad in ({"count": 0}, {"ranks_per_file": 0}, {"index_sum": "0" * 127}, {"index_sum": "-" + "0" * 127},
                {"index_sum": "G" * 128}):
        with pytest.raises(ValueError, match="malformed"):
            NodeFiles.from_json({**good, **bad})
    entry = {"step": 1, "dir": "step-00000001", "world_size": 6, "checksum": "sha256", "created": "now",
             "files": [], "nodes": good}
    with pytest.raises(ValueError, match="do not hold its 6 ranks"):
        Checkpoint.from_json(Path("/x"), entry)
