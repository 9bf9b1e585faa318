"""How reliably a 2-rank MPI job step starts under ``srun --mpi=pmi2`` on the local Slurm, with a CPU hog beside it.

One batch job (2 tasks) runs ``--starts`` job steps in a row, each ``srun --mpi=pmi2 -n 2`` of a worker that
imports torch (as ``hpctrain run`` does before ``MPI_Init``), calls ``hpctrain.runtime.comm.mpi_env.import_mpi`` (the
mpich wheel's one-node settings and the ``MPI_Init`` watcher, ``--init-timeout`` s) and a barrier. Each step
prints each rank's ``MPI_Init`` seconds; a step whose ranks do not finish is a failed start. ``--hog N`` runs N
busy processes (``stress-ng --cpu N`` when installed, else Python loops) for the whole measurement.
``--requeue-after-kill``: the job instead requeues itself after each start, and the ranks of every start but the
last kill themselves after the barrier, so each later start is the same job step meeting what a killed run left
(MPICH's shared-memory segment of that step: docs/runtime.md).
Needs the Slurm of ``scripts/ci/slurm.sh`` (its ``env`` output exported). Results (JSON and the job's output)
go to a new temporary directory unless ``--out`` names one.
Usage: ``python benchmarks/mpi_starts.py [--starts 20] [--hog 4] [--no-torch] [--requeue-after-kill] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = """\
import json, os, sys, time
t0 = time.monotonic()
sys.path.insert(0, {repo!r})
if {torch}:
    import torch  # noqa: F401
from hpctrain.runtime.comm.mpi_env import import_mpi
t1 = time.monotonic()
MPI = import_mpi(timeout_s={timeout})
t2 = time.monotonic()
MPI.COMM_WORLD.Barrier()
print(json.dumps({{"rank": MPI.COMM_WORLD.Get_rank(), "imports_s": round(t1 - t0, 3), "init_s": round(t2 - t1, 3),
                  "netmod": os.environ.get("MPICH_CH4_NETMOD"), "provider": os.environ.get("FI_PROVIDER")}}),
      flush=True)
if {kill} and int(os.environ.get("SLURM_RESTART_COUNT", "0")) < {starts} - 1:
    os.kill(os.getpid(), 9)  # no MPI_Finalize: what a walltime kill or srun --kill-on-bad-exit does
"""

# One job step per start; the step's wall time and exit status on a line of their own.
BATCH = """\
#!/bin/bash
for i in $(seq 1 {starts}); do
    start=$(date +%s.%N)
    timeout {step_timeout} srun --mpi=pmi2 --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 \\
        --kill-on-bad-exit=1 {python} {worker} 2>&1
    rc=$?
    echo "STEP $i rc=$rc wall=$(echo "$(date +%s.%N) - $start" | bc)"
done
"""

# One start per run of the job, which requeues itself: every start is step 0 of the same job.
REQUEUED = """\
#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
restart=${{SLURM_RESTART_COUNT:-0}}
start=$(date +%s.%N)
timeout {step_timeout} srun --mpi=pmi2 --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 \\
    --kill-on-bad-exit=1 {python} {worker} 2>&1
