"""One checkpoint file per node: checkpoint/node_file.py, the manifest's grammar for it, and the store's per-node
layout on real ranks.

The ranks are 2 "nodes" of 2 processes on this machine (tests/mp_helpers/nodes.py: torchrun's variables, gloo,
and a node-local directory per node), the stand-in for a multi-node job this machine allows. Exact resume and
the corrupt-file fallback through ``hpctrain run`` (default layout: node) are in tests/test_resume.py.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.manifest import Checkpoint, FileRecord, node_filename, rank_runs
from hpctrain.checkpoint.node_file import pack, read_index, read_member
from hpctrain.checkpoint.store import CheckpointStore
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
    checksum, index = read_index(node)
    assert checksum == "sha256" and sorted(index) == [4, 5, 6] and [m.rank for m in written] == [4, 5, 6]
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
        read_index(node)


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
    for e in entries:  # 4 ranks, 3 files: the shared state and one file per node, named after its first rank
        files = {f["name"]: f for f in e["files"]}
        assert set(files) == {"shared.pt", "node-00000.pt", "node-00002.pt"}
        assert files["node-00000.pt"]["ranks"] == [[0, 2]] and files["node-00002.pt"]["ranks"] == [[2, 4]]
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


def _step_dir_ops(trace_dir: Path, sdir: Path) -> dict[str, int]:
    """mkdir and fsync calls on ``sdir`` itself, summed over every traced process (strace -y names the fd)."""
    target = str(sdir)
    ops = {"mkdir": 0, "fsync": 0}
    for trace in trace_dir.iterdir():
        for line in trace.read_text().splitlines():
            call = line.split("(", 1)[0].strip()
            if call in ("mkdir", "mkdirat") and f'"{target}"' in line:
                ops["mkdir"] += 1
            elif call in ("fsync", "fdatasync") and f"<{target}>" in line:
                ops["fsync"] += 1
    return ops


@pytest.mark.parametrize("per_node", [1, 2, 4])
def test_per_save_step_directory_work_is_per_node_not_per_rank(tmp_path: Path, per_node: int) -> None:
    """2 stand-in nodes of 1, 2, 4 ranks, every process traced: one mkdir of the step directory (rank 0), and an
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
        ops = _step_dir_ops(traces, root / f"step-{step:08d}")
        assert ops == {"mkdir": 1, "fsync": len(nodes)}, (step, ops)
        assert ops["mkdir"] + ops["fsync"] <= len(nodes) + 2
