"""``hpctrain ffn prepare|segment|segment-parts|finish-parts|tune|evaluate``: the Flood-Filling Network's data,
inference (whole, or in overlapping subvolumes on several ranks), the inference settings chosen for a trained
model on a labelled volume (its model package), and evaluation against ground truth and the baselines. The work
is done in ``hpctrain.workflows.ffn`` and ``hpctrain.ffn``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpctrain.commands.common_args import path_flag, volume_flag
from hpctrain.config.numbers import flag_threads
from hpctrain.config.precision import PRECISION_REQUESTS
from hpctrain.memory_budget import ENV_VAR as MEMORY_ENV
from hpctrain.memory_budget import gb_flag

MEMORY_HELP = (f"memory the volumes read and the work on them may fill, in GB (default: ${MEMORY_ENV}, else half "
               "of this machine's memory); a volume that does not fit is refused before it is read")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ffn", help="Flood-Filling Network: prepare data, segment, evaluate")
    sub = parser.add_subparsers(dest="ffn_command", metavar="ACTION")
    sub.required = True
    for add in (_add_prepare, _add_segment, _add_segment_parts, _add_finish_parts, _add_tune, _add_evaluate):
        add(sub)


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    """The ``ffn prepare`` action and its flags."""
    p_prep = sub.add_parser("prepare", help="materialise a job's training volume, partitions and coordinates")
    p_prep.add_argument("job", type=path_flag, help="FFN job spec")
    p_prep.add_argument("--out", type=path_flag, required=True, help="directory for the prepared data")
    p_prep.set_defaults(handler=cmd_prepare)


def _add_segment(sub: argparse._SubParsersAction) -> None:
    """The ``ffn segment`` action and its flags."""
    p_seg = sub.add_parser("segment", help="flood-fill a volume with a trained model, with the settings chosen for "
                           "it (its model package, inference.json) unless --job or the options say otherwise")
    p_seg.add_argument("checkpoint", metavar="RUN", type=path_flag, help="a run id, a run directory, its checkpoint "
                       "directory or a checkpoint file (shared.pt)")
    p_seg.add_argument("volume", type=volume_flag, help="image volume: FILE.h5:DATASET (or a .zarr path)")
    p_seg.add_argument("-o", "--output", type=volume_flag, required=True,
                       help="segmentation HDF5 to write (FILE.h5[:DATASET])")
    p_seg.add_argument("--job", type=path_flag, default=None,
                       help="take the settings from this job spec's data.eval.inference (the options below override)")
    p_seg.add_argument("--min-segment-size", type=int, default=None)
    p_seg.add_argument("--move-threshold", type=float, default=None)
    p_seg.add_argument("--segment-threshold", type=float, default=None)
    p_seg.add_argument("--agglomerate-threshold", type=float, default=None,
                       help="join pieces whose mutual claims reach this (0: no agglomeration)")
    p_seg.add_argument("--precision", choices=PRECISION_REQUESTS, default=None,
                       help="the model's arithmetic (auto: bfloat16 where the CPU has AMX; docs/runtime.md)")
    p_seg.add_argument("--threads", type=flag_threads, default=None, help="threads per process")
    p_seg.add_argument("--memory-gb", type=gb_flag, default=None, help=MEMORY_HELP + " (per rank with --ranks)")
    p_seg.add_argument("--subvolumes", type=int, nargs=3, metavar=("Z", "Y", "X"), default=None,
                       help="cut the volume into Z x Y x X overlapping pieces, segment each on its own, reconcile")
    p_seg.add_argument("--overlap", type=int, default=None,
                       help="voxels each piece reads beyond its core on every side (default: the FOV)")
    p_seg.add_argument("--ranks", type=int, default=1,
                       help="processes that segment the pieces, started by the local site's launcher")
    p_seg.add_argument("--keep-parts", action="store_true", help="keep the pieces' files after reconciling")
    p_seg.set_defaults(handler=cmd_segment)


def _add_segment_parts(sub: argparse._SubParsersAction) -> None:
    """The ``ffn segment-parts`` action and its flags."""
    p_parts = sub.add_parser("segment-parts", help="segment this rank's pieces of a subvolume plan (run as "
                             "ranks of a job, e.g. srun -n 64 hpctrain ffn segment-parts PLAN)")
    p_parts.add_argument("plan", type=path_flag, help="plan.json written by hpctrain ffn segment --subvolumes")
    p_parts.add_argument("--threads", type=flag_threads, default=None,
                         help="threads per rank (default: CPUs / ranks)")
    p_parts.add_argument("--memory-gb", type=gb_flag, default=None, help=MEMORY_HELP)
    p_parts.set_defaults(handler=cmd_segment_parts)


def _add_finish_parts(sub: argparse._SubParsersAction) -> None:
    """The ``ffn finish-parts`` action and its flags."""
    p_finish = sub.add_parser("finish-parts", help="score the agglomeration pairs and fill this rank's pieces of "
                              "a reconciled subvolume plan (run as ranks of a job after segment-parts)")
    p_finish.add_argument("plan", type=path_flag, help="plan.json written by hpctrain ffn segment --subvolumes")
    p_finish.add_argument("--threads", type=flag_threads, default=None,
                          help="threads per rank (default: CPUs / ranks)")
    p_finish.add_argument("--memory-gb", type=gb_flag, default=None, help=MEMORY_HELP)
    p_finish.set_defaults(handler=cmd_segment_parts)


def _add_tune(sub: argparse._SubParsersAction) -> None:
    """The ``ffn tune`` action and its flags."""
    p_tune = sub.add_parser("tune", help="choose the inference settings for a trained model on a labelled volume "
                            "among the candidates of its job's data.eval.tune, and write them as its model package")
    p_tune.add_argument("checkpoint", metavar="RUN", type=path_flag, help="a run id, a run directory, its checkpoint "
                        "directory or a checkpoint file (shared.pt)")
    p_tune.add_argument("image", nargs="?", type=volume_flag, default=None, help=argparse.SUPPRESS)
    p_tune.add_argument("labels_pos", nargs="?", type=volume_flag, default=None, help=argparse.SUPPRESS)
    p_tune.add_argument("--volume", type=volume_flag, default=None, help="labelled volume's image: FILE.h5:DATASET "
                        "(default: the job's data.eval.tune.volume, else its training volume)")
    p_tune.add_argument("--labels", type=volume_flag, default=None, help="its ground truth: FILE.h5:DATASET")
    p_tune.add_argument("--job", type=path_flag, default=None, help="FFN job spec: data.eval.inference (the base "
                        "settings) and data.eval.tune (the candidates and the crop); default: the run's own job")
    p_tune.add_argument("--crop", type=int, nargs=3, metavar=("Z", "Y", "X"), default=None,
                        help="central crop of the volume to segment per candidate (default: data.eval.tune.crop)")
    p_tune.add_argument("--fit-joins", nargs=2, type=volume_flag, metavar=("IMAGE", "LABELS"), default=None,
                        help="fit a join model (hpctrain.ffn.inference.join_model) on this labelled volume first, "
                             "e.g. the training volume (default: data.eval.tune.fit_joins's volume, else data.train, "
                             "when the job has data.eval.tune.fit_joins)")
    p_tune.add_argument("--replace-joins", action="store_true",
                        help="write the new join model even where it was fitted on far fewer pairs than the one in "
                             "the model package (refused otherwise)")
    p_tune.add_argument("--no-write", action="store_true", help="print the choice; do not write the model package")
    p_tune.add_argument("--threads", type=flag_threads, default=None,
                        help="threads (default: all CPUs of this process)")
    p_tune.add_argument("--memory-gb", type=gb_flag, default=None, help=MEMORY_HELP)
    p_tune.add_argument("--json", action="store_true")
    p_tune.set_defaults(handler=cmd_tune)


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    """The ``ffn evaluate`` action and its flags."""
    p_eval = sub.add_parser("evaluate", help="VOI split/merge and adapted Rand error against ground truth")
    p_eval.add_argument("segmentation", type=volume_flag, help="FILE.h5:DATASET")
    p_eval.add_argument("labels", type=volume_flag, help="ground truth FILE.h5:DATASET")
    p_eval.add_argument("--baseline", metavar="IMAGE", type=volume_flag, default=None,
                        help="also score the baselines (Otsu components, seeded watershed) on this image volume")
    p_eval.add_argument("--train", nargs=2, type=volume_flag, metavar=("IMAGE", "LABELS"), default=None,
                        help="training volume on which the watershed's parameters are chosen (with --baseline)")
    p_eval.add_argument("--memory-gb", type=gb_flag, default=None, help=MEMORY_HELP)
    p_eval.add_argument("--json", action="store_true")
    p_eval.set_defaults(handler=cmd_evaluate)


def cmd_prepare(args: argparse.Namespace) -> int:
    from hpctrain.config.job import load_job
    from hpctrain.config.plugins.ffn import SCHEMA, training_margin
    from hpctrain.ffn.training.task import prepare_training_data

    job = load_job(args.job)
    model_args, data = SCHEMA.parse(job.model_args, job.data)
    # the same margin the ranks use: the policy's whole training box stays inside the volume
    prepared = prepare_training_data(data, model_args.fov, model_args.deltas, Path(args.out),
                                     margin=training_margin(model_args, data))
    for key, value in prepared.items():
        print(f"{key}: {value}")
    return 0


def cmd_segment(args: argparse.Namespace) -> int:
    from hpctrain.ffn.inference.runner import run_segment
    from hpctrain.memory_budget import memory_budget
    from hpctrain.workflows.ffn import find_trained, segment_in_pieces, segment_settings

    budget = memory_budget(args.memory_gb)
    trained = find_trained(args.checkpoint)
    options = {"min_segment_size": args.min_segment_size, "move_threshold": args.move_threshold,
               "segment_threshold": args.segment_threshold, "agglomerate_threshold": args.agglomerate_threshold,
               "precision": args.precision}
    config, provenance = segment_settings(trained, args.job, options)
    for warning in trained.warnings:
        print(f"hpctrain: warning: {warning}", file=sys.stderr)
    if args.subvolumes:
        summary = segment_in_pieces(trained.checkpoint, args.volume, args.output, config,
                                    counts=tuple(args.subvolumes), overlap=args.overlap, ranks=args.ranks,
                                    threads=args.threads, keep_parts=args.keep_parts, attrs=provenance,
                                    budget=budget, memory_gb=args.memory_gb)
        keys: tuple[str, ...] = ("out", "objects", "pieces", "joined_pairs", "scored_pairs", "agglomerated_pairs",
                                 "seconds")
    else:
        summary = run_segment(trained.checkpoint, args.volume, args.output, config=config, threads=args.threads,
                              provenance=provenance, budget=budget)
        keys = ("out", "objects", "segmented_fraction", "ffn_calls", "seconds")
    print(f"settings: {provenance['settings_from']}")
    for key in keys:
        if key in summary:
            print(f"{key}: {summary[key]}")
    return 0


def cmd_segment_parts(args: argparse.Namespace) -> int:
    import os

    from hpctrain.ffn.inference.subvolume_finish import finish_parts
    from hpctrain.ffn.inference.subvolumes import segment_parts
    from hpctrain.ffn.perf import available_cpus
    from hpctrain.launch_env import detect_launch_env
    from hpctrain.memory_budget import memory_budget

    env = detect_launch_env(os.environ)
    threads = args.threads or max(1, available_cpus() // max(env.local_size, 1))
    run, verb = (segment_parts, "segmented") if args.ffn_command == "segment-parts" else (finish_parts, "finished")
    written = run(args.plan, env.rank, env.size, threads=threads, budget=memory_budget(args.memory_gb))
    print(f"rank {env.rank} of {env.size}: {len(written)} pieces {verb}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.errors import ConfigError
    from hpctrain.memory_budget import memory_budget
    from hpctrain.workflows.ffn import checked_ffn_job, find_trained, tune_trained

    budget = memory_budget(args.memory_gb)
    trained = find_trained(args.checkpoint)
    for warning in trained.warnings:
        print(f"hpctrain: warning: {warning}", file=sys.stderr)
    if args.job:
        job_data = dict(checked_ffn_job(args.job).data)
    elif trained.job_data is not None:
        job_data = trained.job_data
    else:
        raise ConfigError(f"{args.checkpoint} is a bare checkpoint: its job is not known", key="--job",
                          hint="pass --job JOB (the FFN job spec whose data.eval.tune holds the candidates)")
    record = tune_trained(trained, job_data, image=args.volume or args.image, labels=args.labels or args.labels_pos,
                          crop=args.crop, fit_joins=args.fit_joins, threads=args.threads, write=not args.no_write,
                          replace_joins=args.replace_joins, budget=budget)
    if args.json:
        print_json({"chosen": record["chosen"], "rows": record["rows"], "package": record["package"],
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
        print(f"join model fitted on {fit['pairs']} pairs ({fit['one_object']} one object), weights {fit['coef']}")
    elif "not_fitted" in fit:
        print(f"no join model: {fit['not_fitted']}; pairs are joined by their mutual claims")
    if record["package"]:
        print(f"model package: {record['package']} (hpctrain ffn segment {args.checkpoint} VOLUME uses it)")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from hpctrain.commands.output import print_json, print_table
    from hpctrain.errors import ConfigError
    from hpctrain.ffn.evaluation.evaluate import format_report, run_evaluate
    from hpctrain.ffn.volume import load_volume
    from hpctrain.memory_budget import memory_budget
    from hpctrain.workflows.ffn import baseline_scores

    if args.train and not args.baseline:
        raise ConfigError("--train chooses the watershed baseline's parameters; it needs --baseline IMAGE")
    budget = memory_budget(args.memory_gb)
    metrics = run_evaluate(args.segmentation, args.labels, budget=budget)
    others: dict[str, dict[str, Any]] = {}
    if args.baseline:
        others = baseline_scores(args.baseline, np.asarray(load_volume(args.labels, budget)), args.train,
                                 budget=budget)
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
