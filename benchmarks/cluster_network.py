"""The network between two nodes of the cluster of namespace nodes (scripts/ci/cluster.sh), measured for the
``network:`` figures of site_configs/ci-cluster.yaml: MPI ping-pong and all-reduce between one rank on each of two
nodes (srun --mpi=pmi2, the MPICH wheel's mpi4py), 8 B to 64 MB, against the same two ranks on one node (the
baseline: shared memory, no link).

Run (with the cluster started): .venv/bin/python benchmarks/cluster_network.py [--reps 20] [--rate 200mbit]
``--rate`` limits the second node's link first (cluster.sh link NODE rate RATE) and restores it afterwards: the
fitted bandwidth should then read as that rate.

Prints per size the median one-way time (half a round trip) and all-reduce time on each placement, their ratio,
and a fit ``t = latency + bytes / bandwidth`` of the across-node ping-pong: the profile's ``latency_us`` and
``nic_gbps`` (GB/s). Medians of ``--reps`` after 3 untimed; the machine's other load moves them, so the fit is
reported with the spread of its input.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "scripts" / "ci" / "cluster.sh"
SIZES = [8, 1024, 65536, 1 << 20, 8 << 20, 64 << 20]
WORKER = """
import json, sys, time
import numpy as np
from mpi4py import MPI
world, reps = MPI.COMM_WORLD, int(sys.argv[1])
out = {"hosts": world.allgather(MPI.Get_processor_name()), "sizes": {}}
for size in [int(s) for s in sys.argv[2].split(",")]:
    buf = np.zeros(max(1, size // 4), dtype=np.float32)
    pingpong, allreduce = [], []
    for i in range(reps + 3):
        world.Barrier()
        t = time.perf_counter()
        if world.rank == 0:
            world.Send(buf, 1); world.Recv(buf, 1)
        else:
            world.Recv(buf, 0); world.Send(buf, 0)
        half = (time.perf_counter() - t) / 2
        world.Barrier()
        t = time.perf_counter()
        world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        if i >= 3:
            pingpong.append(half); allreduce.append(time.perf_counter() - t)
    out["sizes"][size] = {"pingpong": pingpong, "allreduce": allreduce}
if world.rank == 0:
    print(json.dumps(out))
"""


def cluster_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(CLUSTER_SH), "env"], capture_output=True, text=True, check=True).stdout
    return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines() if line.startswith("export "))


def measure(partition: str, nodes: int, reps: int, workdir: Path) -> dict:
    script = workdir / "net_worker.py"
    script.write_text(WORKER)
    argv = ["srun", "-p", partition, "-N", str(nodes), "-n", "2", "--mpi=pmi2", "--time=10", sys.executable,
            str(script), str(reps), ",".join(map(str, SIZES))]
    done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"srun failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of t = a + n * b over (bytes, seconds): (latency s, bandwidth bytes/s)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    # The latency from the smallest message alone: the large ones dominate the least-squares intercept.
    return min(ys[0], max(a, 0.0)) or ys[0], 1.0 / b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rate", help="limit the second node's link to this tc rate first (e.g. 200mbit)")
    args = ap.parse_args()
    env = cluster_env()
    nodes = env["HPCTRAIN_CLUSTER_NODE_NAMES"].strip("'").split()
    if len(nodes) < 2:
        raise SystemExit("the cluster has fewer than 2 nodes: bash scripts/ci/cluster.sh start --nodes 2")
    shared = Path(env["HPCTRAIN_CLUSTER_SHARED"])
    shared.mkdir(parents=True, exist_ok=True)
    if args.rate:
        subprocess.run(["bash", str(CLUSTER_SH), "link", nodes[1], "rate", args.rate], check=True)
    try:
        with tempfile.TemporaryDirectory(dir=shared) as tmp:
            across = measure(env["HPCTRAIN_CLUSTER_PARTITION"], 2, args.reps, Path(tmp))
            within = measure(env["HPCTRAIN_CLUSTER_PARTITION"], 1, args.reps, Path(tmp))
    finally:
        if args.rate:
            subprocess.run(["bash", str(CLUSTER_SH), "link", nodes[1], "restore"], check=True)
    print(f"across: ranks on {across['hosts']}; baseline: ranks on {within['hosts']}"
          + (f"; {nodes[1]}'s link limited to {args.rate}" if args.rate else ""))
    print(f"{'bytes':>10} {'one-way across':>15} {'one node':>10} {'ratio':>6} {'all-reduce across':>18} "
          f"{'one node':>10} {'ratio':>6}")
    points = []
    for size in SIZES:
        a, w = across["sizes"][str(size)], within["sizes"][str(size)]
        pa, pw = statistics.median(a["pingpong"]), statistics.median(w["pingpong"])
        ra, rw = statistics.median(a["allreduce"]), statistics.median(w["allreduce"])
        points.append((size, pa))
        print(f"{size:>10} {pa * 1e6:>13.1f}us {pw * 1e6:>8.1f}us {pa / pw:>6.2f} {ra * 1e6:>16.1f}us "
              f"{rw * 1e6:>8.1f}us {ra / rw:>6.2f}")
    latency, bandwidth = fit(points)
    spread = statistics.quantiles(across["sizes"][str(SIZES[0])]["pingpong"], n=4)
    print(f"fit of the across-node one-way time: latency_us {latency * 1e6:.1f} (quartiles of the 8 B times "
          f"{spread[0] * 1e6:.1f}-{spread[2] * 1e6:.1f}), nic_gbps {bandwidth / 1e9:.3f} (GB/s)")


if __name__ == "__main__":
    main()
