"""``hpctrain demo``: the README's main job — train a small FFN with 2 ranks on this machine and show that it
segments.

Steps: synthetic training and held-out volumes → training coordinates → data-parallel training through
the ``local`` site (the same submission path as any cluster) while the baselines are computed (a seeded
watershed whose parameters are chosen on the training volume, Otsu components) → flood-fill segmentation
of the held-out volume → VOI and adapted Rand error against the ground truth and against the baselines → a
PNG with the loss curve and slices. ``--more`` adds three more held-out seeds and one synthetic condition
never used while tuning; ``--curve`` scores every checkpoint of the run (score against training time), each
with the join model and thresholds chosen for it as for the final one. The thresholds and join model chosen
for the trained model are written beside its checkpoint as its model package (``inference.json``), so that
``hpctrain ffn segment RUN VOLUME`` segments any volume as the demo does.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.errors import DataError, HpctrainError

if TYPE_CHECKING:
    import numpy as np

# The example job specs ship inside the package (hpctrain/jobs/, the checkout's top-level jobs/ links to it).
DEMO_JOB = Path(__file__).resolve().parents[1] / "jobs" / "ffn-local.yaml"
# The quality the demo aims at on its held-out volume: met or not, each is printed.
TARGETS = {"adapted_rand_error": 0.30, "voi": 2.0, "voi_merge": 1.0, "voi_below_watershed": 0.20}
# The plain demo's time budget on a 2-core machine: volumes, training, thresholds, held-out scores.
TIME_BUDGET_S = 360.0
# --more: three more held-out volumes like the demo's, and one condition never used while tuning anything:
# smaller cells (twice the neurites per volume), more noise and 4-voxel membranes (docs/ffn.md, "Quality").
EXTRA_SEEDS = (3, 4, 5)
GENERALISATION = {"seed": 6, "neurites_per_voxel": 2 / 15000, "noise_sigma": 12.0, "membrane_width": 4}


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _synthetic(spec: dict[str, Any], shape: tuple[int, int, int] | None, out: Path, name: str) -> str:
    from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5

    spec = dict(spec)
    shape_here = shape or tuple(int(v) for v in spec.pop("shape"))
    spec.pop("shape", None)
    if "neurites_per_voxel" in spec:  # cell size as a density, so a quick run's small volume keeps it
        spec["neurites"] = max(4, round(spec.pop("neurites_per_voxel") * shape_here[0] * shape_here[1] * shape_here[2]))
    image, labels = make_synthetic_volume(shape_here, int(spec.pop("seed", 0)), **spec)  # type: ignore[arg-type]
    return str(write_hdf5(out / f"{name}.h5", image, labels))


def make_volumes(job_data: dict[str, Any], out: Path, shape: tuple[int, int, int] | None = None,
                 more: bool = False) -> dict[str, str]:
    """Write the training and held-out synthetic volumes (deterministic by seed) as HDF5, and the validation
    volume of ``data.eval.tune.volume`` where it is synthetic; ``shape`` replaces the volumes' shapes (a quick
    run); ``more`` adds the extra held-out seeds and the generalisation condition (the held-out volume's
    settings otherwise)."""
    paths = {role: _synthetic(job_data[role]["synthetic"], shape, out, role) for role in ("train", "eval")}
    tune = job_data["eval"].get("tune") or {}
    tune_volume = (tune.get("volume") or {}).get("synthetic")
    if tune_volume is not None:  # the labelled validation volume the inference thresholds are chosen on
        paths["validation"] = _synthetic(tune_volume, shape, out, "validation")
    fit_volume = ((tune.get("fit_joins") or {}).get("volume") or {}).get("synthetic")
    if fit_volume is not None:  # a labelled volume of its own for the join model (the training volume otherwise)
        paths["join_fit"] = _synthetic(fit_volume, shape, out, "join_fit")
    if more:
        held_out = {k: v for k, v in job_data["eval"]["synthetic"].items() if k != "seed"}
        for seed in EXTRA_SEEDS:
            paths[f"seed {seed}"] = _synthetic({**held_out, "seed": seed}, shape, out, f"eval-seed{seed}")
        paths["generalisation"] = _synthetic({**held_out, **GENERALISATION}, shape, out, "generalisation")
    return paths


def submit_training(job_path: Path, sets: list[str], run_root: Path) -> Any:
    """Submit the job to the local site (the same path as any cluster); returns its handle."""
    from hpctrain.submission.api import submit

    handle = submit(str(job_path), site="local", sets=sets, run_root=str(run_root))
    _say(f"submitted run {handle.run_id} (local job {handle.job_id}); run directory {handle.status().run_dir}")
    return handle


def follow(handle: Any, total_steps: int | None) -> Path:
    """Follow a submitted run to its end, printing its progress; returns its run directory. The progress comes
    from the run's metrics file; the scheduler is asked only around the run's end and with back-off
    (``submission.follow``): each poll of the local site is a Python process taken from the ranks' CPUs."""
    from hpctrain.submission.follow import follow_run
    from hpctrain.submission.schedulers.state import JobState

    view, _ = follow_run(handle, total_steps, _say)
    if view.state != JobState.COMPLETED.value:
        tail = handle.logs().splitlines()[-25:]
        raise HpctrainError(f"training run {handle.run_id} ended {view.state}: {view.reason}\n" + "\n".join(tail))
    return Path(view.run_dir)


