"""``hpctrain ffn prepare|segment|evaluate``: the Flood-Filling Network's data, inference and evaluation."""

from __future__ import annotations

import argparse


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
    p_seg.add_argument("--min-segment-size", type=int, default=None)
    p_seg.add_argument("--move-threshold", type=float, default=None)
    p_seg.add_argument("--segment-threshold", type=float, default=None)
    p_seg.add_argument("--threads", type=int, default=None)
    p_seg.set_defaults(handler=cmd_segment)

    p_eval = sub.add_parser("evaluate", help="VOI split/merge and adapted Rand error against ground truth")
    p_eval.add_argument("segmentation", help="FILE.h5:DATASET")
    p_eval.add_argument("labels", help="ground truth FILE.h5:DATASET")
    p_eval.add_argument("--json", action="store_true")
    p_eval.set_defaults(handler=cmd_evaluate)


def cmd_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpctrain.config.job import load_job
    from hpctrain.config.plugins.ffn import SCHEMA, training_margin
    from hpctrain.ffn.task import prepare_training_data

    job = load_job(args.job)
    model_args, data = SCHEMA.parse(job.model_args, job.data, job.origin)
    # The same centres as training makes: far enough from the border for the policy's whole training box.
    prepared = prepare_training_data(data, model_args.fov, model_args.deltas, Path(args.out),
                                     margin=training_margin(model_args, data))
    for key, value in prepared.items():
        print(f"{key}: {value}")
    return 0


def resolve_checkpoint(path: str) -> str:
    """A run's checkpoint directory stands for the newest checkpoint in it whose shared file checks out
    against the manifest (size and checksum); skipped checkpoints are reported on stderr."""
    import sys
    from pathlib import Path

    from hpctrain.checkpoint.manifest import newest_shared_file

    if not Path(path).is_dir():
        return path
    shared, problems = newest_shared_file(path)
    for problem in problems:
        print(f"hpctrain: warning: {problem}", file=sys.stderr)
    return str(shared)


def cmd_segment(args: argparse.Namespace) -> int:
    from hpctrain.ffn.inference import run_segment

    config = {k: v for k, v in {"min_segment_size": args.min_segment_size, "move_threshold": args.move_threshold,
                                "segment_threshold": args.segment_threshold}.items() if v is not None}
    summary = run_segment(resolve_checkpoint(args.checkpoint), args.volume, args.output, config=config or None,
                          threads=args.threads)
    for key in ("out", "objects", "segmented_fraction", "ffn_calls", "seconds"):
        if key in summary:
            print(f"{key}: {summary[key]}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json
    from hpctrain.ffn.evaluate import format_report, run_evaluate

    metrics = run_evaluate(args.segmentation, args.labels)
    if args.json:
        print_json(metrics)
    else:
        print(format_report(metrics))
    return 0
