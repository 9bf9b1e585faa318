"""Naming a straggler node from the per-node times of the logging intervals (rank 0, inside the run).

Each interval gives every node a busy time (its slowest rank's input + compute per step) and, beyond one node, a
link time (the fastest of its timed exchanges with its ring neighbours). A node is a straggler when, over the last
``window_steps`` steps, the median of its time over the nodes' median (per interval) stays above ``factor``. Only
a full window counts: an attempt's first intervals, and a short run, name no one.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from hpctrain.nodes.blame import Blame
from hpctrain.nodes.rank_nodes import RankNodes

WHATS = ("busy", "link")
CAUSE_WORDS = {"busy": "busy time", "link": "link"}


@dataclass(frozen=True)
class NodeRow:
    """One logging interval's seconds per node, by node index (None or NaN where not measured): ``busy`` per step,
    ``link`` per exchange; it ends at ``step`` and covers ``steps`` steps."""

    step: int
    steps: int
    busy: tuple[float | None, ...]
    link: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Straggler:
    """Node ``node`` (its index) stays ``ratio`` times the nodes' median in its ``what`` time (busy or link)."""

    node: int
    ratio: float
    what: str


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def full_window(rows: Sequence[NodeRow], window_steps: int) -> list[NodeRow] | None:
    """The newest rows that together cover at least ``window_steps`` steps; None when all of them cover fewer."""
    covered = 0
    for start in range(len(rows) - 1, -1, -1):
        covered += rows[start].steps
        if covered >= window_steps:
            return [rows[i] for i in range(start, len(rows))]
    return None


def node_ratios(rows: Sequence[NodeRow], what: str) -> list[float | None]:
    """Per node index, the median over ``rows`` of its ``what`` time over that row's median across the nodes
    (None for a node never measured; a row with fewer than two measured nodes says nothing)."""
    ratios: dict[int, list[float]] = {}
    width = 0
    for row in rows:
        values: tuple[float | None, ...] = getattr(row, what)
        width = max(width, len(values))
        known = [v for v in values if _known(v)]
        if len(known) < 2:
            continue
        middle = statistics.median(known)  # type: ignore[type-var]
        if middle <= 0:
            continue
        for node, value in enumerate(values):
            if _known(value):
                ratios.setdefault(node, []).append(value / middle)  # type: ignore[operator]
    return [statistics.median(ratios[node]) if node in ratios else None for node in range(width)]


def find_stragglers(rows: Sequence[NodeRow], factor: float, window_steps: int) -> list[Straggler]:
    """The nodes whose busy or link time stays above ``factor`` times the median over the last full window; a node
    slow in both is named once, by its larger ratio. Empty until the rows cover ``window_steps`` steps."""
    window = full_window(rows, window_steps)
    if window is None:
        return []
    found: dict[int, Straggler] = {}
    for what in WHATS:
        for node, ratio in enumerate(node_ratios(window, what)):
            if ratio is not None and ratio > factor and (node not in found or ratio > found[node].ratio):
                found[node] = Straggler(node=node, ratio=ratio, what=what)
    return [found[node] for node in sorted(found)]


class StragglerWatch:
    """Rank 0's watch over one attempt: ``observe`` each interval's row; it returns the nodes named for the first
    time (a node is named once per attempt). Keeps only the rows its window needs."""

    def __init__(self, factor: float, window_steps: int) -> None:
        self.factor, self.window_steps = factor, window_steps
        self.rows: deque[NodeRow] = deque()
        self.named: set[int] = set()

    def observe(self, row: NodeRow) -> list[Straggler]:
        self.rows.append(row)
        while len(self.rows) > 1 and sum(r.steps for r in self.rows) - self.rows[0].steps >= self.window_steps:
            self.rows.popleft()
        new = [s for s in find_stragglers(self.rows, self.factor, self.window_steps) if s.node not in self.named]
        self.named.update(s.node for s in new)
        return new


def straggler_cause(straggler: Straggler, window_steps: int) -> str:
    """``link 9.8x the median over the last 100 steps``."""
    return f"{CAUSE_WORDS[straggler.what]} {straggler.ratio:.3g}x the median over the last {window_steps} steps"


def straggler_blame(straggler: Straggler, layout: RankNodes, window_steps: int) -> Blame:
    """The blame file's line for a straggler: slow, named by the straggler watch, with the ranks on its node."""
    node = layout.nodes[straggler.node]
    return Blame(node=node, cause=straggler_cause(straggler, window_steps), kind="slow", ranks=layout.ranks_on(node),
                 source="straggler", job=layout.job, restart=layout.restart)