rc=$?
echo "STEP $((restart + 1)) rc=$rc wall=$(echo "$(date +%s.%N) - $start" | bc)"
if [ "$restart" -lt $(({starts} - 1)) ]; then scontrol requeue "$SLURM_JOB_ID"; fi
"""


def start_hog(n: int) -> list[subprocess.Popen[bytes]]:
    if n <= 0:
        return []
    if shutil.which("stress-ng"):
        return [subprocess.Popen(["stress-ng", "--cpu", str(n), "--quiet"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)]
    loop = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", loop], start_new_session=True) for _ in range(n)]


def stop_hog(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # stress-ng's workers are its children, in its session
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def parse(output: str) -> list[dict[str, object]]:
    """One record per start: rc, wall, and the ranks' JSON lines (in the order they came)."""
    starts: list[dict[str, object]] = []
    ranks: list[dict[str, object]] = []
    other: list[str] = []
    for line in output.splitlines():
        step = re.match(r"STEP (\d+) rc=(-?\d+) wall=([0-9.]+)", line)
        if step:
            starts.append({"start": int(step.group(1)), "rc": int(step.group(2)), "wall_s": float(step.group(3)),
                           "ranks": ranks, "other": other[-20:]})
            ranks, other = [], []
        elif line.startswith("{"):
            ranks.append(json.loads(line))
        elif line.strip():
            other.append(line)
    return starts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--hog", type=int, default=4, help="busy processes beside the job (0: none)")
    parser.add_argument("--no-torch", action="store_true", help="do not import torch before MPI_Init")
    parser.add_argument("--requeue-after-kill", action="store_true",
                        help="every start is the same job step, after a run whose ranks were killed")
    parser.add_argument("--init-timeout", type=float, default=120.0, help="import_mpi's MPI_Init watcher (s)")
    parser.add_argument("--out", type=Path, help="directory for results.json and job.out (default: a new temp dir)")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        print("mpi_starts: no sbatch on PATH; start Slurm with `bash scripts/ci/slurm.sh start` and export "
              "`bash scripts/ci/slurm.sh env`", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="hpctrain-mpi-starts-"))
    out.mkdir(parents=True, exist_ok=True)
    worker = out / "worker.py"
    worker.write_text(WORKER.format(repo=str(REPO), torch=not args.no_torch, timeout=args.init_timeout,
                                    kill=args.requeue_after_kill, starts=args.starts))
    batch = out / "job.sh"
    batch.write_text((REQUEUED if args.requeue_after_kill else BATCH).format(
        starts=args.starts, step_timeout=int(args.init_timeout + 60), python=shlex.quote(sys.executable),
        worker=shlex.quote(str(worker))))
    hog = start_hog(args.hog)
    try:
        submitted = subprocess.run(["sbatch", "--parsable", "-n", "2", "-J", "mpi-starts", "-o",
                                    str(out / "job.out"), "--export", "ALL,OMP_NUM_THREADS=1", str(batch)],
                                   capture_output=True, text=True, check=True, cwd=out)
        job = submitted.stdout.strip().split(";")[0]
        print(f"job {job}: {args.starts} starts, hog {args.hog}, output in {out}", flush=True)
        loads = []
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            loads.append(os.getloadavg()[0])
            time.sleep(2)
    finally:
        stop_hog(hog)
    starts = parse((out / "job.out").read_text())
    inits = [float(r["init_s"]) for s in starts for r in s["ranks"]]  # type: ignore[union-attr]
    # a start is good when both ranks passed MPI_Init and the barrier (with --requeue-after-kill they then die)
    good = [s for s in starts if len(s["ranks"]) == 2 and (s["rc"] == 0 or args.requeue_after_kill)]  # type: ignore[arg-type]
    for s in starts:
        ranks = s["ranks"]
        line = " ".join(f"rank {r['rank']} init {r['init_s']:.2f} s" for r in ranks)  # type: ignore[union-attr]
        print(f"start {s['start']:3d}: rc {s['rc']}, {s['wall_s']:.1f} s  {line}")
        if s not in good:
            print("    " + "\n    ".join(s["other"]))  # type: ignore[arg-type]
    summary = {"starts": len(starts), "ok": len(good), "failed": len(starts) - len(good),
               "init_s_median": statistics.median(inits) if inits else None, "init_s_max": max(inits, default=None),
               "load_avg_median": statistics.median(loads) if loads else None, "hog": args.hog,
               "torch": not args.no_torch, "requeue_after_kill": args.requeue_after_kill, "cpu": os.cpu_count(),
               "removed_stale_segments": (out / "job.out").read_text().count("hpctrain: removed /dev/shm/")}
    print(json.dumps(summary))
    (out / "results.json").write_text(json.dumps({"summary": summary, "starts": starts}, indent=1))
    return 0 if summary["failed"] == 0 and len(starts) == args.starts else 1


if __name__ == "__main__":
    sys.exit(main())
