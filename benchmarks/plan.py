"""Validation 2 of ``hpctrain plan``: predicted against measured efficiency of 2 ranks (and 4, oversubscribed on
this 2-core machine) of the FFN demo job, the prediction calibrated from a 1-rank run of the same round.

Run: ``python benchmarks/plan.py [--rounds 3] [--steps 60] [--probe]``. Every round runs 1, 2 and 4 ranks (local
launcher, gloo, as the ``local`` site does) in an order shuffled per round, so other load hits them alike; each
run's profile.json gives rank 0's mean step time (first 3 steps untimed). Measured efficiency = t(1 rank) /
t(N ranks), per-rank batch fixed; predicted = the planner's steady-state efficiency from that round's 1-rank
profile. ``--probe`` first measures the all-reduce latency and bandwidth the site profiles carry.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB = ROOT / "jobs" / "ffn-local.yaml"
# The demo job, smaller volume, no held-out evaluation, one checkpoint at the end; 60 steps stay in warm-up
# (50 steps) and decay: the LR does not change a step's time.
JOB_SETS = ["data.train={synthetic: {shape: [32, 64, 64], seed: 1}}", "data.eval=null"]
RANKS = (1, 2, 4)
PARTS = ("compute_s", "input_s", "reduction_wait_s")

PROBE = r"""
import statistics, sys, time, torch
backend = sys.argv[1]
if backend == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD; rank = comm.rank
    def allreduce(t): comm.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)
    def barrier(): comm.Barrier()
else:
    import torch.distributed as dist
    dist.init_process_group("gloo"); rank = dist.get_rank()
    def allreduce(t): dist.all_reduce(t)
    def barrier(): dist.barrier()
for n in (8, 1 << 20):
    t = torch.ones(max(1, n // 4))
    for _ in range(5): allreduce(t)
    times = []
    for _ in range(60):
        barrier(); s = time.perf_counter(); allreduce(t); times.append(time.perf_counter() - s)
    if rank == 0: print(n, statistics.median(times), flush=True)
"""


class RunFailed(Exception):
    """A training run of the benchmark failed; its output tail is the message."""


def run_job(ranks: int, steps: int, workdir: Path) -> dict:
    """Train the job with ``ranks`` ranks; returns its profile.json with the wall time added."""
    run_dir = workdir / f"r{ranks}-{time.monotonic_ns()}"
    sets = [*JOB_SETS, f"train.steps={steps}", f"checkpoint.every_steps={steps}", "train.log_every=10"]
    cmd = [sys.executable, "-m", "hpctrain", "run", str(JOB), "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [sys.executable, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", str(ranks), "--",
               *cmd]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RunFailed(f"{ranks}-rank run failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    profile = json.loads((run_dir / "profile.json").read_text())
    profile["wall_s"] = time.perf_counter() - start
    profile["run_dir"] = str(run_dir)
    return profile


def predicted(one_rank_dir: str, ranks: int) -> tuple[float, dict[str, float]]:
    """The planner's steady efficiency of ``ranks`` ranks on the local site, from a 1-rank run's profile."""
    from hpctrain.config.job import load_job
    from hpctrain.config.site import load_site
    from hpctrain.planning.inputs import plan_inputs
    from hpctrain.planning.model import predict
    from hpctrain.planning.runs import read_run_dir

    job = load_job(JOB, sets=JOB_SETS)
    inputs = plan_inputs(job, str(JOB), load_site("local"), read_run_dir(Path(one_rank_dir)),
                         [f"ranks_per_node={ranks}"])
    p = predict(inputs.workload, 1)
    return p.steady_efficiency, {k: v for k, v in p.losses.items() if v >= 0.005}


def probe() -> None:
    """Median all-reduce time of 8 B and 1 MB between 2 ranks, gloo and MPI: latency and bandwidth estimates
    for the local and ci-slurm profiles (ring / Rabenseifner on 2 ranks: about 2 alpha + n beta)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PROBE)
    launch = {"gloo": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f.name, "gloo"],
              "mpi": [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable, f.name, "mpi"]}
    for backend, cmd in launch.items():
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout.split()
        small, large = float(out[1]), float(out[3])
        print(f"probe {backend}: 8 B {small * 1e6:.1f} us -> latency ~{small / 2 * 1e6:.1f} us; "
              f"1 MB {large * 1e3:.3f} ms -> ~{2**20 / max(large - small, 1e-9) / 1e9:.2f} GB/s")
    os.unlink(f.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--probe", action="store_true", help="measure all-reduce latency/bandwidth first")
    args = ap.parse_args()
    if args.probe:
        probe()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpctrain-plan-bench-") as tmp:
        for r in range(args.rounds):
            order = list(RANKS)
            random.Random(2000 + r).shuffle(order)
            try:
                profiles = {n: run_job(n, args.steps, Path(tmp)) for n in order}
            except RunFailed as exc:  # shown, and the round left out: the other rounds still count
                print(f"round {r} left out: {exc}", flush=True)
                continue
            t = {n: profiles[n]["step_s"]["mean"] for n in RANKS}
            row = {"round": r, "load": os.getloadavg()[0], "t_ms": {n: 1e3 * t[n] for n in RANKS},
                   "cpu_share": {n: profiles[n]["cpu_s"]["mean"] / t[n] for n in RANKS},
                   "parts_ms": {n: {k: 1e3 * profiles[n][k]["mean"] for k in PARTS} for n in RANKS}}
            for n in RANKS[1:]:
                pred, losses = predicted(profiles[1]["run_dir"], n)
                row[n] = {"measured": t[1] / t[n], "predicted": pred, "losses": losses}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\nround  load  cpu%1  t1 ms  t2 ms  t4 ms | 2 ranks: measured predicted error | 4 ranks (oversubscribed): "
          "measured predicted error")
    for row in rows:
        t = row["t_ms"]
        cells = [f"{row[n]['measured']:.3f} {row[n]['predicted']:.3f} {row[n]['predicted'] - row[n]['measured']:+.3f}"
                 for n in RANKS[1:]]
        print(f"{row['round']:5d}  {row['load']:4.1f}  {100 * row['cpu_share'][1]:5.0f}  {t[1]:5.0f}  {t[2]:5.0f}  "
              f"{t[4]:5.0f} | {cells[0]} | {cells[1]}")
    if not rows:
        sys.exit("no round completed")
    for n in RANKS[1:]:
        errors = [row[n]["predicted"] - row[n]["measured"] for row in rows]
        meas = statistics.median(row[n]["measured"] for row in rows)
        pred = statistics.median(row[n]["predicted"] for row in rows)
        print(f"{n} ranks: median measured {meas:.3f}, median predicted {pred:.3f}, median error "
              f"{statistics.median(errors):+.3f} (per round {', '.join(f'{e:+.3f}' for e in errors)}); "
              f"target |error| <= 0.05")


if __name__ == "__main__":
    main()
