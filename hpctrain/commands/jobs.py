"""``hpctrain jobs validate|show``: check job specs (and that they fit a site) without rendering."""

from __future__ import annotations

import argparse
import sys

from hpctrain.commands.common_args import add_job_arguments, load_job_from_args
from hpctrain.commands.output import print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("jobs", help="validate and show job specs")
    sub = parser.add_subparsers(dest="jobs_command", metavar="ACTION")
    sub.required = True
    p_val = sub.add_parser("validate", help="validate a job spec; with --site also check it fits the site")
    add_job_arguments(p_val)
    p_val.add_argument("--json", action="store_true")
    p_val.set_defaults(handler=cmd_validate)
    p_show = sub.add_parser("show", help="the job spec with defaults and overrides applied")
    add_job_arguments(p_show)
    p_show.add_argument("--json", action="store_true")
    p_show.set_defaults(handler=cmd_show)


def cmd_validate(args: argparse.Namespace) -> int:
    from hpctrain.config.fit import check_fit
    from hpctrain.config.site import load_site

    job = load_job_from_args(args)
    result = {"job": job.name, "valid": True, "site": None}
    if args.site:
        site = load_site(args.site)
        placement = check_fit(job, site)
        result.update(site=site.name, queue=placement.queue_name, backend=placement.backend,
                      ranks=job.resources.ranks)
    if args.json:
        print_json(result)
    else:
        where = f" on {result['site']} (queue {result.get('queue')}, {result.get('backend')})" if args.site else ""
        print(f"{args.job}: ok{where}", file=sys.stdout)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from hpctrain.config.job import dump_job

    job = load_job_from_args(args)
    if args.json:
        print_json(job.model_dump(mode="json"))
    else:
        print(dump_job(job).rstrip())
    return 0