def training_pace(run_dir: Path) -> dict[str, float] | None:
    """How fast this machine trained: the run's start-up and its mean step, compute and wait for the other ranks
    (milliseconds), from the profile its rank 0 wrote; None when the run left no readable profile. The demo's
    time is mostly training, and the same steps took 36-55 ms of compute on this VM on different days."""
    from hpctrain.planning.measurements import PROFILE_FILE, parse_profile

    path = run_dir / PROFILE_FILE
    try:
        m = parse_profile(path.read_text(), str(path))
    except (OSError, DataError):
        return None
    return {"startup_s": round(m.startup_s or 0.0, 1), "step_ms": round(m.step.mean * 1e3, 1),
            "compute_ms": round(m.compute.mean * 1e3, 1), "reduction_wait_ms": round(m.reduction_wait.mean * 1e3, 1)}


def pace_text(pace: dict[str, float] | None) -> str:
    """`` (start-up 4.7 s; a step 41 ms: 36 ms compute, 4 ms waiting for the other ranks)`` or nothing."""
    if not pace:
        return ""
    return (f" (start-up {pace['startup_s']:.1f} s; a step {pace['step_ms']:.0f} ms: {pace['compute_ms']:.0f} ms "
            f"compute, {pace['reduction_wait_ms']:.0f} ms waiting for the other ranks)")


