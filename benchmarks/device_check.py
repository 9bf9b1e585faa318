"""GPU checks for a node whose torch sees a CUDA GPU: what CI (no GPU) cannot run, in one short script.

    PYTHONPATH=. python3 benchmarks/device_check.py [--out DIR] [--steps N]

Each check is a subprocess with its own time limit; a failed check is reported and the next one runs. Checks:

1. ``pytest tests/test_device_paths.py``: the combiners' device paths on buckets that live on the GPU (an
   in-process group of ranks under a guard against host copies) and a real one-rank NCCL communicator;
2. ``hpctrain run`` of a small FFN job over NCCL on one GPU (site polaris, ``gpus_per_rank: 1``), at the demo's
   batch (4 FOVs) and at 32, against the same job on one CPU core of this node (``--backend none``): FOVs/s;
   then the 4-FOV run resumed from its checkpoint on the GPU and trained on;
3. ``benchmarks/runtime.py --device cuda``: the hpctrain reducer's step against torch DDP's on the same GPU;
4. ``hpctrain ffn segment`` of a synthetic volume with the GPU-trained checkpoint on the GPU and on the CPU.

The last lines are a table of the figures, also written to ``OUT/device_check.json``. With one GPU NCCL runs one
rank (it refuses two ranks on one device), so nothing here measures the network between GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

FFN_JOB = """name: ffn-device-check
model: ffn
model_args: {{depth: 4, features: 16, fov: [15, 15, 15], deltas: [3, 3, 3], single_fov_steps: {bare},
             boundary_weight: 4}}
data:
  train: {{synthetic: {{shape: [64, 128, 128], seed: 1}}}}
  eval:
    synthetic: {{shape: [48, 96, 96], seed: 2}}
    inference: {{segment_threshold: 0.7, move_threshold: 0.7, min_segment_size: 200, device: {device}}}
train: {{steps: {steps}, batch_per_rank: {batch}, optimizer: {{name: adam}}, lr: 0.002, log_every: {log_every}}}
resources: {{nodes: 1, ranks_per_node: 1, threads_per_rank: 1, gpus_per_rank: {gpus}}}
checkpoint: {{every_steps: {steps}}}
"""


def run(name: str, cmd: list[str], out: Path, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One check: its exit status, seconds and the tail of its output (all of it in OUT/NAME.log)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, **(env or {})})
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout:.0f} s"
    seconds = time.perf_counter() - t0
    (out / f"{name}.log").write_text(text if isinstance(text, str) else text.decode())
    tail = "\n".join(str(text).strip().splitlines()[-6:])
    print(f"== {name}: rc {rc} in {seconds:.1f} s\n{tail}", flush=True)
    return {"rc": rc, "seconds": round(seconds, 1)}


def train_rate(run_dir: Path) -> float | None:
    """The median per-rank FOVs/s of the logged intervals after the first (warm-up) one."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rates = [json.loads(line).get("per_rank_rate") for line in path.read_text().splitlines() if line.strip()]
    rates = sorted(r for r in rates[1:] if r)
    return rates[len(rates) // 2] if rates else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None,
                    help="where the logs and device_check.json go (default: $OUT, else a new temporary directory)")
    ap.add_argument("--steps", type=int, default=400, help="training steps of the GPU runs")
    args = ap.parse_args()
    out: Path = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="hpctrain-device-check-"))
    print(f"results go to {out}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    gpu_env = {"HPCTRAIN_SITE": "polaris", "HPCTRAIN_GPU_KIND": "nvidia", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    facts = subprocess.run([py, "-c", (
        "import torch, json; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if c else None, "
        "'gpus': torch.cuda.device_count(), 'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None}))")],
        capture_output=True, text=True, timeout=120).stdout.strip()
    print(f"== facts: {facts}", flush=True)
    report: dict[str, Any] = {"facts": json.loads(facts or "{}"), "checks": {}, "figures": {}}
    checks, figures = report["checks"], report["figures"]

    checks["device_paths_tests"] = run("device_paths_tests", [
        py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_device_paths.py"], out, 180, gpu_env)

    hp = [py, "-m", "hpctrain"]
    runs = {  # name: (backend, batch, gpus, steps)
        "ffn_gpu_b4": ("nccl", 4, 1, args.steps),
        "ffn_gpu_b32": ("nccl", 32, 1, args.steps // 2),
        "ffn_cpu_b4": ("none", 4, 0, 100),
    }
    for name, (backend, batch, gpus, steps) in runs.items():
        job = out / f"{name}.yaml"
        job.write_text(FFN_JOB.format(bare=steps // 2, steps=steps, batch=batch, gpus=gpus,
                                      log_every=max(steps // 8, 1), device="cuda" if gpus else "cpu"))
        checks[name] = run(name, [*hp, "run", str(job), "--run-dir", str(out / name), "--backend", backend],
                           out, 240, gpu_env)
        figures[f"{name}_fovs_per_s"] = train_rate(out / name)

    # Resume on the GPU: the 4-FOV run continues from its last checkpoint to half as many steps again.
    resumed = out / "ffn_gpu_b4_resume.yaml"
    resumed.write_text(FFN_JOB.format(bare=args.steps // 2, steps=args.steps * 3 // 2, batch=4, gpus=1,
                                      log_every=max(args.steps // 8, 1), device="cuda"))
    checks["ffn_gpu_resume"] = run("ffn_gpu_resume", [*hp, "run", str(resumed), "--run-dir", str(out / "ffn_gpu_b4"),
                                                      "--backend", "nccl"], out, 240, gpu_env)

    checks["reducer_vs_ddp"] = run("reducer_vs_ddp", [py, "benchmarks/runtime.py", "--device", "cuda", "--reps", "8"],
                                   out, 180, gpu_env)

    ckpt = out / "ffn_gpu_b4" / "checkpoints"
    volume = out / "eval.h5"
    make_volume = ("from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5; import sys; "
                   "write_hdf5(sys.argv[1], *make_synthetic_volume((48, 96, 96), 2))")
    run("volume", [py, "-c", make_volume, str(volume)], out, 60, gpu_env)
    for device in ("cuda", "cpu"):
        name = f"segment_{device}"
        job = out / f"segment_{device}.yaml"
        job.write_text(FFN_JOB.format(bare=1, steps=1, batch=4, gpus=1, log_every=1, device=device))
        t0 = time.perf_counter()
        checks[name] = run(name, [*hp, "ffn", "segment", str(ckpt), f"{volume}:image", "-o", str(out / f"{name}.h5"),
                                  "--job", str(job), "--agglomerate-threshold", "0", "--threads", "1"],
                           out, 180, gpu_env)
        figures[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)

    (out / "device_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\ncheck                  rc   seconds")
    for name, row in checks.items():
        print(f"{name:<22} {row['rc']:>3} {row['seconds']:>8}")
    print("\nfigure                          value")
    for name, value in figures.items():
        print(f"{name:<30} {value if value is None else round(value, 1)}")
    gpu, cpu = figures.get("ffn_gpu_b4_fovs_per_s"), figures.get("ffn_cpu_b4_fovs_per_s")
    if gpu and cpu:
        print(f"GPU / one CPU core, FFN training at batch 4: {gpu / cpu:.2f}x")
    sys.exit(0 if all(row["rc"] == 0 for row in checks.values()) else 1)


if __name__ == "__main__":
    main()
