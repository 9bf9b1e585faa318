"""What the node check adds to a job's start, on the cluster of namespace nodes (scripts/ci/cluster.sh): the same
job with and without ``resources.node_check`` (the baseline), from the moment Slurm starts the job to the moment
its last rank runs, at 2 to 5 nodes; and what the check costs the first node as N grows (its connections and
messages, counted where they happen: hpctrain.submission.launchers.node_check).

Run (with the cluster started): .venv/bin/python benchmarks/node_check.py [--reps 3] [--nodes 2,3,4,5]
The ranks run ``python -c`` printing the time they start (no training): what is measured is the start alone.
Prints per node count the median start time with and without the check, the time added and its ratio, the
check's own duration (node-check.json), the nodes' median time to import torch (all nodes of this cluster share
this machine's cores: the imports queue for them) and the first node's connections and messages per node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "site_configs" / "ci-cluster.yaml"
SPEC = """name: {name}
model: resnet
train: {{steps: 1, batch_per_rank: 1, lr: 0.1}}
resources: {{nodes: {nodes}, ranks_per_node: 1, walltime: "00:10:00", node_check: {check}}}
"""
RANK = "import os, time; print('hpctrain-bench: rank', os.environ.get('SLURM_PROCID'), 'starts', time.time())"


def scontrol(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def one_start(site: Path, root: Path, nodes: int, check: bool, rep: int) -> tuple[float, dict[str, object] | None]:
    """(seconds from the job's start to its last rank's start, the node check's results) of one job."""
    from hpctrain.submission.api import submit_runs
    from hpctrain.submission.registry import RunRegistry

    name = f"nc{nodes}-{'on' if check else 'off'}-{rep}"
    spec = root / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, nodes=nodes, check=str(check).lower()))
    with RunRegistry() as reg:
        done = submit_runs(spec, str(site), registry=reg, run_root=str(root / "runs"),
                           command=[sys.executable, "-c", RANK])
    job, run_dir = done.job_ids[0], Path(done.runs[0].run_dir)
    assert job is not None
    deadline = time.monotonic() + 600
    while scontrol(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], timeout=15)
            raise RuntimeError(f"job {job} did not end in 600 s")
        time.sleep(0.5)
    log = (run_dir / f"slurm-{job}.out").read_text()
    starts = [float(t) for t in re.findall(r"hpctrain-bench: rank \d+ starts (\S+)", log)]
    if len(starts) != nodes:
        raise RuntimeError(f"job {job}: {len(starts)} ranks started, not {nodes}:\n{log[-2000:]}")
    job_start = float(re.search(r"hpctrain-bench: job start (\S+)", log).group(1))  # type: ignore[union-attr]
    results = json.loads((run_dir / "node-check.json").read_text()) if check else None
    return max(starts) - job_start, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nodes", default="2,3,4,5")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(dir="/var/tmp/hpctrain-cluster/shared") as tmp:
        root = Path(tmp)
        os.environ["HPCTRAIN_HOME"] = str(root / "home")
        os.environ.pop("HPCTRAIN_REGISTRY", None)
        # The job's own start, in the script's first environment line (the site's setup runs before the check).
        site = root / "ci-cluster-bench.yaml"
        site.write_text(SITE.read_text() + "environment:\n  setup:\n    - 'echo \"hpctrain-bench: job start "
                        "$(date +%s.%N)\"'\n")
        for nodes in sizes:
            timed: dict[bool, list[float]] = {True: [], False: []}
            check_s, counts, imports = [], [], []
            for rep in range(args.reps):
                for check in (False, True):
                    seconds, results = one_start(site, root, nodes, check, rep)
                    timed[check].append(seconds)
                    if results is not None:
                        check_s.append(float(results["elapsed_s"]))  # type: ignore[arg-type]
                        counts.append(results["first_node"])
                        reports = results["reports"].values()  # type: ignore[union-attr]
                        imports.append(statistics.median(float(r["import_s"]) for r in reports))
            on, off = statistics.median(timed[True]), statistics.median(timed[False])
            first = counts[-1]
            rows.append((nodes, off, on, on - off, on / off, statistics.median(check_s), statistics.median(imports),
                         first["connections"] / nodes, (first["messages_received"] + first["messages_sent"]) / nodes))
    print(f"node check on the cluster of namespace nodes: medians of {args.reps}, seconds from the job's start to its "
          "last rank's start")
    print(f"{'nodes':>5} {'no check':>9} {'check':>7} {'added':>7} {'ratio':>6} {'check s':>8} {'import s':>8} "
          f"{'conn/node':>9} {'msgs/node':>9}")
    for nodes, off, on, added, ratio, check, imported, conn, msgs in rows:
        print(f"{nodes:>5} {off:>9.2f} {on:>7.2f} {added:>7.2f} {ratio:>6.2f} {check:>8.2f} {imported:>8.2f} "
              f"{conn:>9.1f} {msgs:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