def score(seg: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """VOI (total, split, merge) and adapted Rand error of ``seg`` against ``truth`` (0 = ignored)."""
    from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation

    r = evaluate_segmentation(seg, truth)
    return {"voi": r["voi_split"] + r["voi_merge"], "voi_split": r["voi_split"], "voi_merge": r["voi_merge"],
            "adapted_rand_error": r["adapted_rand_error"], "segments": int(seg.max(initial=0)),
            "unsegmented": float((seg[truth > 0] == 0).mean())}


def best_threshold_baseline(image: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """The Otsu baseline at the global threshold that scores best against the ground truth (an oracle
    reference: it looks at the answer, so it is reported beside the honest baselines, not instead of them)."""
    from hpctrain.ffn.evaluation.baseline import baseline_segmentation, interior_threshold

    otsu = interior_threshold(image)
    best: dict[str, float] = {}
    for thr in [otsu + d for d in (-30, -20, -10, 0, 10, 20, 30)]:
        s = score(baseline_segmentation(image, threshold=thr), truth)
        if not best or s["voi"] < best["voi"]:
            best = {**s, "threshold": float(thr)}
    return best


def baselines(volumes: dict[str, str], held_out: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The watershed's parameters chosen on the training volume, then every baseline on each held-out volume.
    Returns ({volume: {baseline: scores}}, the chosen watershed parameters and the grid's scores)."""
    from dataclasses import asdict

    import numpy as np

    from hpctrain.ffn.evaluation.baseline import baseline_segmentation
    from hpctrain.ffn.evaluation.watershed import tune_watershed, watershed_segmentation
    from hpctrain.ffn.volume import load_volume

    train_image = np.asarray(load_volume(f"{volumes['train']}:image"))
    train_truth = np.asarray(load_volume(f"{volumes['train']}:labels"))
    params, tried = tune_watershed(train_image, train_truth)
    out: dict[str, dict[str, Any]] = {}
    for name in held_out:
        image = np.asarray(load_volume(f"{volumes[name]}:image"))
        truth = np.asarray(load_volume(f"{volumes[name]}:labels"))
        out[name] = {"watershed": score(watershed_segmentation(image, params), truth),
                     "baseline": score(baseline_segmentation(image), truth)}
        if name == "eval":
            out[name]["baseline_best_threshold"] = best_threshold_baseline(image, truth)
            out[name]["one_segment"] = score(np.ones_like(truth), truth)
    return out, {"params": asdict(params), "grid": tried}


def segment_and_score(checkpoint: str, volume: str, out: Path, settings: dict[str, Any],
                      threads: int) -> tuple[dict[str, Any], dict[str, float]]:
    """Flood-fill ``volume`` (an HDF5 file with image and labels) with ``checkpoint``; (summary, scores)."""
    import numpy as np

    from hpctrain.ffn.inference.runner import run_segment
    from hpctrain.ffn.volume import load_volume

    summary = run_segment(checkpoint, f"{volume}:image", f"{out}:segmentation", config=settings or None,
                          threads=threads)
    seg = np.asarray(load_volume(f"{out}:segmentation"))
    return summary, score(seg, np.asarray(load_volume(f"{volume}:labels")))


def tuning_volume(tuning: Any, volumes: dict[str, str]) -> tuple[Any, Any, str]:
    """(image spec, labels spec, name) of the volume the thresholds are chosen on: ``data.eval.tune.volume``
    (files, or the demo's synthetic validation volume), else the training volume."""
    source = tuning.volume
    if source is not None and source.synthetic is None:
        return source.image, source.labels, "validation volume"
    name, where = ("validation", "validation volume") if source is not None else ("train", "training volume")
    return f"{volumes[name]}:image", f"{volumes[name]}:labels", where


def tune_thresholds(checkpoint: str, volumes: dict[str, str], settings: dict[str, Any], tuning: Any,
                    threads: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's ``data.eval.tune`` candidates tried with this run's model on (a central crop of) its validation
    volume, or the training volume where it names none (``ffn/inference/tuning.py``); returns (the held-out settings
    with the chosen values, a record of the choice)."""
    from hpctrain.ffn.inference.tuning import tune_checkpoint

    image, labels, where = tuning_volume(tuning, volumes)
    fit_on = None
    if tuning.fit_joins is not None:  # the join model is fitted on the training volume unless it names another
        source = tuning.fit_joins.volume
        if source is not None and source.synthetic is None:
            fit_on = (source.image, source.labels, tuning.fit_joins.crop)
        else:
            name = "join_fit" if source is not None else "train"
            fit_on = (f"{volumes[name]}:image", f"{volumes[name]}:labels", tuning.fit_joins.crop)
    record = tune_checkpoint(checkpoint, image, labels, settings, tuning.grid(), tuning.crop, threads=threads,
                             say=_say, fit_on=fit_on, fit_settings=tuning.fit_flood_settings(), fit_required=False)
    record["volume"] = where
    shown = {k: v for k, v in record["chosen"].items() if k != "join_model"}
    _say(f"chosen (lowest VOI on the {where}): {shown}, in {record['seconds']:.0f} s")
    return {**settings, **record["chosen"]}, record


def settings_text(settings: dict[str, Any], tuned: dict[str, Any]) -> str:
    """The thresholds the held-out segmentation used, and where they were chosen."""
    keys = ("move_threshold", "segment_threshold", "agglomerate_threshold")
    text = ", ".join(f"{k} {settings[k]}" for k in keys if k in settings)
    where = f" (chosen on the {tuned.get('volume', 'training volume')})" if tuned else ""
    joins = ", pairs joined by the fitted join model" if settings.get("join_model") else ""
    return f"{text or 'the default settings'}{where}{joins}"


def training_seconds(metrics_path: Path) -> dict[int, float]:
    """Seconds since the first logged step, per logged step (from the run's metrics.jsonl)."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    timed = [(int(r["step"]), float(r["time"])) for r in records if "loss" in r and "time" in r]
    t0 = timed[0][1] if timed else 0.0
    return {step: t - t0 for step, t in timed}


def score_curve(run_dir: Path, checkpoint_dir: Path, volumes: dict[str, str], out: Path, settings: dict[str, Any],
                threads: int, *, tuning: Any = None, final: tuple[str, dict[str, Any]] | None = None,
                ) -> list[dict[str, Any]]:
    """Held-out scores of every checkpoint the run kept, with the training time at its step.

    With the job's ``tuning``, each checkpoint gets its own join model and thresholds, chosen on the training
    volume as the demo chooses them for its final model: a point is what the demo would have reported had the
    run stopped there. ``final`` = (checkpoint, its tuned settings): the demo's own choice, not repeated."""
    from hpctrain.checkpoint.manifest import SHARED, read_entries

    entries, _ = read_entries(checkpoint_dir)
    seconds = training_seconds(run_dir / "metrics.jsonl")
    points: list[dict[str, Any]] = []
    for entry in entries:
        checkpoint = str(entry.path / SHARED)
        chosen, tuned = settings, {}
        if final is not None and Path(final[0]).resolve() == Path(checkpoint).resolve():
            chosen = final[1]
        elif tuning is not None:
            _say(f"step {entry.step}: its own join model and thresholds")
            chosen, tuned = tune_thresholds(checkpoint, volumes, settings, tuning, threads)
        _, s = segment_and_score(checkpoint, volumes["eval"], out / f"curve-{entry.step}.h5", chosen, threads)
        at = max((k for k in seconds if k <= entry.step), default=None)
        picked = {k: chosen[k] for k in ("move_threshold", "agglomerate_threshold") if k in chosen}
        points.append({"step": entry.step, "seconds": seconds.get(at, 0.0) if at is not None else 0.0, **s,
                       "settings": picked, "own_join_model": bool(chosen.get("join_model")),
                       "tuning_seconds": tuned.get("seconds", 0.0)})
        _say(f"step {entry.step}: VOI {s['voi']:.3f} (merge {s['voi_merge']:.3f}), "
             f"adapted Rand {s['adapted_rand_error']:.3f} with {picked}")
        (out / f"curve-{entry.step}.h5").unlink()
    return points


def plot(out_png: Path, metrics_path: Path, image: np.ndarray, truth: np.ndarray, ffn: np.ndarray,
         baseline: np.ndarray, scores: dict[str, dict[str, float]], movement_from: int = 0) -> None:
    """The loss curve (a dashed line where FOV movement starts after ``movement_from`` bare-seed steps) and the
    middle z slice of image, ground truth, FFN and watershed segmentations."""
    import matplotlib
    import numpy as np

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
    if movement_from:
        axes[0].axvline(movement_from, color="grey", linestyle="--", linewidth=1)
        axes[0].annotate("FOV movement from here", (movement_from, max(losses, default=1.0)), fontsize=8,
                         xytext=(4, -10), textcoords="offset points")
    rng = np.random.default_rng(0)
    colours = rng.random((int(max(truth.max(), ffn.max(), baseline.max())) + 1, 3))
    colours[0] = 0
    panels = [(f"image (held-out, z={z})", image[z], "gray"), ("ground truth", colours[truth[z]], None),
              (f"FFN  VOI {scores['ffn']['voi']:.2f}", colours[ffn[z]], None),
              (f"watershed  VOI {scores['watershed']['voi']:.2f}", colours[baseline[z]], None)]
    for ax, (title, data, cmap) in zip(axes[1:], panels, strict=True):
        ax.imshow(data, cmap=cmap)
        ax.set_title(title)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)


def plot_curve(out_png: Path, points: list[dict[str, Any]], watershed_voi: float) -> None:
    """Held-out VOI, merge VOI and adapted Rand error against training time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [p["seconds"] / 60 for p in points]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(minutes, [p["voi"] for p in points], marker="o", label="FFN VOI")
    ax[0].plot(minutes, [p["voi_merge"] for p in points], marker=".", label="FFN merge VOI")
    ax[0].axhline(watershed_voi, color="grey", linestyle="--", label="tuned watershed VOI")
    ax[0].set_xlabel("training time (minutes, 2 ranks)")
    ax[0].set_ylabel("bits (lower is better)")
    ax[0].legend()
    ax[1].plot(minutes, [p["adapted_rand_error"] for p in points], marker="o", color="C2")
    ax[1].set_xlabel("training time (minutes, 2 ranks)")
    ax[1].set_ylabel("adapted Rand error")
    for a, step_axis in zip(ax, (True, False), strict=True):
        a.grid(alpha=0.3)
        if step_axis:
            a.set_title("held-out volume, every kept checkpoint")
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)


def _verdict(ffn: dict[str, float], watershed: dict[str, float], seconds: float | None = None) -> list[str]:
    """One line per target, met or NOT met; ``seconds`` (the demo's time up to the scores) adds the time budget."""
    below = 1.0 - ffn["voi"] / watershed["voi"] if watershed["voi"] else 0.0
    checks = [(f"adapted Rand error {ffn['adapted_rand_error']:.3f} <= {TARGETS['adapted_rand_error']}",
               ffn["adapted_rand_error"] <= TARGETS["adapted_rand_error"]),
              (f"VOI {ffn['voi']:.3f} <= {TARGETS['voi']}", ffn["voi"] <= TARGETS["voi"]),
              (f"merge VOI {ffn['voi_merge']:.3f} <= {TARGETS['voi_merge']}", ffn["voi_merge"] <= TARGETS["voi_merge"]),
              (f"VOI {below:.0%} below the tuned watershed's (target >= {TARGETS['voi_below_watershed']:.0%})",
               below >= TARGETS["voi_below_watershed"])]
    if seconds is not None:
        checks.append((f"the demo took {seconds:.0f} s up to these scores (target <= {TIME_BUDGET_S:.0f} s on a "
                       "2-core machine)", seconds <= TIME_BUDGET_S))
    return [f"  {'met    ' if ok else 'NOT met'}  {text}" for text, ok in checks]


def _finished_run(run_dir: Path) -> Path:
    """``--from-run``: a run directory with the metrics and checkpoints a demo run leaves."""
    if not (run_dir / "metrics.jsonl").is_file():
        raise HpctrainError(f"{run_dir} is not a finished demo run (no metrics.jsonl there)",
                            hint="pass the run directory a demo printed after 'files: run'")
    return run_dir.resolve()


def _fresh_directory(out: Path) -> Path:
    """``out`` resolved, emptied, with its ``data`` directory."""
    out = out.resolve()
    if out.exists():
        shutil.rmtree(out)
    (out / "data").mkdir(parents=True)
    return out


def _say_volumes(volumes: dict[str, str], held_out: list[str], finished: Path | None) -> None:
    if finished:
        _say(f"scoring the checkpoint of {finished} (no training)")
    validation = f", {volumes['validation']} (validation)" if "validation" in volumes else ""
    _say(f"synthetic volumes: {volumes['train']} (training){validation}, "
         f"{', '.join(volumes[n] for n in held_out)} (held out)")


def _say_segmented(summary: dict[str, Any], settings: str) -> None:
    counted = summary["counters"]
    fovs = counted.get("flood_fovs", 0) + counted.get("agglomeration_fovs", 0)
    _say(f"segmented the held-out volume with {settings}: {summary['objects']} objects, "
         f"{summary['ffn_calls']} moves, {fovs} FOVs through the model (with the checks and the joins' claims), "
         f"in {summary['seconds']:.1f} s")


def _plot_heldout(png: Path, run_dir: Path, volume: str, segmentation: Path, watershed_params: Any,
                  scores: dict[str, dict[str, float]], movement_from: int) -> None:
    """The demo's figure of the held-out ``volume``: the FFN's segmentation beside the watershed's."""
    import numpy as np

    from hpctrain.ffn.evaluation.watershed import watershed_segmentation
    from hpctrain.ffn.volume import load_volume

    image = np.asarray(load_volume(f"{volume}:image"))
    truth = np.asarray(load_volume(f"{volume}:labels"))
    ffn_seg = np.asarray(load_volume(f"{segmentation}:segmentation"))
    plot(png, run_dir / "metrics.jsonl", image, truth, ffn_seg, watershed_segmentation(image, watershed_params),
         scores, movement_from=movement_from)


def _prepare_training(job: Any, volumes: dict[str, str], out: Path) -> dict[str, Any]:
    """The training volume's partitions and balanced coordinates, prepared once under ``out/data/prepared``."""
    import numpy as np

    from hpctrain.ffn.training.task import model_config, prepare_training_data

    cfg = model_config(job.model_args)
    train_data = {"train": {"image": f"{volumes['train']}:image", "labels": f"{volumes['train']}:labels"}}
    prepared = prepare_training_data(train_data, cfg["fov"], cfg["deltas"], out / "data" / "prepared")
    coords = np.load(prepared["coordinates"])["coords"]
    _say(f"training coordinates: {len(coords)} balanced over partitions -> {prepared['coordinates']}")
    return prepared


def _training_sets(job: Any, volumes: dict[str, str], prepared: dict[str, Any], *, ranks: int, steps: int | None,
                   curve: int) -> tuple[list[str], int]:
    """(the ``--set`` overrides the training job is submitted with, its bare-seed steps): the prepared data, the
    ranks, and for a quick run (``steps``) the job's warm-up and bare-seed share scaled to it."""
    sets = [f"data.train.image={volumes['train']}:image", f"data.train.labels={volumes['train']}:labels",
            f"data.coordinates={prepared['coordinates']}", f"resources.ranks_per_node={ranks}",
            f"model_args.image_mean={prepared['image_mean']}", f"model_args.image_stddev={prepared['image_stddev']}",
            "data.train.synthetic=null"]
    single = job.model_args.get("single_fov_steps")
    single_fov_steps = single if isinstance(single, int) else 0
    if steps:
        sets.append(f"train.steps={steps}")
        warmup = job.train.warmup.steps or 0
        if warmup >= steps:  # a quick run: keep room for the decay after the warm-up
            sets.append(f"train.warmup.steps={steps // 2}")
        if single_fov_steps and job.train.steps:  # keep the job's share of bare-seed steps
            single_fov_steps = single_fov_steps * steps // job.train.steps
            sets.append(f"model_args.single_fov_steps={single_fov_steps}")
    if curve:
        total_steps = steps or job.train.steps
        sets += [f"checkpoint.every_steps={max(1, total_steps // curve)}", f"checkpoint.keep={curve + 1}"]
    return sets, single_fov_steps


def _tune(checkpoint: str, volumes: dict[str, str], settings: dict[str, Any], tuning: Any, threads: int, *,
          package_for: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``tune_thresholds``; where the run was trained here (``package_for``, its run directory), its model package
    is written so that ``hpctrain ffn segment`` segments with the choice."""
    from hpctrain.workflows.ffn import write_model_package

    settings, tuned = tune_thresholds(checkpoint, volumes, settings, tuning, threads)
    if package_for is not None:
        tuned["package"] = str(write_model_package(checkpoint, settings, tuned["chosen"], tuned))
        _say(f"model package {tuned['package']}: hpctrain ffn segment {package_for} VOLUME segments with these "
             "settings")
    return settings, tuned


def _print_files_and_times(run_dir: Path, segmentation: Path, png: Path, out: Path, *, curve: bool,
                           seconds: dict[str, Any]) -> None:
    """The demo's last lines: where its files are, and how long its parts took."""
    print(f"files: run {run_dir}\n       metrics {run_dir / 'metrics.jsonl'}\n       segmentation {segmentation}"
          f"\n       figure {png}\n       scores {out / 'scores.json'}" + (f"\n       curve {out / 'curve.png'}"
                                                                          if curve else ""))
    tuning_seconds = f", choosing thresholds {seconds['tuning']:.0f} s" if seconds["tuning"] is not None else ""
    print(f"time: training {seconds['training']:.0f} s{tuning_seconds}, segmentation {seconds['segmentation']:.0f} s, "
          f"total {seconds['total']:.0f} s")
    sys.stdout.flush()


def run_demo(out_dir: str | Path, *, job_path: str | Path | None = None, steps: int | None = None,
             ranks: int = 2, volume_shape: tuple[int, int, int] | None = None, threads: int | None = None,
             more: bool = False, curve: int = 0, from_run: str | Path | None = None) -> dict[str, Any]:
    """The whole main job; returns the scores. Writes everything under ``out_dir``.

    ``volume_shape`` replaces the job's volume shapes (a quick run); ``threads`` are the segmentation's
    intra-op threads (default: every CPU this process may use: training is over by then). ``from_run``: a
    finished run directory whose checkpoint is scored instead of training a new one (the volumes are
    regenerated from their seeds, so they are the ones it was trained and scored on).
    """
    from hpctrain.config.job import load_job
    from hpctrain.ffn.perf import available_cpus
    from hpctrain.workflows.ffn import inference_settings, inference_tuning, resolve_checkpoint

    started = time.perf_counter()
    finished = _finished_run(Path(from_run)) if from_run else None
    out = _fresh_directory(Path(out_dir))
    job_path = Path(job_path or DEMO_JOB)
    job = load_job(job_path)
    total_steps = steps or job.train.steps
    _say(f"job {job_path.name}: FFN depth {job.model_args.get('depth')}, features {job.model_args.get('features')}, "
         f"FOV {job.model_args.get('fov')}, {ranks} ranks x batch {job.train.batch_per_rank}, {total_steps} steps")

    volumes = make_volumes(dict(job.data), out / "data", volume_shape, more)
    held_out = [name for name in volumes if name not in ("train", "validation")]
    _say_volumes(volumes, held_out, finished)

    prepared = _prepare_training(job, volumes, out)
    sets, single_fov_steps = _training_sets(job, volumes, prepared, ranks=ranks, steps=steps, curve=curve)
    t_train = time.perf_counter()
    handle = None if finished else submit_training(job_path, sets, out / "runs")
    # The baselines need no training: they run while the ranks train (this process only waits on them).
    base, watershed = baselines(volumes, held_out)
    _say(f"baselines done; watershed parameters chosen on the training volume: {watershed['params']}")
    run_dir = finished or follow(handle, total_steps)
    train_seconds = time.perf_counter() - t_train if handle else 0.0
    checkpoint = resolve_checkpoint(str(run_dir / job.checkpoint.dir))
    pace = training_pace(run_dir)
    _say(f"trained in {train_seconds:.0f} s{pace_text(pace)}; checkpoint {checkpoint}" if handle
         else f"checkpoint {checkpoint}")

    settings = base_settings = inference_settings(dict(job.data))
    seg_threads = threads or available_cpus()
    tuning = inference_tuning(dict(job.data))
    tuned: dict[str, Any] = {}
    if tuning is not None:
        settings, tuned = _tune(checkpoint, volumes, settings, tuning, seg_threads, package_for=None if finished
                                else run_dir)
    segmentation = out / "heldout_segmentation.h5"
    summary, ffn_scores = segment_and_score(checkpoint, volumes["eval"], segmentation, settings, seg_threads)
    _say_segmented(summary, settings_text(settings, tuned))
    to_scores = time.perf_counter() - started  # the demo's own work; --more, --curve and the figures come after
    scores = {"ffn": ffn_scores, **base["eval"]}
    others = {name: {"ffn": segment_and_score(checkpoint, volumes[name], out / f"{name.replace(' ', '-')}"
                                              "_segmentation.h5", settings, seg_threads)[1], **base[name]}
              for name in held_out[1:]}

    png = out / "demo.png"
    _plot_heldout(png, run_dir, volumes["eval"], segmentation, watershed["params"], scores, single_fov_steps)
    points: list[dict[str, Any]] = []
    if curve:
        points = score_curve(run_dir, run_dir / job.checkpoint.dir, volumes, out, base_settings, seg_threads,
                             tuning=tuning, final=(checkpoint, settings))
        plot_curve(out / "curve.png", points, scores["watershed"]["voi"])
    total = time.perf_counter() - started
    (out / "scores.json").write_text(json.dumps(
        {**scores, "more": others, "curve": points, "watershed_tuning": watershed, "inference_tuning": tuned,
         "from_run": str(finished) if finished else None,
         "seconds": {"training": round(train_seconds, 1), "tuning": tuned.get("seconds", 0.0),
                     "segmentation": round(summary["seconds"], 1), "to_heldout_scores": round(to_scores, 1),
                     "total": round(total, 1)}, "training_pace": pace}, indent=2))
    report(scores, others, None if finished else to_scores)
    _print_files_and_times(run_dir, segmentation, png, out, curve=bool(curve), seconds={
        "training": train_seconds, "tuning": tuned.get("seconds") if tuned else None,
        "segmentation": summary["seconds"], "total": total})
    better = scores["ffn"]["voi"] < scores["watershed"]["voi"]
    return {"scores": scores, "more": others, "run_dir": str(run_dir), "png": str(png), "beats_baseline": better}


def report(scores: dict[str, dict[str, float]], others: dict[str, dict[str, Any]],
           seconds: float | None = None) -> None:
    """The held-out table, the targets, and (``--more``) the other volumes with the FFN's mean and spread.
    ``seconds``: the demo's time up to the held-out scores, checked against ``TIME_BUDGET_S`` (none for a
    ``--from-run`` rescoring, which trains nothing)."""
    import numpy as np

    rows = [("ffn", "FFN (trained)"), ("watershed", "watershed (tuned on train)"),
            ("baseline", "baseline (conn. comp.)"), ("baseline_best_threshold", "  baseline, best thr.*"),
            ("one_segment", "  one segment for all")]
    print()
    print(f"{'held-out volume':<28}{'VOI total':>10}{'split':>8}{'merge':>8}{'adapted Rand':>14}{'segments':>10}")
    for name, label in rows:
        s = scores[name]
        print(f"{label:<28}{s['voi']:>10.3f}{s['voi_split']:>8.3f}{s['voi_merge']:>8.3f}"
              f"{s['adapted_rand_error']:>14.3f}{s['segments']:>10d}")
    print(f"* Otsu's baseline at the global threshold that scores best against the ground truth "
          f"({scores['baseline_best_threshold']['threshold']:.0f}): it looks at the answer, a reference only")
    print()
    print("targets on the held-out volume:")
    print("\n".join(_verdict(scores["ffn"], scores["watershed"], seconds)))
    better = scores["ffn"]["voi"] < scores["watershed"]["voi"]
    print(f"FFN {'beats' if better else 'does NOT beat'} the tuned watershed baseline on variation of information "
          f"({scores['ffn']['voi']:.3f} vs {scores['watershed']['voi']:.3f}).")
    if others:
        print()
        print(f"{'same checkpoint on':<20}{'FFN VOI':>9}{'split':>7}{'merge':>7}{'ARE':>7}{'watershed':>11}"
              f"{'ARE':>7}{'Otsu VOI':>10}")
        for name, s in others.items():
            f, w, b = s["ffn"], s["watershed"], s["baseline"]
            print(f"{name:<20}{f['voi']:>9.3f}{f['voi_split']:>7.2f}{f['voi_merge']:>7.2f}"
                  f"{f['adapted_rand_error']:>7.3f}{w['voi']:>11.3f}{w['adapted_rand_error']:>7.3f}{b['voi']:>10.3f}")
        seeds = [s["ffn"] for n, s in others.items() if n.startswith("seed")]
        if seeds:
            voi = np.array([s["voi"] for s in seeds])
            are = np.array([s["adapted_rand_error"] for s in seeds])
            sd = (lambda a: float(a.std(ddof=1)) if len(a) > 1 else 0.0)  # noqa: E731
            print(f"FFN on the {len(seeds)} extra seeds: VOI {voi.mean():.3f} ± {sd(voi):.3f}, "
                  f"adapted Rand {are.mean():.3f} ± {sd(are):.3f} (mean ± s.d.)")
    print()
