"""Which node each rank of an attempt runs on: ``RUN_DIR/rank-nodes.json``, written whole by rank 0 at start from one
collective (runtime/node_stats.py), read by whatever names the ranks on a node (the straggler watch, blame, the
report).

``{"job": "123", "restart": 0, "nodes": ["node01", "node02"], "ranks": {"node01": [0, 1], "node02": [2, 3]}}``:
``nodes`` lists the node names by the launcher's node index, ``ranks`` the ranks on each name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.files import write_atomic

RANK_NODES_FILE = "rank-nodes.json"


@dataclass(frozen=True)
class RankNodes:
    """The attempt's nodes by node index, and the ranks on each node name."""

    job: str
    restart: int
    nodes: tuple[str, ...]
    ranks: dict[str, tuple[int, ...]]

    def ranks_on(self, node: str) -> tuple[int, ...]:
        return self.ranks.get(node, ())

    def to_json(self) -> str:
        return json.dumps({"job": self.job, "restart": self.restart, "nodes": list(self.nodes),
                           "ranks": {name: list(r) for name, r in self.ranks.items()}}, separators=(",", ":"))


def rank_nodes(job: str, restart: int, names: Sequence[str], node_of_rank: Sequence[int]) -> RankNodes:
    """The layout of ranks whose node indices are ``node_of_rank`` (by rank) on nodes named ``names`` (by index);
    two node indices of one name (stand-in nodes on one host) share its entry."""
    ranks: dict[str, list[int]] = {name: [] for name in names}
    for rank, node in enumerate(node_of_rank):
        ranks[names[node]].append(rank)
    return RankNodes(job=job, restart=restart, nodes=tuple(names),
                     ranks={name: tuple(r) for name, r in ranks.items()})


def write_rank_nodes(run_dir: str | os.PathLike[str], layout: RankNodes) -> Path:
    """Write ``RUN_DIR/rank-nodes.json`` whole or not at all (an earlier attempt's file is replaced)."""
    path = Path(run_dir) / RANK_NODES_FILE
    write_atomic(path, layout.to_json() + "\n", durable=False)
    return path


def parse_rank_nodes(text: str) -> RankNodes | None:
    """The layout ``text`` holds, None when it is not one."""
    try:
        data: Any = json.loads(text)
        nodes = tuple(str(n) for n in data["nodes"])
        ranks = {str(name): tuple(int(r) for r in listed) for name, listed in data["ranks"].items()}
        return RankNodes(job=str(data.get("job", "")), restart=int(data.get("restart", 0)), nodes=nodes, ranks=ranks)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_rank_nodes(run_dir: str | os.PathLike[str]) -> RankNodes | None:
    """The newest attempt's layout, None when the run has none (yet) or it is not readable."""
    try:
        return parse_rank_nodes((Path(run_dir) / RANK_NODES_FILE).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
