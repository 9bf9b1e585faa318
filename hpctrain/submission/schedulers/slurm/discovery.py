"""Slurm's answers to discovery: partitions and their limits (``scontrol show partition -o``: MaxNodes, MinNodes,
MaxTime, the partition's QoS), QOS limits (``sacctmgr show qos``: MaxWall, MaxTRES, MaxTRESPU, MaxJobsPU,
MaxSubmitPU; where accounting runs), node shapes (``scontrol show node -o``, or ``sinfo`` when scontrol is
refused), accounts (``sacctmgr show assoc``), the MPI plug-ins of ``srun --mpi=list`` and ``scontrol show config``
(MpiDefault, TmpFS, ClusterName); what a partition's QOS does to its limits, and the ``--mpi`` plug-in srun needs
for the MPI found.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from hpctrain.config.numbers import plain_count
from hpctrain.config.walltime import parse_walltime
from hpctrain.submission.discovery.facts import (
    NO_LIMIT_S,
    Fact,
    NodeFacts,
    QosFacts,
    QueueFacts,
    SchedulerFacts,
    gpu_kind_of,
    guess,
    learned,
    most_common,
    node_kinds_note,
)
from hpctrain.submission.discovery.probe import Probe


@dataclass
class SlurmFacts(SchedulerFacts):
    """Slurm's answers, with the MPI plug-ins srun offers (``srun --mpi=list``) and its ``MpiDefault``."""

    mpi_plugins: list[str] = field(default_factory=list)
    mpi_default: str | None = None

SINFO_FORMAT = "%R|%a|%l|%D|%c|%z|%m|%G|%P"  # the columns node_from_sinfo reads
QOS_FORMAT = "Name,MaxWall,MaxTRES,MaxTRESPU,MaxJobsPU,MaxSubmitPU"  # the columns read_qos reads

# `Key=Value` pairs of a `scontrol -o` line; a value runs until the next ` Key=` (values may hold spaces:
# OS=Linux 6.1 #1 SMP, Reason=...).
_PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_:/.\[\]]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_:/.\[\]]*=|\s*$)")
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::([^:(,]+))?:(\d+)")
_NO_LIMIT = {"UNLIMITED", "INFINITE", "NONE"}


def key_values(line: str) -> dict[str, str]:
    """The ``Key=Value`` pairs of one ``scontrol show ... -o`` line."""
    return {k: v.strip() for k, v in _PAIR.findall(line)}


def records(text: str, first_key: str) -> list[dict[str, str]]:
    """One dict per ``scontrol -o`` line that starts with ``first_key=``."""
    return [key_values(ln) for ln in text.splitlines() if ln.strip().startswith(first_key + "=")]


def slurm_seconds(text: str) -> int | None:
    """Seconds in a Slurm time limit (``1-00:00:00``, ``02:00:00``, ``30``); None for UNLIMITED/INFINITE."""
    if text.strip().upper() in _NO_LIMIT:
        return None
    return parse_walltime(text.strip())


# Counts (cores, nodes, GPUs) and memory in MB that a real machine cannot exceed; larger output names none.
MAX_NODE_COUNT = 1_000_000
MAX_MEMORY_MB = 1 << 30


def _int(text: str | None) -> int | None:
    return plain_count(text, MAX_NODE_COUNT)


def _learned_count(text: str | None, source: str) -> Fact[int] | None:
    """A positive count the scheduler states, as a fact; None when the text is not one."""
    value = plain_count(text)
    return learned(value, source) if value else None


def gres_gpus(gres: str) -> tuple[int, str | None]:
    """GPUs per node and their model from a Gres string (``gpu:a100:4(S:0-1)``; ``(null)`` is none)."""
    count, model = 0, None
    for found_model, n in _GRES_GPU.findall(gres or ""):
        count += plain_count(n, 1_000_000) or 0
        model = model or (found_model or None)
    return count, model


def _gpu_kind(count: int, model: str | None, source: str) -> Fact[str]:
    if count == 0:
        return learned("none", source)
    kind = gpu_kind_of(model or "")
    if kind:
        return learned(kind, f"{source}: GPU type {model}")
    return guess("nvidia", f"{source} names no GPU vendor ({model or 'no type'})")


