"""How fast the CLI's submission path starts: ``hpctrain render`` cold versus ``python -c pass``.

Prints the median wall time of each over several runs, their ratio, and the heaviest modules imported by
``render`` (from ``python -X importtime``), flagging torch, numpy and mpi4py, which must not appear.
Usage: ``python benchmarks/cli_startup.py [--runs 10]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "mpi4py", "scipy", "h5py")
RENDER = ["-m", "hpctrain", "render", str(REPO / "jobs/ffn-theta.yaml"), "--site", "theta", "--run-dir", "/tmp/x"]


def timed(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, *argv], check=True, stdout=subprocess.DEVNULL, cwd=REPO)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def import_profile() -> list[tuple[str, float]]:
    """(top-level module, cumulative import ms) for the render command, heaviest first."""
    out = subprocess.run([sys.executable, "-X", "importtime", *RENDER], capture_output=True, text=True, cwd=REPO,
                         check=True)
    totals: dict[str, float] = {}
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line[len("import time:"):].split("|")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        name = parts[2]
        if name.startswith(" ") or "." in name.strip():
            continue
        totals[name.strip()] = max(totals.get(name.strip(), 0.0), int(parts[1]) / 1000)
    return sorted(totals.items(), key=lambda kv: -kv[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    baseline = timed(["-c", "pass"], args.runs)
    render = timed(RENDER, args.runs)
    profile = import_profile()
    heavy = [name for name, _ in profile if name in HEAVY]
    print(f"{'command':<40} {'median s':>9} {'ratio':>7}")
    print(f"{'python -c pass (baseline)':<40} {baseline:>9.3f} {1.0:>7.2f}")
    print(f"{'hpctrain render ffn-theta --site theta':<40} {render:>9.3f} {render / baseline:>7.2f}")
    print("\nheaviest top-level imports of render (cumulative ms):")
    for name, ms in profile[:10]:
        print(f"  {name:<30} {ms:8.1f}")
    print("\nheavy modules imported: " + (", ".join(heavy) if heavy else "none (torch, numpy, mpi4py absent)"))
    return 1 if heavy else 0


if __name__ == "__main__":
    sys.exit(main())
