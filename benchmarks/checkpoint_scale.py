"""What a checkpoint costs the shared file system and rank 0, counted against the number of nodes and ranks.

Stand-in nodes on this machine (tests/mp_helpers/nodes.py: torchrun's variables, gloo, a node-local directory per
node), every rank under strace: two saves (tests/mp_helpers/scale_worker.py ``checkpoint-saves``), then a restart
that finds and loads the newest checkpoint (``checkpoint-resume``). Counted, not modelled: mkdir and fsync of the
step directory per save (strace), the record bytes the commit delivered to rank 0 (the store's own count of what
its collectives returned, runtime/counting/work_counts.py), the size of ``manifest.json`` and ``complete.json``, and the
bytes each rank read at resume from the manifest, the marker and ``shared.pt`` (shared state) and from its node
file (strace ``read``/``pread64`` on descriptors naming those files). The last line extrapolates each count to
2048 nodes x 8 ranks from the measured rows, as the count grows: flat, per node, or per rank.

Run: .venv/bin/python benchmarks/checkpoint_scale.py [--nodes 1 2 4 8] [--per-node 2] [--json FILE]
docs/scaling.md, "Checkpoints at scale", shows a run.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.mp_helpers.nodes import run_on_nodes  # noqa: E402

WORKER = str(REPO / "tests" / "mp_helpers" / "scale_worker.py")
STEP = 2  # the newest of the two saves: the one a restart resumes from
_READ = re.compile(r"^(?:read|pread64|readv|preadv)\(\d+<([^>]*)>.*\)\s+=\s+(\d+)$")
TARGET_NODES, TARGET_PER_NODE = 2048, 8


def traced(trace_dir: Path, calls: str) -> list[str]:
    """An argv prefix that runs a rank under strace, its traces in ``trace_dir/t-RANK.PID``."""
    return ["sh", "-c", f'exec strace -f -ff -qq -y -s 0 -e trace={calls} -o "{trace_dir}/t-$RANK" "$@"', "sh"]


def bytes_read(trace_dir: Path, rank: int) -> dict[str, int]:
    """Bytes rank ``rank``'s processes read, by file (the path strace -y names for the descriptor)."""
    out: dict[str, int] = {}
    for trace in trace_dir.glob(f"t-{rank}.*"):
        for line in trace.read_text().splitlines():
            if m := _READ.match(line):
                out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    return out


def step_dir_ops(trace_dir: Path, sdir: Path) -> dict[str, int]:
    """mkdir and fsync calls on ``sdir`` itself, summed over every traced process (strace -y names the fd)."""
    target = str(sdir)
    ops = {"mkdir": 0, "fsync": 0}
    for trace in trace_dir.iterdir():
        for line in trace.read_text().splitlines():
            call = line.split("(", 1)[0].strip()
            if call in ("mkdir", "mkdirat") and f'"{target}"' in line:
                ops["mkdir"] += 1
            elif call in ("fsync", "fdatasync") and f"<{target}>" in line:
                ops["fsync"] += 1
    return ops


def _launch(argv: list[str], n_nodes: int, per_node: int, nodes: list[Path], **env: str) -> None:
    results = run_on_nodes(argv, n_nodes, per_node, nodes, timeout=600, **env)
    if any(r.returncode for r in results):
        raise RuntimeError("\n".join(r.stdout[-3000:] for r in results))