def node_from_scontrol(rec: dict[str, str]) -> NodeFacts | None:
    """A node's shape from its ``scontrol show node -o`` fields (None when the line lacks the CPU layout)."""
    sockets, per_socket = _int(rec.get("Sockets")), _int(rec.get("CoresPerSocket"))
    threads = _int(rec.get("ThreadsPerCore")) or 1
    total = _int(rec.get("CPUTot"))
    if sockets and per_socket:
        cores = sockets * per_socket
    elif total:
        cores = max(total // threads, 1)
    else:
        return None
    memory = plain_count(rec.get("RealMemory"), MAX_MEMORY_MB)
    gpus, model = gres_gpus(rec.get("Gres", ""))
    src = "scontrol show node"
    return NodeFacts(
        cores=learned(cores, f"{src}: Sockets={rec.get('Sockets')} x CoresPerSocket={rec.get('CoresPerSocket')}"),
        threads_per_core=learned(threads, f"{src}: ThreadsPerCore={threads}"),
        gpus=learned(gpus, f"{src}: Gres={rec.get('Gres', '(null)')}"),
        gpu_kind=_gpu_kind(gpus, model, f"{src} Gres"),
        memory_gb=(learned(max(round(memory / 1024, 1), 0.1), f"{src}: RealMemory={memory} MB") if memory
                   else guess(1.0, f"{src} gives no RealMemory")),
        count=1,
    )


def node_from_sinfo(fields: list[str]) -> NodeFacts | None:
    """A node kind from one ``sinfo -o '%R|%a|%l|%D|%c|%z|%m|%G|%P'`` row (S:C:T in %z)."""
    try:
        layout = [plain_count(x, MAX_NODE_COUNT) for x in fields[5].split(":")]
        count, memory = plain_count(fields[3], MAX_NODE_COUNT), plain_count(fields[6].rstrip("+"), MAX_MEMORY_MB)
    except IndexError:
        return None
    if len(layout) != 3 or None in layout or count is None or memory is None:
        return None
    sockets, per_socket, threads = (int(x or 0) for x in layout)
    gpus, model = gres_gpus(fields[7])
    src = "sinfo"
    return NodeFacts(
        cores=learned(sockets * per_socket, f"{src}: S:C:T={fields[5]}"),
        threads_per_core=learned(threads, f"{src}: S:C:T={fields[5]}"),
        gpus=learned(gpus, f"{src}: GRES={fields[7]}"),
        gpu_kind=_gpu_kind(gpus, model, f"{src} GRES"),
        memory_gb=learned(max(round(memory / 1024, 1), 0.1), f"{src}: MEMORY={memory} MB"),
        count=count,
    )


def _queue(rec: dict[str, str], node: NodeFacts | None) -> QueueFacts:
    name = rec["PartitionName"]
    src = f"scontrol show partition {name}"
    total = _int(rec.get("TotalNodes")) or (node.count if node else 0) or 1
    max_nodes_text = rec.get("MaxNodes", "UNLIMITED")
    max_nodes = _int(max_nodes_text)
    if max_nodes is None:
        nodes = learned(total, f"{src}: MaxNodes={max_nodes_text}, so its TotalNodes={total}")
    else:
        nodes = learned(min(max_nodes, total), f"{src}: MaxNodes={max_nodes}" +
                        (f" (but TotalNodes={total})" if max_nodes > total else ""))
    max_time = rec.get("MaxTime", "UNLIMITED")
    try:
        seconds = slurm_seconds(max_time)
        walltime = learned(seconds if seconds is not None else NO_LIMIT_S,
                           f"{src}: MaxTime={max_time}" + ("" if seconds is not None else " (no limit)"))
    except ValueError:
        walltime = guess(24 * 3600, f"{src}: MaxTime={max_time} could not be read")
    min_text = rec.get("MinNodes")
    min_nodes = _int(min_text)
    state = rec.get("State", "UP")
    return QueueFacts(
        name=name, max_nodes=nodes, max_walltime_s=walltime,
        min_nodes=learned(max(min_nodes, 1), f"{src}: MinNodes={min_text}") if min_nodes is not None else None,
        node=node, description="" if state == "UP" else f"State={state} when discovered",
    )


_TRES_NODES = re.compile(r"(?:^|,)node=(\d+)")
QOS_SOURCE = "sacctmgr show qos"  # how a limit read from a QOS names its source: "sacctmgr show qos NAME: Key=V"


def read_qos(text: str) -> dict[str, QosFacts]:
    """QOS limits from ``sacctmgr -nP show qos format=QOS_FORMAT`` lines (an empty field: no limit)."""
    found = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 6 or not fields[0].strip():
            continue
        name, wall, tres, tres_pu, jobs_pu, submit_pu = (f.strip() for f in fields[:6])
        src = f"{QOS_SOURCE} {name}"
        seconds = None
        if wall:
            try:
                seconds = slurm_seconds(wall)
            except ValueError:
                seconds = None
        nodes = _TRES_NODES.search(tres)
        nodes_pu = _TRES_NODES.search(tres_pu)
        found[name] = QosFacts(
            name=name,
            max_walltime_s=learned(seconds, f"{src}: MaxWall={wall}") if seconds is not None else None,
            max_nodes=_learned_count(nodes.group(1) if nodes else None, f"{src}: MaxTRES={tres}"),
            max_nodes_per_user=_learned_count(nodes_pu.group(1) if nodes_pu else None, f"{src}: MaxTRESPU={tres_pu}"),
            max_running_per_user=_learned_count(jobs_pu, f"{src}: MaxJobsPU={jobs_pu}"),
            max_queued_per_user=_learned_count(submit_pu, f"{src}: MaxSubmitPU={submit_pu}"),
        )
    return found


def is_qos_limit(fact: Fact[Any]) -> bool:
    """Whether a discovered limit is a QOS's (its source is ``sacctmgr show qos NAME: ...``)."""
    return fact.source.startswith(QOS_SOURCE + " ")


def with_qos(queue: QueueFacts, qos: QosFacts) -> QueueFacts:
    """A partition's limits as a job under ``qos`` meets them: the tighter walltime and node limit, the QOS's
    per-user limits."""
    update: dict[str, object] = {}
    if qos.max_walltime_s is not None and qos.max_walltime_s.value < queue.max_walltime_s.value:
        update["max_walltime_s"] = qos.max_walltime_s
    if qos.max_nodes is not None and qos.max_nodes.value < queue.max_nodes.value:
        update["max_nodes"] = qos.max_nodes
    for key in ("max_nodes_per_user", "max_running_per_user", "max_queued_per_user"):
        if getattr(qos, key) is not None:
            update[key] = getattr(qos, key)
    return replace(queue, **update)  # type: ignore[arg-type]


def _sinfo_rows(text: str) -> Iterable[list[str]]:
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) >= 9:
            yield fields


