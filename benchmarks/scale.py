"""What each rank does, counted against the number of ranks: ``hpctrain run`` of a tiny FFN on N = 2 .. 64 ranks.

The demo job (jobs/ffn-local.yaml) with ``--set`` sizes that make a run take seconds of compute, started by the
MPICH wheel's mpiexec on this machine (oversubscribed) with ``HPCTRAIN_COUNTERS=1``, the MPI interposer preloaded
(hpctrain_bench/wire_counts.py: every MPI call by name, every message at the socket, ``MPIR_CVAR_NOLOCAL=1``) and
every rank under strace (hpctrain_bench/syscall_trace.py: opens, stat-family calls, directory reads, bytes read).
Every rank writes its counter record (runtime/counting/counters.py, runtime/counting/work_counts.py) and this script
prints each count against N, measured, with the model of runtime/counting/comm_counts.py on the line below where it
models the same count, the ratio
between the largest and the smallest N, the count extrapolated to 2048 x 8 ranks, and the target the measured
count is held to. Counts do not depend on how busy the machine is; the time to the first step does (a ratio, no
target). ``--ranks-per-node K`` groups the ranks into stand-in nodes of K (rank r on node r // K): each node has
its own node-local directory (``$HPCTRAIN_NODE_LOCAL``) and its ranks their node's local rank and size
(``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``), which is what tells hpctrain which ranks share a node; the per-node
rows (the volume read, the node files and the mkdir + fsync of a save's step directory) are checked against the
number of nodes. docs/scaling.md, "What is measured, and how", shows a run.

Run: .venv/bin/python benchmarks/scale.py [--ranks 2 4 8 16 32 64] [--ranks-per-node K] [--staged]
[--plot FILE.png] [--json FILE]
``--nodes 2 4 5`` runs the same job on real nodes as well: N nodes x K ranks (``--ranks-per-node``, default 1)
started by one ``srun`` per N in a Slurm partition (``--partition``; default: the cluster of namespace nodes of
scripts/ci/cluster.sh), each node's own directory under its node-local scratch, every record and trace on the
shared file system (``--out``), and prints them beside stand-in nodes of the same N and K measured in the same
invocation (docs/scaling.md, "On real nodes").
``--staged`` runs each N a second time from a copy of the environment unpacked once into node-local storage
(what ``staging.environment: archive`` does on a cluster) and counts the shared-path opens left at start-up.
``--backend gloo`` runs the ranks over torch.distributed gloo instead of MPI, with the rendezvous store's rows
(runtime/counting/store_counts.py): the ranks bootstrap over MPI (no store); ``--store`` makes them meet at a TCPStore
on rank 0 instead (MASTER_ADDR/MASTER_PORT, as torchrun or a launcher without MPI would). ``--gloo-ring`` (with
gloo) measures gloo's own ring all-reduce over its full mesh instead of hpctrain's point-to-point one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpctrain.runtime.comm import mpi_env  # noqa: E402
from hpctrain.runtime.counting import counters, wire  # noqa: E402
from hpctrain_bench import syscall_trace, wire_counts  # noqa: E402

SPEC = REPO / "jobs" / "ffn-local.yaml"
STEPS, LOG_EVERY, CKPT_EVERY = 7, 3, 3  # saves at steps 3 and 6 and the final one at 7
# The demo job cut down: a 1-layer 4-feature FFN on 7^3 FOVs of a 20 x 28 x 28 volume (17 424 coordinates), one FOV
# per rank and step, no warm-up/decay (they need more steps), no held-out evaluation at the end.
SETS = ("model_args.depth=1", "model_args.features=4", "model_args.fov=[7, 7, 7]", "model_args.deltas=[2, 2, 2]",
        "data.train.synthetic.shape=[20, 28, 28]", "data.eval=null", f"train.steps={STEPS}",
        "train.batch_per_rank=1", f"train.log_every={LOG_EVERY}", "train.warmup={kind: none}",
        "train.decay={kind: none}", f"checkpoint.every_steps={CKPT_EVERY}", "train.collective_timeout_s=900")
LAUNCH_PREFIXES = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "TORCHELASTIC", "HPCTRAIN_", "PALS_")


@dataclass
class Run:
    ranks: int
    nodes: int
    records: list[dict[str, Any]]
    first_step_s: float
    wall_s: float
    min_available_mb: float
    files_per_save: int
    traces: list[dict[str, Any]]  # per rank: syscall_trace.count windows (opens, stats, readdirs, bytes read)
    wire: dict[str, list[dict[str, Any]]]  # window -> per rank: MPI calls and socket traffic (wire_counts)
    step_dir_ops: dict[str, int]  # mkdir and fsync calls on the first save's step directory, all ranks


def _environment(python_env: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_PREFIXES)
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HPCTRAIN_COUNTERS="1", **(python_env or {}))
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _watch_memory(stop: threading.Event, low: list[float]) -> None:
    """The lowest MemAvailable seen while the ranks run (64 torch processes on this machine's memory)."""
    while not stop.wait(0.5):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                low[0] = min(low[0], int(line.split()[1]) / 1024)


def stand_in_nodes(n: int, per_node: int, root: Path) -> tuple[list[Path], list[str]]:
    """``ceil(n / per_node)`` node-local directories under ``root``, and the argv prefix that starts a rank of
    Hydra's mpiexec (``PMI_RANK``) as a rank of its stand-in node: local rank, local size, node directory."""
    nodes = [root / f"node-{i:03d}" for i in range(-(-n // per_node))]
    for d in nodes:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    script = (f'node=$((PMI_RANK / {per_node})); size=$(({n} - node * {per_node})); '
              f'[ "$size" -gt {per_node} ] && size={per_node}; '
              f'export MPI_LOCALRANKID=$((PMI_RANK % {per_node})) MPI_LOCALNRANKS=$size '
              f'{counters.NODE_LOCAL_ENV}="$0/node-$(printf %03d "$node")"; exec "$@"')
    return nodes, ["sh", "-c", script, str(root)]


# The real nodes' MPI: the stand-in nodes' netmod (libfabric's tcp provider) on the interface that links the
# nodes (scripts/ci/cluster.sh names it eth0 in every node), so that the two differ by the nodes, not by the
# transport. Left alone, the mpich wheel starts UCX between nodes (mpi_env.py), whose messages are framed
# otherwise and which carries a node's own ranks' messages through shared memory, where no socket counts them.
NODE_NETWORK = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}


@dataclass(frozen=True)
class RealNodes:
    """Nodes of a Slurm partition whose ranks ``srun`` starts; ``scratch``: each node's own storage."""

    partition: str
    scratch: str

    def launcher(self, n: int, per_node: int, mpi: str, stamps: Path) -> list[str]:
        """One ``srun`` of ``n`` ranks, ``per_node`` on each node, and the argv prefix that gives each rank its
        node's own directory under ``scratch`` (``$HPCTRAIN_NODE_LOCAL``, made by the node's ranks) and writes
        when it started to ``stamps/rank-R.start``: srun may wait in the queue before any rank starts."""
        script = (f'd={shlex.quote(self.scratch)}/hpctrain-scale-$SLURM_JOB_ID; mkdir -p "$d" && '
                  f'date +%s.%N >"$0/rank-$SLURM_PROCID.start" && export {counters.NODE_LOCAL_ENV}="$d" && exec "$@"')
        return ["srun", "-p", self.partition, "-N", str(n // per_node), f"--ntasks-per-node={per_node}",
                f"--mpi={mpi}", "--kill-on-bad-exit=1", "--time=60", "-J", "hpctrain-scale",
                "sh", "-c", script, str(stamps)]


def run_once(n: int, out: Path, python: str, python_env: dict[str, str] | None = None, backend: str = "mpi",
             store: bool = False, wire_library: Path | None = None, ranks_per_node: int = 1,
             extra_env: dict[str, str] | None = None, real: RealNodes | None = None) -> Run:
    """``hpctrain run`` of the job on ``n`` ranks, counted: on stand-in nodes of this machine (mpiexec), or on
    ``real`` nodes (srun)."""
    run_dir = out / f"n{n:03d}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    per_node = min(ranks_per_node, n)
    spec = run_dir / "spec.yaml"
    shutil.copy(SPEC, spec)  # in the run directory: the shared files a rank reads by design are all in there
    trace_dir = out / f"n{n:03d}-strace"  # beside the run directory: the traces are not the ranks' reads
    shutil.rmtree(trace_dir, ignore_errors=True)
    trace_dir.mkdir(parents=True)
    python_env = {**(python_env or {}), **(extra_env or {})}
    if real is None:
        nodes, as_node = stand_in_nodes(n, per_node, out / f"n{n:03d}-nodes")
        node_count, log = len(nodes), run_dir / "mpiexec.log"
        launcher = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(n), *as_node]
        # Every node's directory is node-local storage for the counters (a staged environment's copy too).
        local = [p for p in (python_env.pop(counters.NODE_LOCAL_ENV, ""), str(out / f"n{n:03d}-nodes")) if p]
        python_env[counters.EXTRA_LOCAL_ENV] = os.pathsep.join(local)
        # The stand-in nodes share one machine: MPI starts as hpctrain starts it on one node (loopback TCP), not
        # with the network netmod a rank on a real second node would get.
        python_env = {**mpi_env.ONE_NODE_WHEEL, **python_env}
    else:
        node_count, log = n // per_node, run_dir / "srun.log"
        # gloo meeting at a store: hpctrain puts it on the first node of Slurm's node list; no PMI then.
        launcher = real.launcher(n, per_node, "none" if store else "pmi2", trace_dir)
        python_env = {**NODE_NETWORK, **python_env}
    argv = [*launcher, *syscall_trace.per_rank_command(trace_dir), python, "-m", "hpctrain",
            "run", str(spec), "--run-dir", str(run_dir), "--backend", backend,
            *[a for s in SETS + (f"resources.ranks_per_node={per_node}",) for a in ("--set", s)]]
    if wire_library is not None:
        python_env.update(wire_counts.environment(wire_library))
    low, stop = [math.inf], threading.Event()
    watcher = threading.Thread(target=_watch_memory, args=(stop, low), daemon=True)
    watcher.start()
    start = time.time()
    env = _environment(python_env)
    if store and real is None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.time() - start
    stop.set()
    watcher.join()
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or "training finished" not in proc.stderr + proc.stdout:
        said = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if "hpctrain: node " not in line)
        raise SystemExit(f"N={n}: hpctrain run failed (exit {proc.returncode}); all output in "
                         f"{log}:\n{said[-4000:]}")
    records = counters.read_records(run_dir)
    if len(records) != n:
        raise SystemExit(f"N={n}: {len(records)} counter records, expected {n}")
    if real is not None:
        start = min(float(p.read_text()) for p in trace_dir.glob("rank-*.start"))
    first = max(r["work"]["first_step_end"] for r in records) - start
    step_dir = run_dir / "checkpoints" / f"step-{CKPT_EVERY:08d}"
    files = len([p for p in step_dir.iterdir() if p.name != "complete.json"])
    # A real node's directory is named by the job's id: as the rank's record names it.
    local = [counters.node_local_prefixes(python_env) if real is None else tuple(records[r]["node_local_prefixes"])
             for r in range(n)]
    traces = [syscall_trace.count(trace_dir / f"rank-{r}.strace", str(run_dir), local[r]) for r in range(n)]
    ops = {"mkdir": 0, "fsync": 0}
    for r in range(n):
        for k, v in syscall_trace.directory_ops(trace_dir / f"rank-{r}.strace", step_dir, str(run_dir)).items():
            ops[k] += v
    return Run(n, node_count, records, first, wall, low[0], files, traces, _wire_windows(records), ops)


def _wire_windows(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per rank, the interposer's counts in each window: ``startup`` (process start to the end of the first step),
    ``steps`` (the other steps, saves left out), ``saves`` (all saves), ``close`` (the communicator's close)."""
    if not all("wire" in r["marks"]["exit"] for r in records):
        return {}
    out: dict[str, list[dict[str, Any]]] = {"startup": [], "steps": [], "saves": [], "close": []}
    for r in records:
        marks = r["marks"]
        saves = r.get("spans", {}).get("save", {}).get("wire", {"calls": {}, "connections": []})
        steps = wire.difference(marks["trained"]["wire"], marks["first_step"]["wire"])
        negative = {"calls": {k: -v for k, v in saves["calls"].items()},
                    "connections": [c[:2] + [-v for v in c[2:7]] + c[7:] for c in saves["connections"]]}
        out["startup"].append(marks["first_step"]["wire"])
        out["steps"].append(wire.add(steps, negative))
        out["saves"].append(saves)
        out["close"].append(wire.difference(marks["exit"]["wire"], marks["trained"]["wire"]))
    return out


# ------------------------------------------------------------------------------------------------ the counts


CONTROL = ("stop flag", "metrics", "nodes")  # the small collectives: a stop vote per step; per logging interval
# the metrics and, beyond one node, the nodes' link probe


def _traffic(record: dict[str, Any], categories: tuple[str, ...]) -> dict[str, float]:
    """Summed traffic of these categories in the training phase."""
    out: dict[str, float] = {}
    for cat, t in record["work"]["traffic"].get("train", {}).items():
        if cat in categories:
            for k, v in t.items():
                out[k] = out.get(k, 0) + v
    return out


def _per_step(record: dict[str, Any], key: str, categories: tuple[str, ...] = ("gradients", *CONTROL)) -> float:
    # The first step is counted with start-up (the phase turns at its end): the rest are the steady steps.
    return _traffic(record, categories).get(key, 0) / (record["work"]["steps"] - 1)


def _per_save(record: dict[str, Any], key: str) -> float:
    saves = len(record["work"]["checkpoints"])
    return _traffic(record, ("checkpoint",)).get(key, 0) / saves


def _gradient_wire(record: dict[str, Any]) -> float:
    """Bytes the gradient all-reduce sends per byte of gradient: 2 (p-1)/p for reduce-scatter + allgather."""
    t = _traffic(record, ("gradients",))
    return t.get("sent_bytes", 0) / t["payload_bytes"]


def _ckpt(record: dict[str, Any], key: str) -> float:
    saves = record["work"]["checkpoints"].values()
    return statistics.mean(s.get(key, 0) for s in saves) if saves else 0.0


def _input(record: dict[str, Any], source: str, epoch: str | None = None) -> float:
    tally = record["work"]["inputs"].get(source, {})
    return tally.get("by_epoch", {}).get(epoch, 0) if epoch is not None else tally.get("bytes", 0)


def _startup(record: dict[str, Any], key: str) -> float:
    mark = record["marks"]["startup"]
    return mark["opens"]["shared"] if key == "shared" else mark[key]


@dataclass
class Row:
    name: str
    value: Callable[[Run], float]
    target: str  # "flat", "1/N", "log2 N", "0", "" (timing: ratio only)
    model: Callable[[Run], float] | None = None  # runtime/counting/comm_counts.py's figure for the same count
    how: str = "measured"  # "model": a row with no measurement of its own (named as such)


def _rank0(f: Callable[[dict[str, Any]], float]) -> Callable[[Run], float]:
    return lambda run: f(run.records[0])


def _others_max(f: Callable[[dict[str, Any]], float]) -> Callable[[Run], float]:
    return lambda run: max(f(r) for r in run.records[1:])


def _median(f: Callable[[dict[str, Any]], float]) -> Callable[[Run], float]:
    return lambda run: statistics.median(f(r) for r in run.records)


def _total(f: Callable[[dict[str, Any]], float]) -> Callable[[Run], float]:
    return lambda run: sum(f(r) for r in run.records)


def _divisor(run: Run, rank: int, window: str) -> int:
    record = run.records[rank]
    if window == "steps":
        return record["work"]["steps"] - 1
    if window == "saves":
        return max(1, record.get("spans", {}).get("save", {}).get("count", 1))
    return 1


def _measured(window: str, key: str, ranks: str) -> Callable[[Run], float]:
    """A count the interposer measured in ``window`` (wire_counts windows), per step or per save where the
    window holds several; ``key``: a wire_counts.totals key, ``received_messages`` or ``communication_calls``;
    ``ranks``: ``rank 0`` or ``others`` (the largest of the other ranks)."""

    def value(run: Run) -> float:
        per_rank = run.wire[window]
        if key == "received_messages":
            counts = [float(v) for v in wire_counts.received_messages(per_rank)]
        elif key == "communication_calls":
            counts = [float(wire_counts.communication_calls(c)) for c in per_rank]
        else:
            counts = [float(wire_counts.totals(c)[key]) for c in per_rank]
        counts = [v / _divisor(run, r, window) for r, v in enumerate(counts)]
        return counts[0] if ranks == "rank 0" else max(counts[1:])

    return value


HEADER_BYTES = 32  # libfabric tcp's header on every message (tests/test_wire_counts.py measures it)


def _payload_ratio(run: Run) -> float:
    """Rank 0's bytes sent per step, less a header per message, per byte of the step's payloads: at most
    2 (N-1)/N for the all-reduces (reduce-scatter + all-gather), and never more than 2."""
    sent = _measured("steps", "sent_bytes", "rank 0")(run) - HEADER_BYTES * _measured("steps", "sent_messages",
                                                                                       "rank 0")(run)
    return sent / _per_step(run.records[0], "payload_bytes")


def _connections(run: Run) -> float:
    """The most TCP connections one rank opened or accepted over the whole run (the interposer's count)."""
    return float(max(len(r["marks"]["exit"]["wire"]["connections"]) for r in run.records))


def _whole_run_unseen(run: Run) -> float:
    """Rank 0's MPI communication calls the Python counter (runtime/counting/comm_counts.py) did not see."""
    record = run.records[0]
    python = sum(t["calls"] for phase in record["work"]["traffic"].values() for t in phase.values())
    return wire_counts.communication_calls(record["marks"]["exit"]["wire"]) - python


def _files(window: tuple[str | None, str], kind: str, where: str | None = None) -> Callable[[Run], float]:
    """The largest rank's count of ``kind`` (syscall_trace.KINDS) between two marks (strace of every rank);
    ``where``: one location, or None for all; per step for the window between the first step and the end."""

    def value(run: Run) -> float:
        out = []
        for r, windows in enumerate(run.traces):
            counts = syscall_trace.between(windows, *window)[kind]
            n = counts[where] if where else sum(counts.values())
            out.append(n / (run.records[r]["work"]["steps"] - 1 if window[0] == "first_step" else 1))
        return max(out)

    return value


STARTUP, TRAINING = (None, "startup"), ("first_step", "trained")

ROWS = [
    Row("start-up: files opened on the shared path, per rank (median)", _median(lambda r: _startup(r, "shared")),
        "flat"),
    Row("start-up: shared-path opens of code (.py .pyc .so ...), max rank",
        lambda run: max(_startup(r, "shared_code_opens") for r in run.records), "flat"),
    Row("start-up (strace): opens, max rank", _files(STARTUP, "opens"), "flat"),
    Row("start-up (strace): opens on the shared path, max rank", _files(STARTUP, "opens", "shared"), "flat"),
    Row("start-up (strace): stat-family calls, max rank", _files(STARTUP, "stats"), "flat"),
    Row("start-up (strace): stat-family calls on the shared path, max rank", _files(STARTUP, "stats", "shared"),
        "flat"),
    Row("start-up (strace): directory reads (getdents64), max rank", _files(STARTUP, "readdirs"), "flat"),
    Row("start-up (strace): bytes read from files, max rank", _files(STARTUP, "read_bytes"), "flat"),
    Row("start-up (strace): bytes read from the shared path, max rank", _files(STARTUP, "read_bytes", "shared"),
        "flat"),
    Row("per step (strace, saves included): opens on the shared path, max rank", _files(TRAINING, "opens", "shared"),
        "flat"),
    Row("per step (strace, saves included): stat-family calls on the shared path, max rank",
        _files(TRAINING, "stats", "shared"), "flat"),
    Row("per step (strace, saves included): bytes read from the shared path, max rank",
        _files(TRAINING, "read_bytes", "shared"), "flat"),
    Row("input: coordinate bytes read per epoch, per rank (median)", _median(lambda r: _input(r, "coordinates", "0")),
        "1/N"),
    Row("input: coordinate read calls per rank (max)", lambda run: max(_input_reads(r) for r in run.records), "flat"),
    Row("input: volume bytes read from the shared path, per node",
        lambda run: _total(lambda r: _input(r, "volume"))(run) / run.nodes, "flat"),
    Row("input: volume bytes read, max rank", lambda run: max(_input(r, "volume") for r in run.records), "flat"),
    Row("start-up: MPI communication calls, rank 0", _measured("startup", "communication_calls", "rank 0"), "flat"),
    Row("start-up: messages sent, rank 0", _measured("startup", "sent_messages", "rank 0"), "log2 N",
        _rank0(lambda r: _traffic_phase(r, "startup", "sent_messages"))),
    Row("start-up: messages received, rank 0", _measured("startup", "received_messages", "rank 0"), "log2 N",
        _rank0(lambda r: _traffic_phase(r, "startup", "received_messages"))),
    Row("per step: MPI communication calls, rank 0", _measured("steps", "communication_calls", "rank 0"), "flat",
        _rank0(lambda r: _per_step(r, "calls"))),
    Row("per step: MPI communication calls, other ranks (max)", _measured("steps", "communication_calls", "others"),
        "flat", _others_max(lambda r: _per_step(r, "calls"))),
    Row("per step: payload bytes, rank 0", _rank0(lambda r: _per_step(r, "payload_bytes")), "flat"),
    Row("per step: messages sent, rank 0", _measured("steps", "sent_messages", "rank 0"), "log2 N",
        _rank0(lambda r: _per_step(r, "sent_messages"))),
    Row("per step: messages sent, other ranks (max)", _measured("steps", "sent_messages", "others"), "log2 N",
        _others_max(lambda r: _per_step(r, "sent_messages"))),
    Row("per step: messages received, rank 0", _measured("steps", "received_messages", "rank 0"), "log2 N",
        _rank0(lambda r: _per_step(r, "received_messages"))),
    Row("per step: bytes sent (message headers included), rank 0", _measured("steps", "sent_bytes", "rank 0"),
        "log2 N", _rank0(lambda r: _per_step(r, "sent_bytes"))),
    Row("per step: gradient bytes sent per gradient byte, rank 0", _rank0(_gradient_wire), "<= 2", how="model"),
    Row("per save: MPI communication calls, rank 0", _measured("saves", "communication_calls", "rank 0"), "flat",
        _rank0(lambda r: _per_save(r, "calls"))),
    Row("per save: messages sent, other ranks (max)", _measured("saves", "sent_messages", "others"), "log2 N",
        _others_max(lambda r: _per_save(r, "sent_messages"))),
    Row("per save: messages received, rank 0", _measured("saves", "received_messages", "rank 0"), "log2 N",
        _rank0(lambda r: _per_save(r, "received_messages"))),
    Row("close: MPI communication calls, rank 0", _measured("close", "communication_calls", "rank 0"), "flat"),
    Row("close: messages sent, rank 0", _measured("close", "sent_messages", "rank 0"), "log2 N"),
    Row("per save: record bytes received, rank 0", _rank0(lambda r: _ckpt(r, "record_bytes")), "flat"),
    Row("per save: shared files written, rank 0", _rank0(lambda r: _ckpt(r, "files")), "flat"),
    Row("per save: shared files written, all ranks", _total(lambda r: _ckpt(r, "files")), "<= nodes + 2"),
    Row("per save: rank state handed over node-locally, bytes per rank (max)",
        lambda run: max(_ckpt(r, "node_local_bytes") for r in run.records), "flat"),
    Row("per save: files in the step directory", lambda run: float(run.files_per_save), "<= nodes + 2"),
    Row("per save: mkdir + fsync of the step directory, all ranks (strace)",
        lambda run: float(sum(run.step_dir_ops.values())), "<= nodes + 2"),
    Row("whole run: TCP connections, max rank", _connections, "log2 N"),
    Row("time to the first step, s (all ranks)", lambda run: run.first_step_s, ""),
]


def _store(record: dict[str, Any], phase: str) -> float:
    """Calls this rank sent to the rendezvous store's server in ``phase`` (measured,
    runtime/counting/store_counts.py)."""
    return record.get("store", {}).get("totals", {}).get(phase, 0)


def _served_by_rank0(phase: str) -> Callable[[Run], float]:
    """What rank 0's TCPStore served in ``phase``: every rank's calls to it (0 where no rank hosts a store)."""
    return lambda run: sum(_store(r, phase) for r in run.records if r.get("store", {}).get("server") == "rank 0")


def _per_train_second(run: Run) -> float:
    seconds = min(r["store"]["close_started"] - r["work"]["first_step_end"] for r in run.records)
    return _served_by_rank0("train")(run) / seconds


# Rows that hold only where MPI carries the collectives: the header left out is libfabric's, and the Python counter
# counts the MPI calls of the runtime's collectives.
MPI_ROWS = [
    Row("per step: bytes sent per payload byte, message headers left out, rank 0", _payload_ratio, "<= 2"),
    Row("whole run: MPI communication calls the Python counter did not see, rank 0", _whole_run_unseen, "flat"),
]

STORE_ROWS = [
    Row("store: calls served by rank 0 at start-up", _served_by_rank0("startup"), "<= 10 N"),
    Row("store: calls served by rank 0 at start-up, per rank", lambda run: _served_by_rank0("startup")(run) / run.ranks,
        "flat"),
    Row("store: calls served by rank 0 per training second", _per_train_second, "<= N/64"),
    Row("store: calls served by rank 0 per step", lambda run: _served_by_rank0("train")(run) / (STEPS - 1), "0"),
    Row("store: calls served by rank 0 at close", _served_by_rank0("close"), "<= 2 N"),
    Row("store: connections accepted by rank 0",
        lambda run: sum(r["store"]["connections"] for r in run.records if r["store"]["server"] == "rank 0"),
        "<= 2 N"),
    Row("store: gloo rendezvous reads answered in the rank, per rank (max)",
        lambda run: max(r["store"]["local_calls"] for r in run.records), "<= 3 N"),
]
STAGED_ROWS = [
    Row("staged start-up: shared-path opens of code, max rank",
        lambda run: max(_startup(r, "shared_code_opens") for r in run.records), "0"),
    Row("staged: shared-path opens outside the run directory, max rank",
        lambda run: max(r["shared_opens_outside_run_dir"] for r in run.records), "0"),
    Row("staged start-up (strace): opens on the shared path, max rank",
        _files(STARTUP, "opens", "shared"), "flat"),
    Row("staged: time to the first step, s (all ranks)", lambda run: run.first_step_s, ""),
]


def _traffic_phase(record: dict[str, Any], phase: str, key: str) -> float:
    return sum(t.get(key, 0) for t in record["work"]["traffic"].get(phase, {}).values())


def _input_reads(record: dict[str, Any]) -> float:
    return record["work"]["inputs"].get("coordinates", {}).get("reads", 0)


def log2_fit(values: dict[int, float]) -> tuple[float, float, float]:
    """(a, b, worst relative miss) of the least-squares line a + b log2 N through the counts."""
    xs, ys = [math.log2(n) for n in sorted(values)], [values[n] for n in sorted(values)]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = round(my - b * mx, 9)  # a fit through exact counts leaves rounding noise, not a constant
    miss = max(abs(a + b * x - y) / y for x, y in zip(xs, ys, strict=True) if y)
    return a, b, miss


def _ratio(values: dict[int, float]) -> tuple[float, str]:
    """The largest N's value over the smallest N's, and as the table writes it."""
    lo, hi = values[min(values)], values[max(values)]
    ratio = hi / lo if lo else (1.0 if hi == 0 else math.inf)
    return ratio, f"{ratio:.3g}"


def verdict(row: Row, values: dict[int, float], nodes: dict[int, int] | None = None) -> tuple[str, str, str]:
    """(ratio text, target text, 'ok' / 'MISSED' / '') of a row against its target; ``nodes``: the stand-in
    nodes of each N (default: one rank per node)."""
    ns = sorted(values)
    ratio, text = _ratio(values)
    if row.target == "flat":
        return text, "flat (<= 1.1)", "ok" if ratio <= 1.1 else "MISSED"
    if row.target == "1/N":
        want = ns[0] / ns[-1]
        return text, f"1/N ({want:.3g})", "ok" if abs(ratio - want) <= 0.1 * want else "MISSED"
    if row.target == "log2 N":
        # Grows no faster than log2 N: the increase per doubling of N, between the two largest N, is at most 1.1
        # times (plus one) the largest increase per doubling below them. O(log N) adds a constant per doubling,
        # O(N) doubles it. Measured counts follow the algorithms MPICH picks per size, not one line a + b log2 N:
        # the fit is shown, and extrapolates.
        a, b, _ = log2_fit(values)
        fit = f"<= log2 N (fit {a + 0.0:.2f} + {b:.2f} log2 N)"
        if len(ns) < 3:
            return text, fit, ""
        steps = [(values[hi] - values[lo]) / (math.log2(hi) - math.log2(lo)) for lo, hi in pairwise(ns)]
        return text, fit, "ok" if steps[-1] <= 1.1 * max(steps[:-1]) + 1 else "MISSED"
    if row.target == "0":
        return text, "0", "ok" if max(values.values()) == 0 else "MISSED"
    if row.target == "<= nodes + 2":
        nodes = nodes or {n: n for n in values}
        return text, row.target, "ok" if all(v <= nodes[n] + 2 for n, v in values.items()) else "MISSED"
    if row.target == "<= 2":
        return text, "<= 2 (2 (N-1)/N)", "ok" if max(values.values()) <= 2 else "MISSED"
    if row.target.endswith(" N") or row.target == "<= N/64":  # a bound proportional to N, at every N
        factor = 1 / 64 if row.target == "<= N/64" else float(row.target.split()[1])
        return text, row.target, "ok" if all(v <= factor * n for n, v in values.items()) else "MISSED"
    return text, "timing", ""


TARGET_NODES, TARGET_PER_NODE = 2048, 8
TARGET_RANKS = TARGET_NODES * TARGET_PER_NODE


def extrapolate(row: Row, values: dict[int, float], ranks: int = TARGET_RANKS,
                nodes: dict[int, int] | None = None) -> float | None:
    """The count at ``ranks`` from the fit its target names: flat (the largest N's value), 1/N (scaled), log2 N
    (a + b log2 N through the counts), per node (a straight line in the nodes through the two largest N, at
    ``ranks / 8`` nodes); None for a timing."""
    ns = sorted(values)
    if row.target == "<= nodes + 2":
        nodes = nodes or {n: n for n in values}
        far_nodes = ranks // TARGET_PER_NODE
        if len(ns) < 2 or nodes[ns[-1]] == nodes[ns[-2]]:
            return values[ns[-1]]
        slope = (values[ns[-1]] - values[ns[-2]]) / (nodes[ns[-1]] - nodes[ns[-2]])
        return values[ns[-1]] + slope * (far_nodes - nodes[ns[-1]])
    if row.target in ("flat", "0", "<= 2"):
        return values[ns[-1]]
    if row.target == "1/N":
        return values[ns[-1]] * ns[-1] / ranks
    if row.target == "log2 N":
        a, b, _ = log2_fit(values)
        return a + b * math.log2(ranks)
    return None


def table(rows: list[Row], runs: list[Run]) -> tuple[str, list[dict[str, Any]]]:
    """Each row measured, its target checked against the measured values; where runtime/counting/comm_counts.py models
    the same count, a second line shows the model's values (no verdict)."""
    ns = [r.ranks for r in runs]
    nodes = {r.ranks: r.nodes for r in runs}
    head = (f"| count | how | {' | '.join(f'N={n} ({nodes[n]} nodes)' for n in ns)} | N={ns[-1]}/N={ns[0]} | "
            f"N={TARGET_RANKS} (fit) | target | |")
    lines = [head, "|---|---|" + "---:|" * len(ns) + "---:|---:|---|---|"]
    data = []
    for row in rows:
        values = {run.ranks: row.value(run) for run in runs}
        ratio, target, ok = verdict(row, values, nodes)
        far = extrapolate(row, values, nodes=nodes)
        cells = " | ".join(f"{values[n]:.4g}" for n in ns)
        lines.append(f"| {row.name} | {row.how} | {cells} | {ratio} | {'' if far is None else f'{far:.4g}'} | "
                     f"{target} | {ok} |")
        entry = {"count": row.name, "how": row.how, "values": values, "nodes": nodes, "ratio": ratio,
                 "target": row.target, "verdict": ok, f"at_{TARGET_RANKS}": far}
        if row.model is not None:
            model = {run.ranks: row.model(run) for run in runs}
            model_ratio, _, _ = verdict(row, model, nodes)
            model_far = extrapolate(row, model, nodes=nodes)
            cells = " | ".join(f"{model[n]:.4g}" for n in ns)
            lines.append("| ↳ the same, modelled (runtime/counting/comm_counts.py) | model | "
                         f"{cells} | {model_ratio} | "
                         f"{'' if model_far is None else f'{model_far:.4g}'} | | |")
            entry["model"] = model
        data.append(entry)
    return "\n".join(lines), data


def beside(stand_in: list[dict[str, Any]], real: list[dict[str, Any]]) -> str:
    """Two of ``table``'s row lists, stand-in nodes and real nodes of the same N and K, side by side: at each N
    both values (the real one in bold where it differs), each one's ratio against its own smallest N and its
    verdict against the row's target."""
    ns = sorted(stand_in[0]["values"])
    nodes = real[0]["nodes"]
    lines = ["| count | how | " + " | ".join(f"N={n} ({nodes[n]} nodes): stand-in | real" for n in ns)
             + f" | N={ns[-1]}/N={ns[0]}: stand-in | real | target | stand-in | real |",
             "|---|---|" + "---:|" * (2 * len(ns) + 2) + "---|---|---|"]
    for one, other in zip(stand_in, real, strict=True):
        target = verdict(Row(one["count"], len, one["target"]), one["values"], nodes)[1].split(" (fit")[0]
        pairs = [(one["count"], one["how"], "values", target, one["verdict"], other["verdict"])]
        if "model" in one:
            pairs.append(("↳ the same, modelled (runtime/counting/comm_counts.py)", "model", "model", "", "", ""))
        for name, how, key, target, ok, real_ok in pairs:
            a, b = one[key], other[key]
            cells = []
            for n in ns:
                x, y = f"{a[n]:.4g}", f"{b[n]:.4g}"
                cells += [x, f"**{y}**" if x != y and one["target"] else y]  # a timing differs anyway
            lines.append(f"| {name} | {how} | {' | '.join(cells)} | {_ratio(a)[1]} | {_ratio(b)[1]} | {target} | "
                         f"{ok} | {real_ok} |")
    return "\n".join(lines)


def _shared_ports(run: Run) -> int:
    """Connections whose pair of ports another connection of the run has too: on real nodes ports repeat from
    node to node, and wire_counts.received_messages pairs a connection's two ends by their ports alone."""
    pairs = [tuple(c[:2]) for r in run.records for c in r["marks"]["exit"].get("wire", {}).get("connections", [])]
    return len(pairs) - len(set(pairs))


def plot(data: list[dict[str, Any]], path: str) -> None:
    """Three panels, one per target (flat, 1/N, log2 N): each count divided by its value at the smallest N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = (("flat", "flat in N (<= 1.1)"), ("1/N", "1/N"), ("log2 N", "log2 N (the algorithm's)"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 6.5), sharey=True)
    for ax, (target, title) in zip(axes, targets, strict=True):
        shown = [d for d in data if d["target"] == target and min(d["values"].values()) > 0]
        ns = sorted(shown[0]["values"])
        reference = ([1.0] * len(ns) if target == "flat" else [ns[0] / n for n in ns] if target == "1/N"
                     else [math.log2(n) / math.log2(ns[0]) for n in ns])
        ax.plot(ns, reference, color="black", lw=6, alpha=0.15, label=f"{target}: the target")
        for i, d in enumerate(shown):
            base = d["values"][ns[0]]
            ax.plot(ns, [d["values"][n] / base for n in ns], marker="o", ms=4, lw=1,
                    linestyle=("-", "--", ":", "-.")[i % 4], label=d["count"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("ranks N (one node, MPICH, oversubscribed)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)
    axes[0].set_ylabel(f"count / count at N={ns[0]}")
    fig.suptitle("Per-rank counts of hpctrain run against the number of ranks (benchmarks/scale.py)")
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    os.replace(tmp, path)


def staged_python(work: Path) -> tuple[str, dict[str, str]]:
    """Pack this environment (envpack, cached) and unpack it once into a node-local directory, as a staged job's
    node step does; returns the copy's interpreter and the variables the rendered script sets for the ranks."""
    from hpctrain.submission import envpack

    packed = envpack.pack(Path(tempfile.gettempdir()) / "hpctrain-scale-env-cache", "scale")
    node = work / "node-local"
    step = REPO / "hpctrain" / "submission" / "schedulers" / "templates" / "stage_node.tmpl"
    subprocess.run(["bash", str(step), "check", str(node), "1", str(work), "--", "unpack", str(node),
                    packed.archive], check=True)
    venv = node / "env" / "venv"
    # TMPDIR: torch._dynamo's import asks tempfile for its directory, which probes it with a file of a random
    # name. /tmp is node-local on a cluster; on this machine it is not told apart from the shared path.
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
           "LD_LIBRARY_PATH": str(node / "env" / "libpython"), "PYTHONNOUSERSITE": "1",
           counters.NODE_LOCAL_ENV: str(node), "TMPDIR": str(node)}
    return str(venv / "bin" / "python"), env


def cluster_settings() -> dict[str, str]:
    """The cluster of namespace nodes' settings (``scripts/ci/cluster.sh env``): partition, shared directory,
    node-local scratch."""
    said = subprocess.run(["bash", str(REPO / "scripts" / "ci" / "cluster.sh"), "env"], capture_output=True,
                          text=True, check=True, stdin=subprocess.DEVNULL).stdout
    return {k: shlex.split(v)[0] if v else "" for k, _, v in
            (line.removeprefix("export ").partition("=") for line in said.splitlines() if line.startswith("export "))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--staged", action="store_true", help="also run each N from a node-local environment copy")
    parser.add_argument("--plot", default=None, help="write the counts against N to this .png")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--backend", choices=["mpi", "gloo"], default="mpi", help="the ranks' communication backend")
    parser.add_argument("--store", action="store_true",
                        help="gloo: meet at a TCPStore on rank 0 (MASTER_ADDR) instead of bootstrapping over MPI")
    parser.add_argument("--gloo-ring", action="store_true",
                        help="gloo: gloo's own ring all-reduce and torch's ring all-gather over a full mesh (the "
                             "baseline of hpctrain's own)")
    parser.add_argument("--ranks-per-node", type=int, default=1,
                        help="ranks per stand-in node, and per real node with --nodes (default 1)")
    parser.add_argument("--nodes", type=int, nargs="+", default=None,
                        help="also run on this many real nodes each (srun), beside stand-in nodes of the same N "
                             "and K (--ranks is then nodes x K)")
    parser.add_argument("--partition", default=None,
                        help="--nodes: the Slurm partition (default: the cluster of scripts/ci/cluster.sh)")
    parser.add_argument("--scratch", default=None,
                        help="--nodes: each node's own storage (default: the cluster's node-local scratch)")
    args = parser.parse_args()
    real = None
    if args.nodes:
        if args.staged or args.plot:
            parser.error("--staged and --plot are for stand-in nodes only; leave them out with --nodes")
        cluster = cluster_settings() if None in (args.partition, args.scratch, args.out) else {}
        real = RealNodes(args.partition or cluster["HPCTRAIN_CLUSTER_PARTITION"],
                         args.scratch or cluster["HPCTRAIN_CLUSTER_SCRATCH"])
        args.ranks = [n * args.ranks_per_node for n in args.nodes]
        # Every node reads the interposer and writes its records and traces here: the shared file system.
        args.out = args.out or tempfile.mkdtemp(prefix="hpctrain-scale-", dir=cluster["HPCTRAIN_CLUSTER_SHARED"])
    out = Path(args.out or tempfile.mkdtemp(prefix="hpctrain-scale-"))
    library = wire_counts.build(out / "wire")
    extra = ({"HPCTRAIN_GLOO_ALLREDUCE": "gloo", "HPCTRAIN_GLOO_ALLGATHER": "gloo", "TORCH_GLOO_LAZY_INIT": "0"}
             if args.gloo_ring else {})
    runs = []
    for n in args.ranks:
        run = run_once(n, out / "shared-env", sys.executable, backend=args.backend, store=args.store,
                       wire_library=library, ranks_per_node=args.ranks_per_node, extra_env=extra)
        print(f"N={n}: {run.wall_s:.0f} s, first step after {run.first_step_s:.1f} s, "
              f"lowest MemAvailable {run.min_available_mb:.0f} MB", file=sys.stderr, flush=True)
        runs.append(run)
    text, data = table(ROWS + (MPI_ROWS if args.backend == "mpi" else STORE_ROWS), runs)
    if args.staged:
        python, env = staged_python(out)
        staged = []
        for n in args.ranks:
            # Not preloaded here: the interposer and the MPI library it links lie on the shared path, and the
            # staged rows count what a rank opens there.
            run = run_once(n, out / "staged-env", python, env, backend=args.backend, store=args.store,
                           ranks_per_node=args.ranks_per_node, extra_env=extra)
            print(f"N={n} staged: {run.wall_s:.0f} s, first step after {run.first_step_s:.1f} s", file=sys.stderr,
                  flush=True)
            staged.append(run)
        more, more_data = table(STAGED_ROWS, staged)
        text += "\n" + "\n".join(more.splitlines()[2:])
        data += more_data
    if real is not None:
        on_nodes = []
        for n in args.ranks:
            run = run_once(n, out / "real-nodes", sys.executable, backend=args.backend, store=args.store,
                           wire_library=library, ranks_per_node=args.ranks_per_node, extra_env=extra, real=real)
            hosts = sorted({r["host"] for r in run.records})
            print(f"N={n} on {', '.join(hosts)}: {run.wall_s:.0f} s with the queue, first step after "
                  f"{run.first_step_s:.1f} s", file=sys.stderr, flush=True)
            if len(hosts) != run.nodes:
                raise SystemExit(f"N={n}: the ranks ran on {len(hosts)} hosts, expected {run.nodes} nodes")
            if _shared_ports(run):
                print(f"N={n}: {_shared_ports(run)} connections share their ports with another: messages received "
                      "may be paired with the wrong sender", file=sys.stderr)
            on_nodes.append(run)
        _, real_data = table(ROWS + (MPI_ROWS if args.backend == "mpi" else STORE_ROWS), on_nodes)
        text = beside(data, real_data)
        data = [{**d, "nodes_are": "stand-in"} for d in data] + [{**d, "nodes_are": "real"} for d in real_data]
    print(text)
    for last, which in [(runs[-1], "")] + ([(on_nodes[-1], ", real nodes")] if real is not None else []):
        algorithms = sorted({f"{k}: {', '.join(v)}" for r in last.records for k, v in r["work"]["algorithms"].items()})
        print(f"\nalgorithms counted (N={last.ranks}{which}): " + "; ".join(algorithms))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    if args.plot:
        plot(data, args.plot)
    return 0 if all(d["verdict"] != "MISSED" for d in data) else 1


if __name__ == "__main__":
    raise SystemExit(main())
