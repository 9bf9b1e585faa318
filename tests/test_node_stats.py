"""Per-node statistics and stragglers: the straggler watch (hpctrain/nodes/straggler_watch.py, pure), the link
probe's rounds and times and the layout gather (hpctrain/runtime/node_stats.py, on in-process ranks of
hpctrain_bench/in_process.py), the rank -> node file, and a real 2-node stand-in run (gloo) writing them."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.job import ResourcesConfig
from hpctrain.nodes.blame import read_blames
from hpctrain.nodes.rank_nodes import RANK_NODES_FILE, parse_rank_nodes, rank_nodes, read_rank_nodes, write_rank_nodes
from hpctrain.nodes.straggler_watch import (
    NodeRow,
    Straggler,
    StragglerWatch,
    find_stragglers,
    straggler_blame,
    straggler_cause,
)
from hpctrain.runtime.node_stats import (
    PROBE_LABEL,
    LinkProbe,
    NodeStats,
    gather_layout,
    layout_of,
    node_busy_times,
    probe_rounds,
)
from hpctrain_bench.in_process import InProcessComm, run_ranks


def rows(busy: list[list[float]], link: list[list[float]] | None = None, steps: int = 10) -> list[NodeRow]:
    """One row per interval of ``steps`` steps, from per-interval lists of per-node seconds."""
    links = link or [[] for _ in busy]
    return [NodeRow(step=(i + 1) * steps, steps=steps, busy=tuple(b), link=tuple(k))
            for i, (b, k) in enumerate(zip(busy, links, strict=True))]


# ------------------------------------------------------------------------------------------------ the watch


def test_a_node_that_stays_slow_over_a_full_window_is_named_with_its_ratio() -> None:
    busy = [[1.0, 1.0, 1.6, 1.0, 1.0] for _ in range(10)]
    assert find_stragglers(rows(busy), 1.3, 100) == [Straggler(node=2, ratio=1.6, what="busy")]


def test_noise_around_the_median_names_no_one() -> None:
    draw = random.Random(7)
    busy = [[1.0 + draw.uniform(-0.25, 0.25) for _ in range(8)] for _ in range(30)]
    assert find_stragglers(rows(busy), 1.3, 100) == []


def test_a_short_window_names_no_one_and_a_full_one_does() -> None:
    busy = [[1.0, 1.0, 5.0] for _ in range(9)]
    assert find_stragglers(rows(busy), 1.3, 100) == []  # 90 steps of 100
    assert [s.node for s in find_stragglers(rows([*busy, [1.0, 1.0, 5.0]]), 1.3, 100)] == [2]


def test_a_slow_spell_shorter_than_half_the_window_is_not_a_straggler() -> None:
    busy = [[1.0, 1.0, 3.0 if i < 4 else 1.0] for i in range(10)]
    assert find_stragglers(rows(busy), 1.3, 100) == []


def test_a_slow_link_names_its_node_not_its_neighbours() -> None:
    # node 2's link is slow: its two exchanges are slow, its neighbours' fastest exchange is not (the probe's
    # times: test_the_probe_times_each_leader_s_exchanges_and_keeps_its_fastest)
    link = [1.0, 1.0, 9.8, 1.0, 1.0]
    found = find_stragglers(rows([[1.0] * 5] * 10, [link] * 10), 1.3, 100)
    assert found == [Straggler(node=2, ratio=9.8, what="link")]
    assert straggler_cause(found[0], 100) == "link 9.8x the median over the last 100 steps"


def test_two_nodes_time_their_one_exchange_alike_so_neither_is_named_by_it() -> None:
    assert find_stragglers(rows([[1.0, 1.0]] * 10, [[7.0, 7.2]] * 10), 1.3, 100) == []


def test_a_node_slow_in_both_is_named_once_by_its_larger_ratio() -> None:
    found = find_stragglers(rows([[1.0, 1.0, 2.0]] * 10, [[1.0, 1.0, 3.0]] * 10), 1.3, 100)
    assert found == [Straggler(node=2, ratio=3.0, what="link")]


def test_the_watch_names_a_node_once_per_attempt_and_keeps_only_its_window() -> None:
    watch = StragglerWatch(1.3, 100)
    named = [watch.observe(row) for row in rows([[1.0, 1.0, 2.0]] * 30)]
    assert [i for i, n in enumerate(named) if n] == [9]
    assert sum(r.steps for r in watch.rows) == 100


def test_unmeasured_nodes_and_intervals_are_left_out() -> None:
    busy = [[1.0, math.nan, 2.0, None, 1.0]] * 10
    assert [s.node for s in find_stragglers(rows(busy), 1.3, 100)] == [2]  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ the probe


@pytest.mark.parametrize("nodes", range(2, 12))
def test_probe_rounds_are_matchings_of_the_ring_and_every_node_is_in_two_exchanges(nodes: int) -> None:
    rounds = probe_rounds(nodes)
    assert len(rounds) == (1 if nodes == 2 else 2 if nodes % 2 == 0 else 3)
    for pairs in rounds:
        members = [n for pair in pairs for n in pair]
        assert len(members) == len(set(members)), pairs  # no node twice in a round
    edges = {frozenset(pair) for pairs in rounds for pair in pairs}
    assert edges == {frozenset((i, (i + 1) % nodes)) for i in range(nodes)}  # the ring, each edge once
    exchanges = [sum(n in pair for pairs in rounds for pair in pairs) for n in range(nodes)]
    assert exchanges == [1 if nodes == 2 else 2] * nodes
    assert probe_rounds(1) == []


class SlowLinks(InProcessComm):
    """An in-process rank whose exchanges advance its own clock by the slower of the two nodes' link costs."""

    def __init__(self, comm: InProcessComm, node_of_rank: list[int], cost: list[float], clocks: list[float]) -> None:
        super().__init__(comm.group, comm.rank)
        self.node_of_rank, self.cost, self.clocks = node_of_rank, cost, clocks
        self.calls: list[tuple[str, str]] = []

    def sendrecv(self, tensor: Any, peer: int, label: str = "") -> Any:
        self.calls.append(("sendrecv", label))
        self.clocks[self.rank] += max(self.cost[self.node_of_rank[self.rank]], self.cost[self.node_of_rank[peer]])
        return super().sendrecv(tensor, peer, label)

    def barrier(self, label: str = "") -> None:
        self.calls.append(("barrier", label))
        super().barrier(label)