def read_slurm(probe: Probe) -> SlurmFacts:
    """Partitions, node shapes, accounts and MPI plug-ins from the probe's Slurm sections."""
    facts = SlurmFacts(name="slurm", answered=False)
    partitions = probe.answered("slurm_partitions")
    nodes_text = probe.answered("slurm_nodes")
    sinfo_text = probe.answered("slurm_sinfo")

    # Node kinds per partition: from scontrol's node lines, else from sinfo's rows.
    shapes_of: dict[str, list[NodeFacts]] = {}
    all_shapes: list[NodeFacts] = []
    for rec in records(nodes_text or "", "NodeName"):
        shape = node_from_scontrol(rec)
        if shape is None:
            continue
        all_shapes.append(shape)
        for part in filter(None, rec.get("Partitions", "").split(",")):
            shapes_of.setdefault(part, []).append(shape)
    if not all_shapes:
        for fields in _sinfo_rows(sinfo_text or ""):
            shape = node_from_sinfo(fields)
            if shape is not None:
                all_shapes.append(shape)
                shapes_of.setdefault(fields[0], []).append(shape)
    facts.node = most_common(all_shapes)
    if facts.node is not None:
        note = node_kinds_note(all_shapes, "the machine")
        if note:
            facts.notes.append(note)

    facts.qos = read_qos(probe.answered("slurm_qos") or "")
    default = None
    for rec in records(partitions or "", "PartitionName"):
        name = rec["PartitionName"]
        facts.queues[name] = _queue(rec, most_common(shapes_of.get(name, [])))
        part_qos = facts.qos.get(rec.get("QoS", ""))
        if part_qos is not None:  # the partition's own QOS binds every job in it
            facts.queues[name] = with_qos(facts.queues[name], part_qos)
        if rec.get("Default") == "YES":
            default = name
    if not facts.queues:
        for fields in _sinfo_rows(sinfo_text or ""):
            name = fields[0]
            if name in facts.queues:
                continue
            rec = {"PartitionName": name, "MaxTime": fields[2], "TotalNodes": fields[3]}
            facts.queues[name] = _queue(rec, most_common(shapes_of.get(name, [])))
            if fields[8].endswith("*"):
                default = name
    if default is not None:
        facts.default_queue = learned(default, f"scontrol show partition {default}: Default=YES")
    elif facts.queues:
        first = next(iter(facts.queues))
        facts.default_queue = guess(first, "no partition has Default=YES; the first one listed")
    facts.answered = bool(facts.queues or facts.node)
    for section in ("slurm_partitions", "slurm_nodes", "slurm_sinfo"):
        failure = probe.failure(section)
        if failure and not facts.answered:
            facts.notes.append(f"{_COMMANDS[section]} failed: {failure}")

    _read_config(probe, facts)
    _read_accounts(probe, facts)
    facts.mpi_plugins = mpi_plugins(probe.answered("slurm_mpi") or "")
    return facts


