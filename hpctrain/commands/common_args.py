"""Arguments shared by commands that take a job spec (render, submit, jobs validate)."""

from __future__ import annotations

import argparse

from hpctrain.config.numbers import flag_int


def add_job_arguments(parser: argparse.ArgumentParser, *, site_required: bool = False) -> None:
    parser.add_argument("job", help="job spec (YAML file)")
    parser.add_argument("--site", required=site_required, default=None,
                        help="site profile name or YAML path (default: local)")
    parser.add_argument("--nodes", type=flag_int, default=None, help="override resources.nodes")
    parser.add_argument("--walltime", default=None, help="override resources.walltime (HH:MM:SS)")
    parser.add_argument("--queue", default=None, help="override resources.queue")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override any spec key, e.g. --set train.lr=0.01 (repeatable)")


def load_job_from_args(args: argparse.Namespace):  # -> JobSpec (kept untyped to avoid importing pydantic here)
    from hpctrain.config.job import load_job

    return load_job(args.job, sets=args.sets, nodes=args.nodes, walltime=args.walltime, queue=args.queue)
