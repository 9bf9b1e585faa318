"""``hpctrain jobs list|show|copy|validate``: the job specs known by name (the shipped examples and the user's
own, ``config/job_catalog.py``), a copy of one to start from, and checks of a spec (the model's arguments and
data, the LR schedule, the fit on a site) as far as the laptop can, without rendering."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.commands.common_args import add_job_arguments, load_job_from_args
from hpctrain.commands.output import print_json, print_table
from hpctrain.errors import ConfigError
from hpctrain.text import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("jobs", help="validate and show job specs")
    sub = parser.add_subparsers(dest="jobs_command", metavar="ACTION")
    sub.required = True
    p_list = sub.add_parser("list", help="job specs by name: the shipped examples, $HPCTRAIN_JOBS and "
                                         "~/.config/hpctrain/jobs/")
    p_list.add_argument("--json", action="store_true")
    p_list.set_defaults(handler=cmd_list)
    p_copy = sub.add_parser("copy", help="copy a job spec (e.g. a shipped example) to edit as your own")
    p_copy.add_argument("name", help="job spec name (hpctrain jobs list) or file")
    p_copy.add_argument("directory", nargs="?", default=".", help="where to write NAME.yaml (default: here)")
    p_copy.add_argument("--force", action="store_true", help="replace a file of that name there")
    p_copy.set_defaults(handler=cmd_copy)
    p_val = sub.add_parser("validate", help="check a job spec as the ranks will at start; with --site also that "
                                            "it fits the site")
    add_job_arguments(p_val)
    p_val.add_argument("--check-paths", action="store_true",
                       help="check the data files on this machine (exist, format, datasets, shapes); implied "
                            "without --site (the local site, the default) and with --site local; run it where "
                            "the job will be submitted")
    p_val.add_argument("--json", action="store_true")
    p_val.set_defaults(handler=cmd_validate)
    p_show = sub.add_parser("show", help="a job spec (file or name) with defaults and overrides applied")
    add_job_arguments(p_show)
    p_show.add_argument("--json", action="store_true")
    p_show.set_defaults(handler=cmd_show)


def cmd_validate(args: argparse.Namespace) -> int:
    from hpctrain.config.preflight import check_job
    from hpctrain.config.site import load_site
    from hpctrain.submission.schedulers.base import place

    job = load_job_from_args(args)
    result = {"job": job.name, "valid": True, "site": None}
    site = load_site(args.site or "local")  # without --site, what submit would do: the default site, local
    placement = place(job, site)
    result.update(site=site.name, queue=placement.queue_name, backend=placement.backend,
                  ranks=job.resources.ranks, execution_queue=placement.execution_queue,
                  requeue=placement.requeue, notes=list(placement.notes))
    # Without --site the job is checked for the default site, local: it would read its files here.
    result["warnings"] = check_job(job, site, local_paths=args.check_paths or not args.site)
    if args.json:
        print_json(result)
        return 0
    for note in result.get("notes", []):
        print(f"hpctrain: note: {printable(note)}", file=sys.stderr)
    for warning in result["warnings"]:
        print(f"hpctrain: warning: {printable(warning)}", file=sys.stderr)
    queue = f"queue {result['queue']}, " if result.get("queue") else ""
    default = "" if args.site else "; the default site: --site NAME checks another"
    where = f" on {result['site']} ({queue}{result.get('backend')}{default})"
    print(f"{printable(args.job)}: ok{where}", file=sys.stdout)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from hpctrain.config.job import dump_job

    job = load_job_from_args(args)
    if args.json:
        print_json(job.model_dump(mode="json"))
    else:
        print(dump_job(job).rstrip())
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from hpctrain.config.job import load_job
    from hpctrain.config.job_catalog import available_jobs

    rows = []
    for name, path in sorted(available_jobs().items()):
        try:
            job = load_job(path)
            rows.append({"name": name, "model": job.model, "nodes": job.resources.nodes,
                         "description": job.description or "", "path": str(path), "valid": True})
        except (ConfigError, OSError) as exc:  # one broken draft is listed, never fatal
            rows.append({"name": name, "model": "?", "nodes": "?", "description": f"BROKEN: {exc}",
                         "path": str(path), "valid": False})
    if args.json:
        print_json(rows)
    else:
        print_table(["NAME", "MODEL", "NODES", "DESCRIPTION"],
                    [[r["name"], r["model"], r["nodes"], r["description"]] for r in rows])
    return 0


def cmd_copy(args: argparse.Namespace) -> int:
    from hpctrain.config.job_catalog import copy_job

    target = copy_job(args.name, Path(args.directory).expanduser(), force=args.force)
    print(f"wrote {printable(str(target))}: edit it, then `hpctrain jobs validate {printable(str(target))}`")
    return 0