_COMMANDS = {"slurm_partitions": "scontrol show partition", "slurm_nodes": "scontrol show node",
             "slurm_sinfo": "sinfo", "slurm_assoc": "sacctmgr show assoc", "slurm_config": "scontrol show config"}


def config_values(text: str) -> dict[str, str]:
    """``Key = Value`` lines of ``scontrol show config``."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def _read_config(probe: Probe, facts: SlurmFacts) -> None:
    config = config_values(probe.answered("slurm_config") or "")
    name = config.get("ClusterName")
    facts.cluster_name = name if name and name != "(null)" else None
    mpi_default = config.get("MpiDefault")
    facts.mpi_default = mpi_default if mpi_default and mpi_default != "(null)" else None
    tmpfs = config.get("TmpFS")
    if tmpfs and tmpfs.startswith("/"):
        facts.scratch = learned(tmpfs, "scontrol show config: TmpFS (the jobs' node-local temporary space)")


def _read_accounts(probe: Probe, facts: SchedulerFacts) -> None:
    text = probe.answered("slurm_assoc")
    if text is None:
        failure = probe.failure("slurm_assoc")
        if failure:
            facts.notes.append(f"sacctmgr show assoc failed ({failure}): accounts not known")
        return
    accounts = sorted({ln.split("|")[0].strip() for ln in text.splitlines() if ln.split("|")[0].strip()})
    facts.accounts = learned(accounts, "sacctmgr show assoc user=" + (probe.out("user") or "$USER"))


def mpi_plugins(text: str) -> list[str]:
    """Plug-in names listed by ``srun --mpi=list`` (``srun: `` prefixes and version lines dropped)."""
    names = []
    for line in text.splitlines():
        word = line.strip().removeprefix("srun:").strip()
        if word and " " not in word and not word.endswith(":"):
            names.append(word)
    return names


def srun_mpi_args(facts: SchedulerFacts, mpi: Fact[str] | None) -> Fact[list[str]]:
    """``--mpi=PLUGIN`` for srun when Slurm's default would not start this MPI's ranks as one job."""
    plugins = facts.mpi_plugins if isinstance(facts, SlurmFacts) else []
    default = (facts.mpi_default if isinstance(facts, SlurmFacts) else None) or "none"
    if mpi is None:
        return learned([], f"srun's MpiDefault={default}; no MPI found to choose a plug-in for")
    wanted = {"CRAY MPICH": ["cray_shasta", "pmi2"], "Open MPI": ["pmix"], "MPICH": ["pmi2", "pmix"],
              "MVAPICH": ["pmi2"], "Intel(R) MPI": ["pmi2"]}.get(mpi.value, [])
    if default in wanted:
        return learned([], f"MpiDefault={default} already suits {mpi.value}")
    for plugin in wanted:
        if plugin in plugins or any(p.startswith(plugin + "_") for p in plugins):
            return learned([f"--mpi={plugin}"], f"srun --mpi=list offers {plugin} for {mpi.value} "
                                                f"(MpiDefault={default})")
    return learned([], f"srun --mpi=list offers none of {', '.join(wanted) or 'the usual plug-ins'} for "
                       f"{mpi.value}; MpiDefault={default}")
