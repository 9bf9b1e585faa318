"""``hpctrain demo``: the main job on the embedded default site (train, segment and evaluate an FFN)."""

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
    parser.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from hpctrain.ffn.demo import run_demo

    shape = tuple(args.volume_shape) if args.volume_shape else None
    run_demo(args.out, job_path=args.job, steps=args.steps, ranks=args.ranks,
             volume_shape=shape, threads=args.threads)  # type: ignore[arg-type]
    # The pipeline ran end to end: exit 0. Whether the FFN beat the baseline is printed with both scores
    # (and recorded in scores.json); it depends on training length and is not an error of the command.
    return 0
