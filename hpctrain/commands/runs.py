"""``hpctrain runs [--site SITE] [--all] [--json]``: the run registry as a table (no scheduler calls).

States, reasons (failure notes, "restart 1 of 5") and progress are what the last poll recorded.
"""

from __future__ import annotations

import argparse

DEFAULT_LIMIT = 20


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list the runs in the registry")
    parser.add_argument("--site", default=None, help="only runs of this site")
    parser.add_argument("--all", action="store_true", help=f"every run, not only the newest {DEFAULT_LIMIT}")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.submission.registry import Registry
    from hpctrain.submission.views import view_of

    with Registry() as registry:
        runs = registry.list_runs(site=args.site)
        if not args.all:
            runs = runs[:DEFAULT_LIMIT]
        views = [(run, view_of(registry, run)) for run in runs]
        if args.json:
            print_json([{**v.as_dict(), "created": r.created, "spec_hash": r.spec_hash,
                         "array_parent": r.array_parent, "array_index": r.array_index,
                         "overrides": r.overrides,
                         "chain": [s.__dict__ for s in registry.chain(r.run_id)]} for r, v in views])
            return 0
    print_table(["RUN", "SITE", "WHERE", "JOB", "STATE", "CREATED", "RUN DIR", "REASON"],
                [[v.run_id, v.site, v.remote or "-", v.job_id or "-", v.state, r.created[:19], v.run_dir, v.reason]
                 for r, v in views])
    return 0
