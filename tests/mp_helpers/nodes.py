"""Several "nodes" on this one machine, as a stand-in for a multi-node job: each node's ranks get torchrun's
variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK) and their own node-local directory
($HPCTRAIN_NODE_LOCAL), which is what tells one node's storage from another's; they rendezvous over gloo.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCH_PREFIXES = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "TORCHELASTIC", "HPCTRAIN_", "PALS_")
LAUNCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_PREFIXES) and k not in LAUNCH_NAMES}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def run_on_nodes(argv: Sequence[str], nodes: int, per_node: int, node_dirs: Sequence[Path], *,
                 timeout: float = 300, node_env: Sequence[dict[str, str]] = (),
                 **extra: str) -> list[subprocess.CompletedProcess[str]]:
    """Run ``argv`` as ``nodes`` x ``per_node`` ranks (rank = node * per_node + local rank); each rank's output.
    ``node_env``: more variables per node (a launcher's per-node ones, such as Slurm's SLURMD_NODENAME)."""
    port = _free_port()
    procs = []
    for node in range(nodes):
        for local in range(per_node):
            env = clean_environment(**extra)
            env.update(RANK=str(node * per_node + local), WORLD_SIZE=str(nodes * per_node), LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), HPCTRAIN_NODE_LOCAL=str(node_dirs[node]))
            env.update(node_env[node] if node < len(node_env) else {})
            procs.append(subprocess.Popen(list(argv), cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, ""))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


if __name__ == "__main__":  # python nodes.py NODES PER_NODE DIR0,DIR1 -- ARGV...
    split = sys.argv.index("--")
    n, k, dirs = int(sys.argv[1]), int(sys.argv[2]), [Path(d) for d in sys.argv[3].split(",")]
    for r in run_on_nodes(sys.argv[split + 1:], n, k, dirs):
        print(r.stdout)
