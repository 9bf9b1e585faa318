"""Per-node statistics inside the run: which node each rank is on (one all-gather at start; rank 0 writes
``rank-nodes.json``), each node's busy time and link time per logging interval, and rank 0's straggler watch.

The link time comes from a short probe once per logging interval when the job has more than one node: the node
leaders (each node's lowest local rank) exchange a fixed buffer with their ring neighbours, one matching of the
ring at a time with a barrier before each so that waiting for a late partner is not timed; a node's link time is
the fastest of its exchanges (a node with a slow link is slow with both neighbours, each neighbour is fast with
its other one). docs/scaling.md, "Per-node times and stragglers".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain.config.job import ResourcesConfig
from hpctrain.launch_env import detect_launch_env, job_id_of, node_name, restarts_of
from hpctrain.nodes.blame import append_blames
from hpctrain.nodes.rank_nodes import RankNodes, rank_nodes, write_rank_nodes
from hpctrain.nodes.straggler_watch import NodeRow, StragglerWatch, straggler_blame, straggler_cause
from hpctrain.runtime.comm.base import Communicator

log = logging.getLogger("hpctrain.train")

PROBE_BYTES = 1 << 20  # large enough that bandwidth, not latency alone, shows; a few ms on any fabric
NAME_BYTES = 64  # HOST_NAME_MAX: longer node names are cut
LAYOUT_LABEL, PROBE_LABEL, PROBE_SYNC_LABEL = "nodes layout", "nodes probe", "nodes probe sync"


@dataclass(frozen=True)
class NodeLayout:
    """Each rank's node index (nodes numbered 0.. in the launcher's order), each node's leader rank and name."""

    node_of_rank: tuple[int, ...]
    leaders: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def nodes(self) -> int:
        return len(self.leaders)


def layout_of(entries: Sequence[tuple[int, int, str]]) -> NodeLayout:
    """The layout from every rank's (launcher's node index, local rank, node name), by rank: node indices are
    renumbered 0.. in order (a gap in the launcher's numbers leaves no empty node); a node's leader is its rank
    of the lowest local rank, its name the leader's."""
    indices = sorted({node for node, _, _ in entries})
    number = {node: i for i, node in enumerate(indices)}
    best: dict[int, tuple[int, int]] = {}
    for rank, (node, local, _) in enumerate(entries):
        best[number[node]] = min(best.get(number[node], (local, rank)), (local, rank))
    leaders = tuple(best[i][1] for i in range(len(indices)))
    return NodeLayout(node_of_rank=tuple(number[node] for node, _, _ in entries), leaders=leaders,
                      names=tuple(entries[r][2] for r in leaders))


