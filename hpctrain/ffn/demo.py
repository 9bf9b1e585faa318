"""The README's main job: train a small FFN with 2 ranks on this machine and show that it segments.

Steps: synthetic training and held-out volumes → training coordinates → data-parallel training through
the ``local`` site (the same submission path as any cluster) → flood-fill segmentation of the held-out
volume → VOI and adapted Rand error against the ground truth and against a connected-components
baseline → a PNG with the loss curve and slices.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.errors import HpctrainError

REPO = Path(__file__).resolve().parents[2]


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def make_volumes(job_data: dict[str, Any], out: Path) -> dict[str, str]:
    """Write the training and held-out synthetic volumes (deterministic by seed) as HDF5."""
    from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5

    paths = {}
    for role in ("train", "eval"):
        synth = dict(job_data[role]["synthetic"])
        shape = tuple(int(v) for v in synth.pop("shape"))
        image, labels = make_synthetic_volume(shape, int(synth.pop("seed", 0)), **synth)  # type: ignore[arg-type]
        paths[role] = str(write_hdf5(out / f"{role}.h5", image, labels))
    return paths


def train(job_path: Path, sets: list[str], run_root: Path, ranks: int) -> Path:
    """Submit the job to the local site (the same path as any cluster) and follow it to the end."""
    from hpctrain.submission import submit
    from hpctrain.tracking import is_terminal

    handle = submit(str(job_path), site="local", sets=sets, run_root=str(run_root))
    view = handle.status()
    _say(f"submitted run {handle.run_id} (local job {handle.job_id}); run directory {view.run_dir}")
    shown = None
    while not is_terminal(view.state):
        time.sleep(3.0)
        view = handle.status()
        text = view.progress.text() if view.progress else ""
        if text and text != shown:
            shown = text
            _say(text)
    if view.state != "COMPLETED":
        tail = handle.logs().splitlines()[-25:]
        raise HpctrainError(f"training run {handle.run_id} ended {view.state}: {view.reason}\n" + "\n".join(tail))
    return Path(view.run_dir)


def plot(out_png: Path, metrics_path: Path, image: np.ndarray, truth: np.ndarray, ffn: np.ndarray,
         baseline: np.ndarray, scores: dict[str, dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in records if "loss" in r]
    losses = [r["loss"] for r in records if "loss" in r]
    z = image.shape[0] // 2
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.5))
    axes[0].plot(steps, losses, marker="o", markersize=3)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("loss (mean over ranks)")
    axes[0].set_title("training loss")
    rng = np.random.default_rng(0)
    colours = rng.random((int(max(truth.max(), ffn.max(), baseline.max())) + 1, 3))
    colours[0] = 0
    panels = [(f"image (held-out, z={z})", image[z], "gray"), ("ground truth", colours[truth[z]], None),
              (f"FFN  VOI {scores['ffn']['voi']:.2f}", colours[ffn[z]], None),
              (f"baseline  VOI {scores['baseline']['voi']:.2f}", colours[baseline[z]], None)]
    for ax, (title, data, cmap) in zip(axes[1:], panels, strict=True):
        ax.imshow(data, cmap=cmap)
        ax.set_title(title)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)


def run_demo(out_dir: str | Path, *, job_path: str | Path | None = None, steps: int | None = None,
             ranks: int = 2) -> dict[str, Any]:
    """The whole main job; returns the scores. Writes everything under ``out_dir``."""
    from hpctrain.commands.ffn import resolve_checkpoint
    from hpctrain.config.job import load_job
    from hpctrain.ffn.baseline import baseline_segmentation
    from hpctrain.ffn.evaluate import evaluate_segmentation
    from hpctrain.ffn.inference import run_segment
    from hpctrain.ffn.task import model_config, prepare_training_data
    from hpctrain.ffn.volume import load_volume

    started = time.perf_counter()
    out = Path(out_dir).resolve()
    if out.exists():
        shutil.rmtree(out)
    (out / "data").mkdir(parents=True)
    job_path = Path(job_path or REPO / "jobs" / "ffn-local.yaml")
    job = load_job(job_path)
    _say(f"job {job_path.name}: FFN depth {job.model_args.get('depth')}, FOV {job.model_args.get('fov')}, "
         f"{ranks} ranks x batch {job.train.batch_per_rank}, {steps or job.train.steps} steps")

    volumes = make_volumes(dict(job.data), out / "data")
    _say(f"synthetic volumes: {volumes['train']} (training), {volumes['eval']} (held out)")

    cfg = model_config(job.model_args)
    train_data = {"train": {"image": f"{volumes['train']}:image", "labels": f"{volumes['train']}:labels"}}
    prepared = prepare_training_data(train_data, cfg["fov"], cfg["deltas"], out / "data" / "prepared")
    coords = np.load(prepared["coordinates"])["coords"]
    _say(f"training coordinates: {len(coords)} balanced over partitions -> {prepared['coordinates']}")

    sets = [f"data.train.image={volumes['train']}:image", f"data.train.labels={volumes['train']}:labels",
            f"data.coordinates={prepared['coordinates']}", f"resources.ranks_per_node={ranks}",
            f"model_args.image_mean={prepared['image_mean']}", f"model_args.image_stddev={prepared['image_stddev']}"]
    sets.append("data.train.synthetic=null")
    if steps:
        sets.append(f"train.steps={steps}")
    run_dir = train(job_path, sets, out / "runs", ranks)
    checkpoint = resolve_checkpoint(str(run_dir / job.checkpoint.dir))
    _say(f"trained; checkpoint {checkpoint}")

    segmentation = out / "heldout_segmentation.h5"
    summary = run_segment(checkpoint, f"{volumes['eval']}:image", f"{segmentation}:segmentation")
    _say(f"segmented the held-out volume: {summary['objects']} objects in {summary['seconds']:.1f} s")

    image = np.asarray(load_volume(f"{volumes['eval']}:image"))
    truth = np.asarray(load_volume(f"{volumes['eval']}:labels"))
    ffn_seg = np.asarray(load_volume(f"{segmentation}:segmentation"))
    base_seg = baseline_segmentation(image)
    results = {"ffn": evaluate_segmentation(ffn_seg, truth), "baseline": evaluate_segmentation(base_seg, truth)}
    scores = {name: {"voi": r["voi_split"] + r["voi_merge"], "voi_split": r["voi_split"],
                     "voi_merge": r["voi_merge"], "adapted_rand_error": r["adapted_rand_error"]}
              for name, r in results.items()}
    png = out / "demo.png"
    plot(png, run_dir / "metrics.jsonl", image, truth, ffn_seg, base_seg, scores)
    (out / "scores.json").write_text(json.dumps(scores, indent=2))

    print()
    print(f"{'held-out volume':<26}{'VOI total':>10}{'split':>8}{'merge':>8}{'adapted Rand':>14}")
    for name in ("ffn", "baseline"):
        s = scores[name]
        label = "FFN (trained)" if name == "ffn" else "baseline (conn. comp.)"
        print(f"{label:<26}{s['voi']:>10.3f}{s['voi_split']:>8.3f}{s['voi_merge']:>8.3f}"
              f"{s['adapted_rand_error']:>14.3f}")
    better = scores["ffn"]["voi"] < scores["baseline"]["voi"]
    print()
    print(f"FFN {'beats' if better else 'does NOT beat'} the baseline on variation of information.")
    print(f"files: run {run_dir}\n       metrics {run_dir / 'metrics.jsonl'}\n       segmentation {segmentation}"
          f"\n       figure {png}\n       scores {out / 'scores.json'}")
    print(f"total time {time.perf_counter() - started:.0f} s")
    sys.stdout.flush()
    return {"scores": scores, "run_dir": str(run_dir), "png": str(png), "beats_baseline": better}
