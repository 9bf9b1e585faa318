"""Arguments shared by commands: a job spec with its overrides (render, submit, jobs validate), and file paths
refused at parse time when the OS could not take them."""

from __future__ import annotations

import argparse

from hpctrain.config.numbers import flag_int
from hpctrain.files import PATH_MAX, path_too_long


def path_flag(text: str) -> str:
    """argparse ``type=`` for a file path: refused in one line when it is too long for the OS (it would end in
    ENAMETOOLONG wherever it is first opened)."""
    problem = path_too_long(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def volume_flag(text: str) -> str:
    """argparse ``type=`` for a volume, ``FILE.h5:DATASET`` or a .zarr path: its file's path as ``path_flag``."""
    from hpctrain.config.plugins.ffn_volumes import parse_volume_spec

    if len(text) >= 2 * PATH_MAX:  # too long whatever part the dataset is; not parsed
        path_flag(text)
    path_flag(str(parse_volume_spec(text)[0]))
    return text


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