def _name_tensor(node: int, local_rank: int, name: str) -> torch.Tensor:
    row = torch.zeros(2 + NAME_BYTES // 8, dtype=torch.int64)
    row[0], row[1] = node, local_rank
    encoded = name.encode()[:NAME_BYTES]
    if encoded:
        row[2:].view(torch.uint8)[: len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    return row


def _entry(row: torch.Tensor) -> tuple[int, int, str]:
    name = bytes(row[2:].contiguous().view(torch.uint8).tolist()).rstrip(b"\0").decode("utf-8", "replace")
    return int(row[0]), int(row[1]), name


def gather_layout(comm: Communicator, node: int, local_rank: int, name: str) -> NodeLayout:
    """Collective: every rank's node index, local rank and node name, in one all-gather (none on one rank)."""
    if comm.size == 1:
        return layout_of([(node, local_rank, name)])
    rows = comm.allgather(_name_tensor(node, local_rank, name), LAYOUT_LABEL)
    return layout_of([_entry(row) for row in rows])


def probe_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """The ring's edges (i, i+1 mod n) as matchings, one per round: the even-numbered edges, then the odd ones;
    for an odd n the closing edge (n-1, 0) is a third round. Two nodes share one edge, one node has none."""
    if nodes < 2:
        return []
    if nodes == 2:
        return [[(0, 1)]]
    edges = [(i, (i + 1) % nodes) for i in range(nodes)]
    if nodes % 2 == 0:
        return [edges[0::2], edges[1::2]]
    return [edges[0:nodes - 1:2], edges[1:nodes - 1:2], [edges[-1]]]


def node_busy_times(node_of_rank: Sequence[int], nodes: int, rank_busy: Sequence[float]) -> list[float]:
    """Per node, its slowest rank's busy time (ranks without a timed step left out; NaN when none has one)."""
    busy = [math.nan] * nodes
    for node, seconds in zip(node_of_rank, rank_busy, strict=True):
        if math.isfinite(seconds) and (math.isnan(busy[node]) or seconds > busy[node]):
            busy[node] = seconds
    return busy


class LinkProbe:
    """The node leaders' timed exchanges with their ring neighbours; ``measure`` is collective (every rank joins
    the barriers, the leaders alone exchange). The first call exchanges once untimed before it times: a
    connection's set-up is not a slow link."""

    def __init__(self, comm: Communicator, layout: NodeLayout, nbytes: int = PROBE_BYTES,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.comm, self.layout, self.clock = comm, layout, clock
        self.rounds = probe_rounds(layout.nodes)
        self.node = layout.node_of_rank[comm.rank]
        self.leads = layout.leaders[self.node] == comm.rank
        self.buffer = torch.zeros(nbytes, dtype=torch.uint8) if self.leads and self.rounds else None
        self._warm = False

    def _peer(self, pairs: list[tuple[int, int]]) -> int | None:
        for a, b in pairs:
            if self.node in (a, b):
                return self.layout.leaders[b if self.node == a else a]
        return None

    def _exchange(self) -> float:
        fastest = math.inf
        for pairs in self.rounds:
            self.comm.barrier(PROBE_SYNC_LABEL)
            peer = self._peer(pairs) if self.buffer is not None else None
            if peer is not None:
                assert self.buffer is not None
                start = self.clock()
                self.comm.sendrecv(self.buffer, peer, PROBE_LABEL)
                fastest = min(fastest, self.clock() - start)
        return fastest if self.leads and math.isfinite(fastest) else math.nan

    def measure(self) -> float:
        """This node's link time (seconds per exchange) on its leader; NaN on the other ranks and on one node."""
        if not self.rounds:
            return math.nan
        if not self._warm:
            self._exchange()
            self._warm = True
        return self._exchange()


class NodeStats:
    """The trainer's per-node statistics: ``probe`` and ``link_slots`` on every rank at each logging interval,
    ``observe`` on rank 0 with the all-reduced values. Costs one start-up all-gather; nothing per interval on one
    node."""

    def __init__(self, comm: Communicator, layout: NodeLayout, run_dir: Path, resources: ResourcesConfig,
                 attempt: RankNodes) -> None:
        self.comm, self.layout, self.run_dir, self.attempt = comm, layout, run_dir, attempt
        self.probe = LinkProbe(comm, layout)
        self.watch = StragglerWatch(resources.straggler_factor, resources.straggler_window_steps)
        self.window_steps = resources.straggler_window_steps
        self._said_two_nodes = False

    @classmethod
    def start(cls, comm: Communicator, run_dir: Path, resources: ResourcesConfig,
              environ: Mapping[str, str]) -> NodeStats:
        """Collective: learn where every rank runs; rank 0 writes ``RUN_DIR/rank-nodes.json``."""
        env = detect_launch_env(environ)
        layout = gather_layout(comm, env.node_rank, env.local_rank, node_name(environ))
        attempt = rank_nodes(job_id_of(environ), restarts_of(environ), layout.names, layout.node_of_rank)
        if comm.rank == 0:
            try:
                write_rank_nodes(run_dir, attempt)
            except OSError as exc:  # advisory: blame then names a node without its ranks
                log.warning("could not write the rank -> node list in %s (%s)", run_dir, exc)
        return cls(comm, layout, run_dir, resources, attempt)

    @property
    def many(self) -> bool:
        return self.layout.nodes > 1

    def link_slots(self) -> list[float]:
        """Collective beyond one node (the probe): this rank's share of the per-node link slots of the interval's
        all-reduce (its node's link time in its node's slot on a leader, zeros elsewhere); none on one node."""
        if not self.many:
            return []
        slots = [0.0] * self.layout.nodes
        link = self.probe.measure()
        if self.probe.leads:
            slots[self.probe.node] = link
        if self.comm.rank == 0 and self.layout.nodes == 2 and not self._said_two_nodes:
            self._said_two_nodes = True
            log.info("2 nodes: their link time is the one exchange between them; a slow link cannot be told "
                     "from its peer's")
        return slots

    def observe(self, step: int, steps: int, rank_busy: Sequence[float],
                node_link: Sequence[float]) -> dict[str, Any]:
        """Rank 0, one interval: ``{"node_busy_s": ..., "node_link_s": ..., "stragglers": [...]}`` (the keys the
        rows and the record take; none on one node). A node named for the first time is logged and blamed."""
        if not self.many:
            return {}
        busy = node_busy_times(self.layout.node_of_rank, self.layout.nodes, rank_busy)
        link = [float(v) for v in node_link]
        named = self.watch.observe(NodeRow(step=step, steps=steps, busy=tuple(busy), link=tuple(link)))
        out: dict[str, Any] = {"node_busy_s": busy, "node_link_s": link}
        if named:
            blames = [straggler_blame(s, self.attempt, self.window_steps) for s in named]
            for s, blame in zip(named, blames, strict=True):
                log.warning("straggler at step %d: node %s: %s", step, blame.where,
                            straggler_cause(s, self.window_steps))
            try:
                append_blames(self.run_dir, blames)
            except OSError as exc:
                log.warning("could not append to the blamed nodes in %s (%s)", self.run_dir, exc)
            out["stragglers"] = [{"node": self.layout.names[s.node], "ratio": round(s.ratio, 3), "what": s.what}
                                 for s in named]
        return out
