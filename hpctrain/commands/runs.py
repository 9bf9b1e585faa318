"""``hpctrain runs [--site SITE] [--all] [--json]``: the run registry as a table (no scheduler calls).

States, reasons (failure notes, "restart 1 of 5") and progress are what the last poll recorded.
``--repair`` rebuilds a damaged registry (keeping a copy); ``--prune`` clears away runs that never ran.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hpctrain.text import printable, printable_lines

if TYPE_CHECKING:
    from hpctrain.submission.registry import RunRegistry

DEFAULT_LIMIT = 20


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list the runs in the registry")
    parser.add_argument("--site", default=None, help="only runs of this site")
    parser.add_argument("--all", action="store_true", help=f"every run, not only the newest {DEFAULT_LIMIT}")
    parser.add_argument("--json", action="store_true", help="print JSON")
    upkeep = parser.add_mutually_exclusive_group()
    upkeep.add_argument("--repair", action="store_true",
                        help="check the registry; if it is damaged, keep a copy and rebuild it from what can be read")
    upkeep.add_argument("--prune", action="store_true",
                        help="remove runs that never ran (created, submit_failed) and --dry-run folders older "
                             "than --older-than")
    parser.add_argument("--older-than", default=None, metavar="AGE",
                        help="with --prune: age like 12h, 7d (default) or 2w")
    parser.add_argument("--dry-run", action="store_true", help="with --prune: list what would go, remove nothing")
    parser.set_defaults(handler=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.views import view_of

    if args.repair:
        return _repair()
    if args.prune:
        return _prune(args)
    if args.older_than or args.dry_run:
        from hpctrain.errors import ConfigError

        raise ConfigError("--older-than and --dry-run go with --prune", hint="hpctrain runs --prune --dry-run")
    with RunRegistry(readonly=True) as registry:  # listing never writes, so it works on a read-only registry
        runs = registry.list_runs(site=args.site)
        if not args.all:
            runs = runs[:DEFAULT_LIMIT]
        views = [(run, view_of(registry, run)) for run in runs]
        if args.json:
            print_json([{**v.as_dict(), "created": r.created, "spec_hash": r.spec_hash,
                         "array_parent": r.array_parent, "array_index": r.array_index,
                         "overrides": r.overrides,
                         "chain": [s.__dict__ for s in registry.chain(r.run_id)]} for r, v in views])
            _warn_damaged(registry)
            return 0
        _warn_damaged(registry)
    print_table(["RUN", "SITE", "WHERE", "JOB", "STATE", "CREATED", "RUN DIR", "REASON"],
                [[v.run_id, v.site, v.remote or "-", v.job_id or "-", v.state, r.created[:19], v.run_dir, v.reason]
                 for r, v in views])
    return 0


def _warn_damaged(registry: RunRegistry) -> None:
    """Rows that could not be read were skipped: say so (on stderr), with the way to salvage them."""
    import sys

    for note in registry.damaged_rows:
        print(f"hpctrain: warning: {printable(note)}", file=sys.stderr)
    if registry.damaged_rows:
        print(f"hpctrain: the registry {registry.path} has damaged rows; `hpctrain runs --repair` keeps a copy "
              "of it and rebuilds it from what can be read", file=sys.stderr)


def _repair() -> int:
    from hpctrain.submission.registry import default_registry_path
    from hpctrain.submission.registry_repair import repair_registry

    print(printable_lines(repair_registry(default_registry_path()).summary()))
    return 0


def _prune(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_table
    from hpctrain.submission.housekeeping import DEFAULT_AGE, age_text, apply_prune, parse_age, plan_prune
    from hpctrain.submission.registry import RunRegistry

    age = parse_age(args.older_than or DEFAULT_AGE)
    with RunRegistry(readonly=args.dry_run) as registry:
        plan = plan_prune(registry, age)
        verb = "would remove" if args.dry_run else "removing"
        print(f"{verb} {len(plan.runs)} run(s) that never ran and {len(plan.folders)} folder(s), "
              f"older than {args.older_than or DEFAULT_AGE}")
        if plan.runs:
            print_table(["RUN", "SITE", "STATE", "AGE", "RUN DIR (left alone)"],
                        [[r.run_id, r.site, r.state, age_text(r.created), r.run_dir] for r in plan.runs])
        for folder in plan.folders:
            print(f"  {printable(str(folder))}")
        if args.dry_run:
            return 0
        problems = apply_prune(registry, plan)
    for problem in problems:
        print(f"hpctrain: warning: could not remove {printable(str(problem))}")
    return 1 if problems else 0
