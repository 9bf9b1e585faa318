"""Which process runs which rank: one line per rank in ``RUN_DIR/ranks/node-NNNNN.txt``, one log line per node.

Every rank appends ``rank R pid P host H parent Q`` to its node's file before any collective (an MPI launcher names
a dead process by pid, also one that died in MPI_Init); after the first collective the node's local rank 0 reads
the lines of this launch (each of its node's ranks' newest) and prints one summary line. docs/scaling.md,
"Start-up lines".
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpctrain.launch_env import detect_launch_env

DIRECTORY = "ranks"


def node_file(run_dir: Path, node_rank: int) -> Path:
    return run_dir / DIRECTORY / f"node-{node_rank:05d}.txt"


def record_rank(run_dir: Path, environ: Mapping[str, str]) -> Path:
    """Append this process's line to its node's file (one ``write`` of an O_APPEND descriptor: lines do not mix)."""
    env = detect_launch_env(environ)
    path = node_file(run_dir, env.node_rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"rank {env.rank} pid {os.getpid()} host {socket.gethostname()} parent {os.getppid()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return path


def read_ranks(path: Path) -> list[dict[str, str | int]]:
    """Every line of a node's file, oldest first (earlier launches into the same run directory included)."""
    out: list[dict[str, str | int]] = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) != 8:
            continue
        values = dict(zip(fields[0::2], fields[1::2], strict=True))
        out.append({"rank": int(values["rank"]), "pid": int(values["pid"]), "host": values["host"],
                    "parent": int(values["parent"])})
    return out


def spans(numbers: Iterable[int]) -> str:
    """``0,1,2,5,7,8`` -> ``0-2,5,7-8``."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def node_summary(run_dir: Path, environ: Mapping[str, str]) -> str | None:
    """The node's one line: its host, node rank, ranks and pids of this launch, and where the full list is; None
    where no rank recorded itself (a trainer started without ``hpctrain run``)."""
    env = detect_launch_env(environ)
    path = node_file(run_dir, env.node_rank)
    if not path.exists():
        return None
    latest: dict[int, dict[str, str | int]] = {}
    for record in read_ranks(path):  # a rank's newest line last: this launch wrote after any earlier one
        latest.pop(int(record["rank"]), None)
        latest[int(record["rank"])] = record
    mine = dict(list(latest.items())[-env.local_size:])
    ranks = sorted(int(r) for r in mine)
    pids = sorted(int(r["pid"]) for r in mine.values())
    return (f"hpctrain: node {env.node_rank} ({socket.gethostname()}): {len(ranks)} ranks {spans(ranks)}, "
            f"pids {pids[0]}-{pids[-1]}; rank -> pid in {path}" if ranks else
            f"hpctrain: node {env.node_rank} ({socket.gethostname()}): no rank lines in {path}")
