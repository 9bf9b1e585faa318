"""The planner's cost of hpctrain's gloo all-reduce (planning/collectives.py, ``p2p_allreduce``) against the algorithm
it runs (runtime/comm/p2p_allreduce.py's ``schedule``, and the message counts of runtime/counting/comm_counts.py): the
same choice by size, as many messages on the slowest rank's path, the same bytes.
"""

from __future__ import annotations

import pytest

from hpctrain.planning import collectives as c
from hpctrain.runtime.comm import p2p_allreduce
from hpctrain.runtime.counting import comm_counts

ELEMENT = 4  # float32
MESSAGES = c.Link(alpha=1.0, beta=0.0, gamma=0.0)  # a cost that counts messages in a row
BYTES = c.Link(alpha=0.0, beta=1.0, gamma=0.0)  # ... and bytes on the wire
REDUCED = c.Link(alpha=0.0, beta=0.0, gamma=1.0)  # ... and bytes reduced


def _critical_path(size: int, count: int) -> tuple[int, int, int]:
    """(rounds, bytes, reduced bytes) of the rank that takes longest in the schedule hpctrain runs: a round
    costs one message latency and its larger direction's bytes (sends and receives overlap)."""
    name = p2p_allreduce.algorithm(count, ELEMENT, size)
    worst = (0, 0, 0)
    for rank in range(size):
        rounds = p2p_allreduce.schedule(rank, size, count, name)
        moved = sum(max(r.send[1] - r.send[0], r.recv[1] - r.recv[0]) for r in rounds) * ELEMENT
        reduced = sum(r.recv[1] - r.recv[0] for r in rounds if r.reduce) * ELEMENT
        worst = max(worst, (len(rounds), moved, reduced))
    return worst


@pytest.mark.parametrize("size", [2, 3, 4, 6, 8, 12, 16])
@pytest.mark.parametrize("count", [8, 500, 4096, 65536])
def test_one_node_cost_counts_what_the_schedule_sends(size: int, count: int) -> None:
    n = count * ELEMENT
    rounds, moved, reduced = _critical_path(size, count)
    assert c.p2p_algorithm(size, n, ELEMENT) == p2p_allreduce.algorithm(count, ELEMENT, size)
    assert c.p2p_allreduce(1, size, n, MESSAGES, MESSAGES)[0] == pytest.approx(rounds)
    assert c.p2p_allreduce(1, size, n, BYTES, BYTES)[0] == pytest.approx(moved)
    assert c.p2p_allreduce(1, size, n, REDUCED, REDUCED)[0] == pytest.approx(reduced)  # the fold's n included


@pytest.mark.parametrize("size", [4, 6, 8, 16])
def test_the_algorithm_name_is_the_counted_one(size: int) -> None:
    for count in (100, 511, 512, 100_000):
        planned = c.allreduce("gloo", size, count * ELEMENT, MESSAGES)[1]
        _, counted = comm_counts.traffic("p2p", "allreduce", count * ELEMENT, 0, size, element_size=ELEMENT)
        expected = {"rabenseifner": "reduce-scatter + allgather"}.get(counted.removeprefix("p2p "),
                                                                     counted.removeprefix("p2p "))
        assert planned == expected, (size, count)
        # every rank's messages sent are at most the rounds the planner charges on the slowest path
        most = max(comm_counts.traffic("p2p", "allreduce", count * ELEMENT, r, size, element_size=ELEMENT)[0]
                   .sent_messages for r in range(size))
        assert most <= c.p2p_allreduce(1, size, count * ELEMENT, MESSAGES, MESSAGES)[0]


def test_across_nodes_the_first_halving_rounds_leave_the_node_and_share_its_network() -> None:
    """8 ranks on 2 nodes of 4: the reduce-scatter's first round (partner 4 away, half the vector) and the
    allgather's last cross the network, all four ranks of a node at once; the other rounds stay inside."""
    n = 4e6
    intra = c.Link(alpha=0.0, beta=0.0, gamma=0.0)
    inter = c.Link(alpha=0.0, beta=1.0, gamma=0.0)  # one node's network: 1 s per byte
    seconds, name = c.p2p_allreduce(2, 4, n, intra, inter)
    assert name == "reduce-scatter + allgather"
    assert seconds == pytest.approx(2 * (n / 2) * 4)  # two crossings of n/2 bytes, four ranks sharing the link
    one_per_node, _ = c.p2p_allreduce(8, 1, n, intra, inter)
    assert one_per_node == pytest.approx(2 * n * 7 / 8)  # every round crosses, nobody shares
    # the node's network carries the vector once per rank: more than a hierarchical reduction's once
    hier, _ = c.hierarchical_allreduce("gloo", 2, 4, n, intra, inter, "rabenseifner")
    assert seconds > 3 * hier


def test_gloo_ring_stays_selectable() -> None:
    intra = c.Link(alpha=1e-6, beta=1e-10, gamma=0.0)
    inter = c.Link(alpha=1e-5, beta=1e-9, gamma=0.0)
    seconds, name = c.hierarchical_allreduce("gloo", 4, 2, 1e6, intra, inter, "ring")
    assert name == "ring"
    assert seconds == pytest.approx(2 * 7 * (1e-5 + 1e6 / 8 * 1e-9))
    assert c.hierarchical_allreduce("gloo", 4, 2, 1e6, intra, inter)[1] == "reduce-scatter + allgather"
