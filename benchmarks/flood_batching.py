"""Flood fill with several objects in flight and speculative self-prediction, against one FOV at a time.

    python benchmarks/flood_batching.py --checkpoint RUN/checkpoints/step-N/shared.pt [--device cuda]

The demo job's flood settings (jobs/ffn-local.yaml, ``data.eval.inference``: bounded floods, self-prediction,
reseed passes; floods only: no joins, no fill) on synthetic volumes, with ``concurrent_floods`` objects in flight
and ``speculative_self_prediction`` on or off. Each configuration is timed in interleaved rounds; the speed-up is
the median over rounds of the baseline's time (1 object, no speculation) over the configuration's, measured in the
same round. ``differ`` is the share of voxels whose flood result differs from the baseline's: 0 where a batch
computes each FOV's floats as a single FOV does (the CPU here; on a GPU cuDNN may choose other algorithms per
batch size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ((1, False), (1, True), (2, False), (2, True), (4, True), (8, True))
VOLUMES = {"s2": ((48, 96, 96), 2), "t1": ((64, 128, 128), 1)}  # the held-out and the training volume's shapes


def main() -> int:
    import numpy as np
    import torch
    import yaml

    from benchmarks.ffn import CountingModule
    from hpctrain.ffn.inference.runner import prepare_inference, segment_volume
    from hpctrain.ffn.synthetic import make_synthetic_volume

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all of this process's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--volumes", default="s2,t1", help=f"of {', '.join(VOLUMES)}")
    ap.add_argument("--configs", default=",".join(f"{w}{'s' if s else 'n'}" for w, s in CONFIGS),
                    help="objects in flight, then s (speculative self-prediction) or n; the first is the baseline")
    args = ap.parse_args()
    configs = tuple((int(c[:-1]), c[-1] == "s") for c in args.configs.split(","))
    job = yaml.safe_load((ROOT / "jobs/ffn-local.yaml").read_text())
    settings = {**job["data"]["eval"]["inference"], "agglomerate_threshold": 0, "watershed_fill": False,
                "device": args.device}
    model, cfg, _ = prepare_inference(args.checkpoint, settings, threads=args.threads)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    print(f"device {args.device}, threads {torch.get_num_threads()}, torch {torch.__version__}; settings: "
          f"max_seed_distance {cfg.flood.max_seed_distance}, self_prediction {cfg.flood.self_prediction}, "
          f"reseed_passes {cfg.seeds.reseed_passes}", flush=True)
    rows = []
    for name in args.volumes.split(","):
        shape, seed = VOLUMES[name]
        image, _ = make_synthetic_volume(shape, seed)
        times: dict[tuple[int, bool], list[float]] = {c: [] for c in configs}
        counts: dict[tuple[int, bool], tuple[int, int]] = {}
        differ: dict[tuple[int, bool], float] = {}
        baseline = None
        segment_volume(model, image, cfg)  # warm-up: cuDNN/oneDNN plans, allocator
        for _ in range(args.rounds):
            for width, speculative in configs:
                counted = CountingModule(model)
                run = cfg.replace(concurrent_floods=width, speculative_self_prediction=speculative)
                sync()
                t = time.perf_counter()
                _, canvas = segment_volume(counted, image, run, return_canvas=True)
                sync()
                times[(width, speculative)].append(time.perf_counter() - t)
                counts[(width, speculative)] = (counted.calls, counted.fovs)
                if baseline is None:
                    baseline = canvas.segmentation.copy()
                differ[(width, speculative)] = float(np.mean(canvas.segmentation != baseline))
        base = times[configs[0]]
        for config in configs:
            calls, fovs = counts[config]
            median = statistics.median(times[config])
            speedup = statistics.median(b / t for b, t in zip(base, times[config], strict=True))
            rows.append((name, *config, median, fovs, calls, fovs / calls, fovs / median, speedup, differ[config]))
    print(f"\n{'volume':6s} {'width':>5s} {'spec':>5s} {'median s':>9s} {'FOVs':>7s} {'calls':>7s} {'batch':>6s} "
          f"{'FOVs/s':>8s} {'speed-up':>8s} {'differ':>7s}")
    for name, width, spec, median, fovs, calls, batch, rate, speedup, diff in rows:
        print(f"{name:6s} {width:5d} {spec!s:>5s} {median:9.2f} {fovs:7d} {calls:7d} {batch:6.2f} {rate:8.1f} "
              f"{speedup:8.2f} {diff:7.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
