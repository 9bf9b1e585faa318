"""Which cores and which devices each rank on a node gets, worked out from the node described in the site profile.

Ranks go to sockets in order and, inside a socket, each gets an equal slot of its usable cores (reserved cores
skipped), so no rank spans two sockets where one can hold it; devices are dealt out in the order of the cores they
sit next to (``node.gpu_order``), spread evenly, so a rank's devices are those nearest its cores. Launchers write
the result: PALS ``--cpu-bind list:...``, the gpu_affinity wrapper's ``--devices`` map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.errors import FitError

if TYPE_CHECKING:
    from hpctrain.config.node_shape import NodeShape

RankSets = tuple[tuple[int, ...], ...]


def rank_cores(node: NodeShape, ranks_per_node: int, threads_per_rank: int, hyperthreads: int) -> RankSets:
    """The physical cores of each local rank: ``ceil(threads / hyperthreads)`` consecutive usable cores.

    Ranks split over the sockets as evenly as their count allows and never span two; only where that cannot
    fit (one rank wants more cores than a socket has) do the ranks take equal slots of the whole node.
    """
    assert isinstance(node.cores, int)
    per_rank = -(-threads_per_rank // hyperthreads)
    per_socket = node.physical_cores // node.sockets
    reserved = set(node.reserved_cores)
    # Rank r lives on socket floor(r * sockets / ranks).
    on_socket: dict[int, list[int]] = {}
    for rank in range(ranks_per_node):
        on_socket.setdefault(rank * node.sockets // ranks_per_node, []).append(rank)
    cores: dict[int, tuple[int, ...]] = {}
    for socket, ranks in on_socket.items():
        usable = [c for c in range(socket * per_socket, (socket + 1) * per_socket) if c not in reserved]
        slot = len(usable) // len(ranks)
        if per_rank > slot:
            return _node_slots(node, ranks_per_node, per_rank)
        for k, rank in enumerate(ranks):
            cores[rank] = tuple(usable[k * slot:k * slot + per_rank])
    return tuple(cores[r] for r in range(ranks_per_node))


def _node_slots(node: NodeShape, ranks_per_node: int, per_rank: int) -> RankSets:
    reserved = set(node.reserved_cores)
    usable = [c for c in range(node.physical_cores) if c not in reserved]
    slot = len(usable) // ranks_per_node
    if per_rank > slot:
        raise FitError(f"{ranks_per_node} ranks x {per_rank} cores do not fit on the {len(usable)} usable cores of "
                       "a node", key="resources.threads_per_rank", hint="lower threads_per_rank or ranks_per_node")
    return tuple(tuple(usable[r * slot:r * slot + per_rank]) for r in range(ranks_per_node))


def rank_cpus(node: NodeShape, ranks_per_node: int, threads_per_rank: int, hyperthreads: int) -> RankSets:
    """The logical CPUs of each local rank: its cores' first ``hyperthreads`` hardware threads.

    Linux numbers hardware thread t of core c as ``c + t * physical cores`` on these machines (Aurora: 1 and
    105 share a core, Polaris 1 and 33).
    """
    total = node.physical_cores
    return tuple(tuple(c + t * total for t in range(hyperthreads) for c in cores)
                 for cores in rank_cores(node, ranks_per_node, threads_per_rank, hyperthreads))


def rank_devices(node: NodeShape, ranks_per_node: int, gpus_per_rank: int) -> RankSets:
    """The device ids of each local rank: the node's devices in core order, dealt out in equal blocks."""
    assert isinstance(node.gpus, int)
    if gpus_per_rank <= 0 or node.gpus <= 0:
        return ()
    order = list(node.gpu_order) if node.gpu_order is not None else list(range(node.gpus))
    block = node.gpus // ranks_per_node
    if block < gpus_per_rank:
        raise FitError(f"{ranks_per_node} ranks x {gpus_per_rank} devices do not fit on {node.gpus} per node",
                       key="resources.gpus_per_rank")
    return tuple(tuple(order[r * block:r * block + gpus_per_rank]) for r in range(ranks_per_node))


def _ranges(ids: tuple[int, ...]) -> str:
    """``(1, 2, 3, 7)`` -> ``1-3,7``."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in (*ids[1:], None):
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def pals_cpu_list(cpus: RankSets) -> str:
    """PALS mpiexec's ``--cpu-bind`` value: ``list:`` then each rank's CPUs, ranks separated by ``:``."""
    return "list:" + ":".join(_ranges(tuple(sorted(c))) for c in cpus)


def parse_id_sets(text: str) -> RankSets:
    """``1-8:9-16`` or ``3:2,1`` -> one tuple of ids per rank (ranks split at ``:``, ids at ``,``, ranges ``a-b``)."""
    ranks: list[tuple[int, ...]] = []
    for part in text.split(":"):
        ids: list[int] = []
        for item in part.split(","):
            low, _, high = item.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"{text!r}: {item!r} is not a number or a range a-b")
            ids += range(int(low), int(high or low) + 1)
        ranks.append(tuple(ids))
    return tuple(ranks)


def device_map(devices: RankSets) -> str:
    """The gpu_affinity wrapper's ``--devices`` value: ranks separated by ``:``, a rank's devices by ``,``."""
    return ":".join(",".join(str(d) for d in rank) for rank in devices)