def measure(n_nodes: int, per_node: int, work: Path) -> dict[str, Any]:
    """Save twice and resume on ``n_nodes`` stand-in nodes of ``per_node`` ranks under ``work``; the counts."""
    size = n_nodes * per_node
    nodes = [work / f"node{i}" for i in range(n_nodes)]
    saves, resumes = work / "save-traces", work / "resume-traces"
    for d in (*nodes, saves, resumes):
        d.mkdir(parents=True)
    root = (work / "run" / "ckpt").resolve()
    _launch([*traced(saves, "mkdir,mkdirat,fsync,fdatasync"), sys.executable, WORKER, "checkpoint-saves",
             str(root)], n_nodes, per_node, nodes, HPCTRAIN_COUNTERS="1")
    ops = [step_dir_ops(saves, root / f"step-{s:08d}") for s in (1, STEP)]
    record = json.loads((work / "run" / "counters" / "rank-00000.json").read_text())
    saved = record["work"]["checkpoints"]
    _launch([*traced(resumes, "read,pread64,readv,preadv"), sys.executable, WORKER, "checkpoint-resume",
             str(root)], n_nodes, per_node, nodes)
    sdir = root / f"step-{STEP:08d}"
    shared_files = {str(root / "manifest.json"), str(sdir / "shared.pt"), str(sdir / "complete.json")}
    node_files = {str(p) for p in sdir.glob("node-*.pt")}
    resume = []
    for r in range(size):
        reads = bytes_read(resumes, r)
        resume.append({"shared": sum(n for p, n in reads.items() if p in shared_files),
                       "node_files": {Path(p).name: n for p, n in reads.items() if p in node_files},
                       "resumed": json.loads((root / f"resumed-{r}.json").read_text())})
    return {
        "ranks": size, "nodes": n_nodes, "per_node": per_node,
        "step_dir_ops": ops,
        "rank0_record_bytes": [saved[s].get("record_bytes") for s in ("1", str(STEP))],
        "manifest": (root / "manifest.json").read_text(),
        "marker": (sdir / "complete.json").read_text(),
        "shared_pt_bytes": (sdir / "shared.pt").stat().st_size,
        "node_file_bytes": {Path(p).name: Path(p).stat().st_size for p in node_files},
        "resume": resume,
    }


def summary(m: dict[str, Any]) -> dict[str, float]:
    """One row of the table: the counts of one measurement."""
    ops = m["step_dir_ops"][-1]
    shared = [r["shared"] for r in m["resume"]]
    return {
        "ranks": m["ranks"], "nodes": m["nodes"],
        "per-save mkdir + fsync, step directory": ops["mkdir"] + ops["fsync"],
        "per-save record bytes received, rank 0": m["rank0_record_bytes"][-1] or 0,
        "manifest bytes": len(m["manifest"].encode()),
        "complete.json bytes": len(m["marker"].encode()),
        "resume: shared-state bytes read, node reader": max(shared),
        "resume: shared-state bytes read, other ranks (max)": max(
            (s for i, s in enumerate(shared) if i % m["per_node"]), default=0),
        "resume: shared-state bytes read, all ranks": sum(shared),
        "resume: node-file bytes read, max rank": max(sum(r["node_files"].values()) for r in m["resume"]),
    }


# How each count grows, for the extrapolation: with nodes, with ranks, or not at all.
GROWTH = {"per-save mkdir + fsync, step directory": "nodes", "resume: shared-state bytes read, all ranks": "nodes"}


def extrapolate(rows: list[dict[str, float]], nodes: int, per_node: int) -> dict[str, float]:
    """Each count at ``nodes`` x ``per_node`` from the two largest measured rows: a straight line in the
    quantity it grows with (nodes for those in GROWTH, else flat: the largest row's value)."""
    a, b = rows[-2], rows[-1]
    out: dict[str, float] = {"ranks": nodes * per_node, "nodes": nodes}
    for key in rows[0]:
        if key in ("ranks", "nodes"):
            continue
        if GROWTH.get(key) == "nodes" and b["nodes"] != a["nodes"]:
            slope = (b[key] - a[key]) / (b["nodes"] - a["nodes"])
            out[key] = b[key] + slope * (nodes - b["nodes"])
        else:
            out[key] = b[key]
    return out


def markdown(rows: list[dict[str, float]]) -> str:
    keys = [k for k in rows[0] if k not in ("ranks", "nodes")]
    head = "| count | " + " | ".join(f"{int(r['ranks'])} ranks / {int(r['nodes'])} nodes" for r in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    lines += ["| " + k + " | " + " | ".join(f"{r[k]:,.0f}" for r in rows) + " |" for k in keys]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("strace counts the ranks' system calls: run bash scripts/install.sh")
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpctrain-ckpt-scale-") as tmp:
        for n in args.nodes:
            rows.append(summary(measure(n, args.per_node, Path(tmp) / f"n{n}")))
            print(f"measured {n} nodes x {args.per_node} ranks", file=sys.stderr)
    rows.append(extrapolate(rows, TARGET_NODES, TARGET_PER_NODE))
    print(markdown(rows))
    print(f"\nlast column: extrapolated from the two largest measured rows to {TARGET_NODES} nodes x "
          f"{TARGET_PER_NODE} ranks (per node: {', '.join(GROWTH)}; the rest flat)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
