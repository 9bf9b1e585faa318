"""``hpctrain demo``: the README's main job — train a small FFN with 2 ranks on this machine, show that it
segments, and leave the trained model as a package ``hpctrain ffn segment`` uses (``hpctrain.workflows.demo``)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="train a small FFN with 2 local ranks, segment and evaluate")
    parser.add_argument("--out", default="demo-out", help="output directory (replaced)")
    parser.add_argument("--job", default=None, help="FFN job spec (default: jobs/ffn-local.yaml)")
    parser.add_argument("--steps", type=int, default=None, help="override train.steps")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--volume-shape", type=int, nargs=3, metavar=("Z", "Y", "X"), default=None,
                        help="shape of both synthetic volumes instead of the job's (a quick run)")
    parser.add_argument("--threads", type=int, default=None,
                        help="segmentation threads (default: all CPUs this process may use)")
    parser.add_argument("--more", action="store_true",
                        help="also score held-out seeds 3-5 and the generalisation condition")
    parser.add_argument("--curve", type=int, default=0, metavar="N",
                        help="keep N checkpoints through the run and score each on the held-out volume, each with its "
                             "own join model and thresholds (one flood of the training volume per checkpoint)")
    parser.add_argument("--from-run", default=None, metavar="RUN_DIR",
                        help="score a finished demo run's checkpoint again (e.g. with other inference settings "
                             "in --job) instead of training")
    parser.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from hpctrain.workflows.demo import run_demo

    shape = tuple(args.volume_shape) if args.volume_shape else None
    result = run_demo(args.out, job_path=args.job, steps=args.steps, ranks=args.ranks, volume_shape=shape,
                      threads=args.threads, more=args.more, curve=args.curve,
                      from_run=args.from_run)  # type: ignore[arg-type]
    from hpctrain.report.build import demo_report_line

    print(demo_report_line(result["run_dir"], args.out, result["png"]), flush=True)
    # The pipeline ran end to end: exit 0. Whether the FFN met its targets is printed with every score (and
    # recorded in scores.json); it depends on training length and is not an error of the command.
    return 0
