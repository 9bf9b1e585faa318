"""``hpctrain ffn prepare|segment|segment-parts|finish-parts|tune|evaluate``: the Flood-Filling Network's data,
inference (whole, or in overlapping subvolumes on several ranks), the inference thresholds chosen for a trained
model on its training volume, and evaluation against ground truth and the baselines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hpctrain.config.precision import PRECISION_REQUESTS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ffn", help="Flood-Filling Network: prepare data, segment, evaluate")
    sub = parser.add_subparsers(dest="ffn_command", metavar="ACTION")
    sub.required = True

    p_prep = sub.add_parser("prepare", help="materialise a job's training volume, partitions and coordinates")
    p_prep.add_argument("job", help="FFN job spec")
    p_prep.add_argument("--out", required=True, help="directory for the prepared data")
    p_prep.set_defaults(handler=cmd_prepare)

    p_seg = sub.add_parser("segment", help="flood-fill a volume with a trained checkpoint")
    p_seg.add_argument("checkpoint", help="checkpoint file (shared.pt) or a run's checkpoint directory")
    p_seg.add_argument("volume", help="image volume: FILE.h5:DATASET (or a .zarr path)")
    p_seg.add_argument("-o", "--output", required=True, help="segmentation HDF5 to write (FILE.h5[:DATASET])")
    p_seg.add_argument("--job", default=None,
                       help="take the settings from this job spec's data.eval.inference (the options below override)")
    p_seg.add_argument("--min-segment-size", type=int, default=None)
    p_seg.add_argument("--move-threshold", type=float, default=None)
    p_seg.add_argument("--segment-threshold", type=float, default=None)
    p_seg.add_argument("--agglomerate-threshold", type=float, default=None,
                       help="join pieces whose mutual claims reach this (0: no agglomeration)")
    p_seg.add_argument("--precision", choices=PRECISION_REQUESTS, default=None,
                       help="the model's arithmetic (auto: bfloat16 where the CPU has AMX; docs/runtime.md)")
    p_seg.add_argument("--threads", type=int, default=None, help="threads per process")
    p_seg.add_argument("--subvolumes", type=int, nargs=3, metavar=("Z", "Y", "X"), default=None,
                       help="cut the volume into Z x Y x X overlapping pieces, segment each on its own, reconcile")
    p_seg.add_argument("--overlap", type=int, default=None,
                       help="voxels each piece reads beyond its core on every side (default: the FOV)")
    p_seg.add_argument("--ranks", type=int, default=1,
                       help="processes that segment the pieces, started by the local site's launcher")
    p_seg.add_argument("--keep-parts", action="store_true", help="keep the pieces' files after reconciling")
    p_seg.set_defaults(handler=cmd_segment)

    p_parts = sub.add_parser("segment-parts", help="segment this rank's pieces of a subvolume plan (run as "
                             "ranks of a job, e.g. srun -n 64 hpctrain ffn segment-parts PLAN)")
    p_parts.add_argument("plan", help="plan.json written by hpctrain ffn segment --subvolumes")
    p_parts.add_argument("--threads", type=int, default=None, help="threads per rank (default: CPUs / ranks)")
    p_parts.set_defaults(handler=cmd_segment_parts)

    p_finish = sub.add_parser("finish-parts", help="score the agglomeration pairs and fill this rank's pieces of "
                              "a reconciled subvolume plan (run as ranks of a job after segment-parts)")
    p_finish.add_argument("plan", help="plan.json written by hpctrain ffn segment --subvolumes")
    p_finish.add_argument("--threads", type=int, default=None, help="threads per rank (default: CPUs / ranks)")
    p_finish.set_defaults(handler=cmd_segment_parts)

    p_tune = sub.add_parser("tune", help="choose the inference thresholds for a trained checkpoint on a labelled "
                            "volume (a validation volume, or its training volume): the candidates of the job's "
                            "data.eval.tune")
    p_tune.add_argument("checkpoint", help="checkpoint file (shared.pt) or a run's checkpoint directory")
    p_tune.add_argument("image", help="labelled volume's image: FILE.h5:DATASET (e.g. a validation volume)")
    p_tune.add_argument("labels", help="its ground truth: FILE.h5:DATASET")
    p_tune.add_argument("--job", required=True, help="FFN job spec: data.eval.inference (the base settings) and "
                        "data.eval.tune (the candidates and the crop)")
    p_tune.add_argument("--crop", type=int, nargs=3, metavar=("Z", "Y", "X"), default=None,
                        help="central crop of the volume to segment per candidate (default: data.eval.tune.crop)")
    p_tune.add_argument("--fit-joins", nargs=2, metavar=("IMAGE", "LABELS"), default=None,
                        help="fit a join model (hpctrain.ffn.join_model) on this labelled volume first, e.g. the "
                             "training volume (default: data.eval.tune.fit_joins's volume, else data.train, when the "
                             "job has data.eval.tune.fit_joins); --json prints it as chosen.join_model")
    p_tune.add_argument("--threads", type=int, default=None, help="threads (default: all CPUs of this process)")
    p_tune.add_argument("--json", action="store_true")
    p_tune.set_defaults(handler=cmd_tune)

    p_eval = sub.add_parser("evaluate", help="VOI split/merge and adapted Rand error against ground truth")
    p_eval.add_argument("segmentation", help="FILE.h5:DATASET")
    p_eval.add_argument("labels", help="ground truth FILE.h5:DATASET")
    p_eval.add_argument("--baseline", metavar="IMAGE", default=None,
                        help="also score the baselines (Otsu components, seeded watershed) on this image volume")
    p_eval.add_argument("--train", nargs=2, metavar=("IMAGE", "LABELS"), default=None,
                        help="training volume on which the watershed's parameters are chosen (with --baseline)")
    p_eval.add_argument("--json", action="store_true")
    p_eval.set_defaults(handler=cmd_evaluate)


def cmd_prepare(args: argparse.Namespace) -> int:
    from hpctrain.config.job import load_job
    from hpctrain.config.plugins.ffn import SCHEMA, training_margin
    from hpctrain.ffn.task import prepare_training_data

    job = load_job(args.job)
    model_args, data = SCHEMA.parse(job.model_args, job.data)
    # the same margin the ranks use: the policy's whole training box stays inside the volume
    prepared = prepare_training_data(data, model_args.fov, model_args.deltas, Path(args.out),
                                     margin=training_margin(model_args, data))
    for key, value in prepared.items():
        print(f"{key}: {value}")
    return 0


def resolve_checkpoint(path: str) -> str:
    """A run's checkpoint directory stands for the newest checkpoint in it whose shared file checks out
    against the manifest (size and checksum); skipped checkpoints are reported on stderr."""
    import sys

    from hpctrain.checkpoint.manifest import newest_shared_file

    if not Path(path).is_dir():
        return path
    shared, problems = newest_shared_file(path)
    for problem in problems:
        print(f"hpctrain: warning: {problem}", file=sys.stderr)
    return str(shared)


def inference_settings(job_data: dict[str, Any]) -> dict[str, Any]:
    """The held-out segmentation settings: ``data.eval.inference`` of a job (InferenceConfig keys); {} if unset."""
    return dict((job_data.get("eval") or {}).get("inference") or {})


def inference_tuning(job_data: dict[str, Any]) -> Any:
    """``data.eval.tune`` of a job (``config.plugins.ffn.InferenceTuning``), or None where it has none."""
    from hpctrain.config.plugins.ffn import InferenceTuning

    raw = (job_data.get("eval") or {}).get("tune")
    return InferenceTuning.model_validate(raw) if raw else None


def checked_ffn_job(job_path: str) -> Any:
    """An FFN job spec, checked by the FFN schema (a wrong key or value: one error naming it, before any work)."""
    from hpctrain.config.catalog import find_schema
    from hpctrain.config.job import load_job
    from hpctrain.config.plugins.ffn import SCHEMA
    from hpctrain.errors import ConfigError

    job = load_job(job_path)
    if find_schema(job.model)[0] is not SCHEMA:
        raise ConfigError(f"{job_path}: model {job.model!r} is not the FFN; --job takes the settings of an FFN "
                          "job's data.eval", key="model", hint="pass an FFN job, e.g. jobs/ffn-local.yaml")
    SCHEMA.parse(job.model_args, job.data)
    return job


def job_inference_settings(job_path: str) -> dict[str, Any]:
    """``inference_settings`` of an FFN job spec, checked by the FFN schema first."""
    return inference_settings(dict(checked_ffn_job(job_path).data))


def cmd_segment(args: argparse.Namespace) -> int:
    from hpctrain.ffn.inference import run_segment

    config = job_inference_settings(args.job) if args.job else {}
    config.update({k: v for k, v in {"min_segment_size": args.min_segment_size, "move_threshold": args.move_threshold,
                                     "segment_threshold": args.segment_threshold,
                                     "agglomerate_threshold": args.agglomerate_threshold,
                                     "precision": args.precision}.items() if v is not None})
    checkpoint = resolve_checkpoint(args.checkpoint)
    if args.subvolumes:
        summary = segment_in_pieces(checkpoint, args.volume, args.output, config, counts=tuple(args.subvolumes),
                                    overlap=args.overlap, ranks=args.ranks, threads=args.threads,
                                    keep_parts=args.keep_parts)
        keys: tuple[str, ...] = ("out", "objects", "pieces", "joined_pairs", "scored_pairs", "agglomerated_pairs",
                                 "seconds")
    else:
        summary = run_segment(checkpoint, args.volume, args.output, config=config or None, threads=args.threads)
        keys = ("out", "objects", "segmented_fraction", "ffn_calls", "seconds")
    for key in keys:
        if key in summary:
            print(f"{key}: {summary[key]}")
    return 0


def parts_dir_for(output: str) -> Path:
    """Where the pieces of ``output`` (FILE.h5[:DATASET]) are kept: FILE.parts/ beside it."""
    from hpctrain.ffn.inference import _split_h5

    file, _ = _split_h5(output, "segmentation")
    return file.with_name(file.stem + ".parts")


def segment_in_pieces(checkpoint: str, volume: str, output: str, config: dict[str, Any] | None, *,
                      counts: tuple[int, int, int], overlap: int | None = None, ranks: int = 1,
                      threads: int | None = None, keep_parts: bool = False) -> dict[str, Any]:
    """Plan overlapping subvolumes; flood them with ``ranks`` local processes (the local site's launcher) or
    in this process; reconcile; then, when the settings agglomerate or fill, count the contacts, finish the
    pieces on the ranks again and assemble ``output`` (``ffn/subvolume_finish.py``). Returns a summary."""
    import shutil
    import time

    from hpctrain.ffn.inference import InferenceConfig, load_model
    from hpctrain.ffn.subvolume_finish import OVERSEGMENTATION, assemble, assign_pairs, finish_parts, finishes
    from hpctrain.ffn.subvolumes import plan_subvolumes, read_plan, reconcile, segment_parts, write_plan
    from hpctrain.ffn.volume import open_volume

    t0 = time.perf_counter()
    _, model_args, _ = load_model(checkpoint)
    fov = model_args.get("fov", 33)
    fov3 = [int(fov)] * 3 if isinstance(fov, int) else [int(v) for v in fov]
    settings = InferenceConfig.from_mapping(config or {})
    with_volume = open_volume(volume)
    try:
        shape = tuple(int(s) for s in with_volume.shape)
    finally:
        with_volume.close()
    halo = overlap if overlap is not None else max(fov3)
    plan = plan_subvolumes(shape, counts, halo, min_size=fov3)
    parts = parts_dir_for(output)
    plan_path = parts / "plan.json"
    if plan_path.exists():  # a rerun keeps finished pieces only if they were cut the same way
        old, _ = read_plan(plan_path)
        if old != plan:
            shutil.rmtree(parts)
    if not plan_path.exists():
        write_plan(plan_path, plan, checkpoint=str(Path(checkpoint).resolve()), volume=str(volume),
                   config=config or {}, shape=list(shape))
    if ranks > 1:
        on_ranks("segment-parts", plan_path, ranks, threads)
    else:
        segment_parts(plan_path, 0, 1, threads=threads)
    attrs = {"checkpoint": checkpoint, "image": str(volume), "subvolumes": list(counts), "overlap": halo}
    if not finishes(settings):
        summary = reconcile(plan, parts, output, shape, attrs=attrs)
    else:
        if not (parts / OVERSEGMENTATION).exists():
            joined = reconcile(plan, parts, parts / OVERSEGMENTATION, shape)["joined_pairs"]
            (parts / "reconciled.txt").write_text(str(joined))
        assign_pairs(plan, parts, shape, settings.min_contact)
        if ranks > 1:
            on_ranks("finish-parts", plan_path, ranks, threads)
        else:
            finish_parts(plan_path, 0, 1, threads=threads)
        summary = assemble(plan, parts, output, shape, settings.agglomerate_threshold, attrs=attrs,
                           linkage=settings.linkage)
        summary["joined_pairs"] = int((parts / "reconciled.txt").read_text())
    if not keep_parts:
        shutil.rmtree(parts)
    return {**summary, "seconds": round(time.perf_counter() - t0, 1)}


def on_ranks(action: str, plan_path: Path, ranks: int, threads: int | None) -> None:
    """``hpctrain ffn ACTION PLAN`` as ``ranks`` processes of the local site's launcher."""
    import sys

    from hpctrain.errors import RuntimeFailure
    from hpctrain.submission.launchers.local_launch import launch

    command = [sys.executable, "-m", "hpctrain", "ffn", action, str(plan_path)]
    if threads:
        command += ["--threads", str(threads)]
    code = launch(command, ranks, log_dir=str(plan_path.parent / "logs" / action))
    if code != 0:
        raise RuntimeFailure(f"hpctrain ffn {action} {plan_path} failed (launcher exit {code})",
                             hint=f"see {plan_path.parent / 'logs' / action}; running the same command again keeps "
                                  "finished pieces")


def cmd_segment_parts(args: argparse.Namespace) -> int:
    import os

    from hpctrain.ffn.perf import available_cpus
    from hpctrain.ffn.subvolume_finish import finish_parts
    from hpctrain.ffn.subvolumes import segment_parts
    from hpctrain.launch_env import detect_launch_env

    env = detect_launch_env(os.environ)
    threads = args.threads or max(1, available_cpus() // max(env.local_size, 1))
    run, verb = (segment_parts, "segmented") if args.ffn_command == "segment-parts" else (finish_parts, "finished")
    written = run(args.plan, env.rank, env.size, threads=threads)
    print(f"rank {env.rank} of {env.size}: {len(written)} pieces {verb}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.errors import ConfigError
    from hpctrain.ffn.perf import available_cpus
    from hpctrain.ffn.tuning import tune_checkpoint

    job = checked_ffn_job(args.job)
    tuning = inference_tuning(dict(job.data))
    if tuning is None:
        raise ConfigError(f"{args.job} has no data.eval.tune: nothing to choose between", key="data.eval.tune",
                          hint="add e.g. data.eval.tune: {move_threshold: [0.7, 0.8, 0.9], "
                               "agglomerate_threshold: [0.6, 0.7, 0.8]}")
    record = tune_checkpoint(resolve_checkpoint(args.checkpoint), args.image, args.labels,
                             inference_settings(dict(job.data)), tuning.grid(), args.crop or tuning.crop,
                             threads=args.threads or available_cpus(), fit_on=join_fit_volume(args, job, tuning),
                             fit_settings=tuning.fit_flood_settings())
    if args.json:
        print_json({"chosen": record["chosen"], "rows": record["rows"],
                    **({"join_fit": record["join_fit"]} if "join_fit" in record else {})})
        return 0
    print_table(["settings", "VOI", "split", "merge", "adapted Rand", "segments"],
                [[", ".join(f"{k} {v}" for k, v in r["settings"].items()), f"{r['voi']:.3f}", f"{r['voi_split']:.3f}",
                  f"{r['voi_merge']:.3f}", f"{r['adapted_rand_error']:.3f}", str(r["segments"])]
                 for r in record["rows"]])
    print("chosen (lowest VOI): " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in record["chosen"].items()
                                             if k != "join_model"))
    fit = record.get("join_fit") or {}
    if "pairs" in fit:
        print(f"join model fitted on {fit['pairs']} pairs ({fit['one_object']} one object), weights {fit['coef']}; "
              "--json prints it for data.eval.inference.join_model")
    return 0


def join_fit_volume(args: argparse.Namespace, job: Any, tuning: Any) -> tuple[str, str, Any] | None:
    """(image, labels, crop) the join model is fitted on: --fit-joins, else the job's data.eval.tune.fit_joins
    volume or data.train (files; a synthetic one is the demo's to write); None when neither asks for one."""
    from hpctrain.errors import ConfigError

    fit = tuning.fit_joins
    if args.fit_joins:
        return args.fit_joins[0], args.fit_joins[1], fit.crop if fit is not None else None
    if fit is None:
        return None
    if fit.volume is not None:
        image, labels = fit.volume.image, fit.volume.labels
    else:
        train = dict(job.data).get("train") or {}
        image, labels = train.get("image"), train.get("labels")
    if not image or not labels:
        raise ConfigError("data.eval.tune.fit_joins needs a labelled volume with image and labels files",
                          key="data.eval.tune.fit_joins",
                          hint="pass --fit-joins IMAGE LABELS (e.g. the training volume's FILE.h5:image and "
                               "FILE.h5:labels)")
    return str(image), str(labels), fit.crop


def baseline_scores(image_spec: str, labels: Any, train: tuple[str, str] | None) -> dict[str, dict[str, Any]]:
    """Scores of the Otsu-components baseline and of the seeded watershed on ``image_spec``; the watershed's
    parameters are chosen on the ``train`` (image, labels) volume when given, else its defaults."""
    import numpy as np

    from hpctrain.ffn.baseline import baseline_segmentation
    from hpctrain.ffn.evaluate import evaluate_segmentation
    from hpctrain.ffn.volume import load_volume
    from hpctrain.ffn.watershed import WatershedParams, tune_watershed, watershed_segmentation

    image = np.asarray(load_volume(image_spec))
    params = WatershedParams()
    if train:
        params, _ = tune_watershed(np.asarray(load_volume(train[0])), np.asarray(load_volume(train[1])))
    return {"baseline (Otsu components)": evaluate_segmentation(baseline_segmentation(image), labels),
            f"watershed ({'tuned on --train' if train else 'default parameters'})":
                {**evaluate_segmentation(watershed_segmentation(image, params), labels), "params": vars(params)}}


def cmd_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from hpctrain.commands.output import print_json, print_table
    from hpctrain.errors import ConfigError
    from hpctrain.ffn.evaluate import format_report, run_evaluate
    from hpctrain.ffn.volume import load_volume

    if args.train and not args.baseline:
        raise ConfigError("--train chooses the watershed baseline's parameters; it needs --baseline IMAGE")
    metrics = run_evaluate(args.segmentation, args.labels)
    others: dict[str, dict[str, Any]] = {}
    if args.baseline:
        others = baseline_scores(args.baseline, np.asarray(load_volume(args.labels)), args.train)
    if args.json:
        print_json({**metrics, "baselines": others} if others else metrics)
        return 0
    print(format_report(metrics))
    if others:
        print()
        rows = [["this segmentation", *(f"{metrics[k]:.3f}" for k in ("voi", "voi_split", "voi_merge",
                                                                        "adapted_rand_error"))]]
        rows += [[name, *(f"{m[k]:.3f}" for k in ("voi", "voi_split", "voi_merge", "adapted_rand_error"))]
                 for name, m in others.items()]
        print_table(["segmentation", "VOI", "split", "merge", "adapted Rand"], rows)
    return 0
