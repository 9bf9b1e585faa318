"""Start-up lines: one per node (its host, ranks and pids), every rank's pid in ``RUN_DIR/ranks/node-NNNNN.txt``;
a job's log grows with its nodes, not with its ranks (stand-in nodes of tests/mp_helpers/nodes.py, gloo)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hpctrain.runtime.rank_list import node_file, read_ranks
from tests.mp_helpers.nodes import run_on_nodes

pytestmark = pytest.mark.timeout(600)
SPEC = """name: lines
model: resnet
model_args: {channels: 4, blocks: 1}
train: {steps: 2, batch_per_rank: 2, lr: 0.05, log_every: 1, seed: 5}
resources: {nodes: 1, ranks_per_node: 2, walltime: "00:10:00"}
"""
STARTUP = re.compile(r"hpctrain: (rank \d+ is pid|node \d+ )")


def _run(tmp_path: Path, nodes: int, per_node: int) -> tuple[list[str], Path]:
    """Every rank's output lines of a 2-step run on ``nodes`` x ``per_node`` ranks, and the run directory."""
    base = tmp_path / f"{nodes}x{per_node}"
    node_dirs = [base / f"node{n}" for n in range(nodes)]
    for d in node_dirs:
        d.mkdir(parents=True)
    spec = base / "lines.yaml"
    spec.write_text(SPEC)
    run_dir = base / "run"
    results = run_on_nodes([sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(run_dir),
                            "--backend", "gloo"], nodes, per_node, node_dirs, timeout=500)
    assert [r.returncode for r in results] == [0] * (nodes * per_node), "\n".join(r.stdout[-2000:] for r in results)
    return [line for r in results for line in r.stdout.splitlines()], run_dir


@pytest.mark.slow
def test_start_up_lines_grow_with_nodes_and_the_pids_are_in_the_run_directory(tmp_path: Path) -> None:
    counts: dict[tuple[int, int], int] = {}
    for nodes, per_node in ((1, 2), (3, 2), (1, 4)):
        lines, run_dir = _run(tmp_path, nodes, per_node)
        startup = [line for line in lines if STARTUP.search(line)]
        assert len(startup) == nodes, startup
        counts[nodes, per_node] = len(lines)
        summaries = {int(m.group(1)): m.group(2) for line in startup
                     if (m := re.search(r"node (\d+) \(.*\): \d+ ranks (\S+),", line))}
        assert summaries == {n: f"{n * per_node}-{n * per_node + per_node - 1}" for n in range(nodes)}, startup
        recorded = [r for n in range(nodes) for r in read_ranks(node_file(run_dir, n))]
        assert sorted(int(r["rank"]) for r in recorded) == list(range(nodes * per_node))
        assert len({r["pid"] for r in recorded}) == nodes * per_node
    # one more line per node, none per rank: 2 ranks on a node or 4 print as much
    assert counts[3, 2] - counts[1, 2] == 2, counts
    assert counts[1, 4] == counts[1, 2], counts