@pytest.mark.parametrize("nodes", [3, 4, 5])
def test_the_probe_times_each_leader_s_exchanges_and_keeps_its_fastest(nodes: int) -> None:
    per_node = 2
    node_of_rank = [r // per_node for r in range(nodes * per_node)]
    layout = layout_of([(n, r % per_node, f"n{n}") for r, n in enumerate(node_of_rank)])
    cost = [1.0] * nodes
    cost[1] = 9.0
    clocks = [0.0] * len(node_of_rank)

    def rank(r: int, comm: InProcessComm) -> tuple[float, list[tuple[str, str]]]:
        slow = SlowLinks(comm, node_of_rank, cost, clocks)
        probe = LinkProbe(slow, layout, nbytes=16, clock=lambda: clocks[r])
        first = probe.measure()
        calls = len(slow.calls)
        again = probe.measure()
        assert again == first or math.isnan(again) and math.isnan(first)
        return first, slow.calls[calls:]

    got = run_ranks(len(node_of_rank), rank)
    links = [got[leader][0] for leader in layout.leaders]
    assert links == [9.0 if n == 1 else 1.0 for n in range(nodes)]
    assert all(math.isnan(got[r][0]) for r in range(len(got)) if r not in layout.leaders)
    rounds = len(probe_rounds(nodes))
    for r, (_, calls) in enumerate(got):  # one measure: a barrier per round, 2 exchanges per leader
        assert calls.count(("barrier", "nodes probe sync")) == rounds
        assert calls.count(("sendrecv", PROBE_LABEL)) == (2 if r in layout.leaders else 0)


def test_one_node_probes_nothing() -> None:
    def rank(r: int, comm: InProcessComm) -> float:
        return LinkProbe(comm, layout_of([(0, k, "a") for k in range(3)])).measure()

    assert all(math.isnan(v) for v in run_ranks(3, rank))


# ------------------------------------------------------------------------------------------------ the layout


def test_the_layout_gather_numbers_nodes_in_order_and_picks_each_node_s_lowest_local_rank() -> None:
    # ranks dealt round-robin over launcher node indices 4 and 7 (a gap), local ranks counted per node
    where = [(7, 0, "b"), (4, 1, "a"), (7, 1, "b"), (4, 0, "a")]
    got = run_ranks(4, lambda r, comm: gather_layout(comm, *where[r]))
    assert all(layout == got[0] for layout in got)
    assert got[0].node_of_rank == (1, 0, 1, 0)
    assert got[0].leaders == (3, 0)
    assert got[0].names == ("a", "b")
    long_name = "x" * 100
    (alone,) = run_ranks(1, lambda r, comm: gather_layout(comm, 0, 0, long_name))
    assert alone.names == (long_name,)
    (two,) = {tuple(lay.names) for lay in run_ranks(2, lambda r, comm: gather_layout(comm, r, 0, long_name))}
    assert two == (long_name[:64], long_name[:64])


def test_node_busy_is_the_slowest_rank_of_the_node() -> None:
    assert node_busy_times([0, 0, 1, 1, 2], 3, [1.0, 2.0, math.nan, 3.0, math.nan])[:2] == [2.0, 3.0]
    assert math.isnan(node_busy_times([0, 0, 1, 1, 2], 3, [1.0, 2.0, math.nan, 3.0, math.nan])[2])


def test_the_rank_nodes_file_round_trips_and_a_foreign_file_is_none(tmp_path: Path) -> None:
    layout = rank_nodes("123", 2, ["n1", "n2"], [0, 0, 1, 1])
    path = write_rank_nodes(tmp_path, layout)
    assert json.loads(path.read_text()) == {"job": "123", "restart": 2, "nodes": ["n1", "n2"],
                                            "ranks": {"n1": [0, 1], "n2": [2, 3]}}
    assert read_rank_nodes(tmp_path) == layout
    assert parse_rank_nodes("[1, 2]") is None and parse_rank_nodes("{") is None
    assert read_rank_nodes(tmp_path / "none") is None


def test_a_named_straggler_is_logged_put_in_the_record_and_blamed(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    def rank(r: int, comm: InProcessComm) -> list[dict[str, Any]]:
        resources = ResourcesConfig(nodes=3, ranks_per_node=2, walltime="01:00:00", straggler_window_steps=40)
        layout = gather_layout(comm, r // 2, r % 2, f"node0{r // 2}")
        attempt = rank_nodes("99", 1, layout.names, layout.node_of_rank)
        stats = NodeStats(comm, layout, tmp_path, resources, attempt)
        return [stats.observe(step, 10, [1.0, 1.1, 1.0, 1.0, 2.0, 2.5], [0.01, 0.01, 0.01])
                for step in range(10, 70, 10)] if r == 0 else []  # rank 0's watch, as in the trainer

    caplog.set_level("WARNING", logger="hpctrain.train")
    records = run_ranks(6, rank)[0]
    assert [sorted(r) for r in records] == [["node_busy_s", "node_link_s"]] * 3 + [
        ["node_busy_s", "node_link_s", "stragglers"]] + [["node_busy_s", "node_link_s"]] * 2
    assert records[0]["node_busy_s"] == [1.1, 1.0, 2.5]
    assert records[3]["stragglers"] == [{"node": "node02", "ratio": round(2.5 / 1.1, 3), "what": "busy"}]
    (blame,) = read_blames(tmp_path)
    assert (blame.node, blame.kind, blame.source, blame.ranks, blame.job, blame.restart) == (
        "node02", "slow", "straggler", (4, 5), "99", 1)
    assert blame.cause == "busy time 2.27x the median over the last 40 steps"
    assert [m for m in caplog.messages if "straggler" in m] == [
        "straggler at step 40: node node02 (ranks 4-5): busy time 2.27x the median over the last 40 steps"]


def test_the_blame_names_the_ranks_on_the_node() -> None:
    layout = rank_nodes("7", 0, ["a", "b"], [0, 1, 0, 1])
    blame = straggler_blame(Straggler(node=1, ratio=2.0, what="link"), layout, 100)
    assert blame.where == "b (ranks 1, 3)"


# ------------------------------------------------------------------------------------------------ real ranks


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_two_stand_in_nodes_write_the_rank_nodes_file_and_per_node_times(tmp_path: Path) -> None:
    from tests.mp_helpers.nodes import run_on_nodes

    spec = tmp_path / "nodes.yaml"
    spec.write_text("name: nodes\nmodel: resnet\nmodel_args: {channels: 4, blocks: 1}\n"
                    "train: {steps: 6, batch_per_rank: 2, lr: 0.05, log_every: 2, seed: 5}\n"
                    'resources: {nodes: 2, ranks_per_node: 1, walltime: "00:10:00"}\n')
    node_dirs = [tmp_path / "node0", tmp_path / "node1"]
    for d in node_dirs:
        d.mkdir()
    run_dir = tmp_path / "run"
    results = run_on_nodes([sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(run_dir),
                            "--backend", "gloo"], 2, 1, node_dirs, timeout=500, HPCTRAIN_RESTART_COUNT="3",
                           HPCTRAIN_LOCAL_JOB_ID="local-5",
                           node_env=[{"SLURMD_NODENAME": "alpha"}, {"SLURMD_NODENAME": "beta"}])
    assert [r.returncode for r in results] == [0, 0], "\n".join(r.stdout[-3000:] for r in results)
    assert json.loads((run_dir / RANK_NODES_FILE).read_text()) == {
        "job": "local-5", "restart": 3, "nodes": ["alpha", "beta"], "ranks": {"alpha": [0], "beta": [1]}}
    lines = [json.loads(line) for line in (run_dir / "rank_times.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines][-2:] == [4, 6]  # the first interval may have no timed step
    for row in lines:
        assert len(row["node_busy_s"]) == 2 and len(row["node_link_s"]) == 2
        assert all(link > 0 for link in row["node_link_s"])  # each leader timed the one exchange
        busy = [b for b in row["busy_s"] if b is not None]
        assert [b for b in row["node_busy_s"] if b is not None] == busy
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all("stragglers" not in m and "node_link_s" not in m for m in metrics)  # 6 steps: no full window
    assert not (run_dir / "blamed-nodes.jsonl").exists()
