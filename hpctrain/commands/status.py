"""``hpctrain status [RUN...] [--json] [--watch]``: poll runs (one call per site and login node) and show them.

Without RUN it shows the active runs (or the newest few when none is active). ``--watch`` redraws a table,
polling every 2 s at first and backing off to 30 s while nothing changes.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

RECENT = 10
FIRST_POLL_S, MAX_POLL_S = 2.0, 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("status", help="state and progress of runs")
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run ids or unique prefixes (default: active runs)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--watch", action="store_true", help="redraw until every run shown has ended")
    parser.add_argument("--ssh-config", default=None, metavar="FILE",
                        help="ssh client config for remote runs (default: the one given at submit)")
    parser.set_defaults(handler=cmd_status)


def _select(registry: Any, refs: list[str]) -> list[Any]:
    if refs:
        return [registry.get_run(r) for r in refs]
    active = registry.list_runs(active_only=True)
    return active or registry.list_runs()[:RECENT]


def rows_of(views: list[Any]) -> list[list[str]]:
    rows = []
    for v in views:
        detail = v.poll_error or v.reason
        progress = v.progress.text() if v.progress else ""
        rows.append([v.run_id, v.site + (f"@{v.remote}" if v.remote else ""), v.job_id or "-", v.state.upper(),
                     progress, detail])
    return rows


HEADERS = ["RUN", "SITE", "JOB", "STATE", "PROGRESS", "REASON"]


def _rich_table(views: list[Any]) -> Any:
    from rich.table import Table

    table = Table(*HEADERS, title=f"hpctrain runs at {time.strftime('%H:%M:%S')}")
    for row in rows_of(views):
        table.add_row(*row)
    return table


def cmd_status(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.submission.registry import Registry
    from hpctrain.submission.tracking import TransportPool, is_terminal, poll_runs

    pool = TransportPool()
    with Registry() as registry:
        def poll() -> list[Any]:
            runs = [registry.get_run(r.run_id) for r in selected]
            return poll_runs(registry, runs, pool, ssh_config=args.ssh_config)

        selected = _select(registry, args.runs)
        views = poll()
        if not args.watch:
            if args.json:
                print_json([v.as_dict() for v in views])
            elif views:
                print_table(HEADERS, rows_of(views))
            else:
                print("no runs in the registry", file=sys.stderr)
            return 1 if any(v.poll_error for v in views) else 0
        return _watch(views, poll, is_terminal, print_table)


def _watch(views: list[Any], poll: Any, is_terminal: Any, print_table: Any) -> int:
    delay = FIRST_POLL_S
    try:
        from rich.live import Live
    except ImportError:  # plain reprint
        Live = None  # noqa: N806
    def done(vs: list[Any]) -> bool:
        return all(is_terminal(v.state) for v in vs)
    if Live is not None:
        with Live(_rich_table(views), refresh_per_second=2) as live:
            while not done(views):
                time.sleep(delay)
                new = poll()
                delay = FIRST_POLL_S if [v.state for v in new] != [v.state for v in views] else \
                    min(delay * 1.5, MAX_POLL_S)
                views = new
                live.update(_rich_table(views))
        return 0
    print_table(HEADERS, rows_of(views))
    while not done(views):
        time.sleep(delay)
        new = poll()
        delay = FIRST_POLL_S if [v.state for v in new] != [v.state for v in views] else min(delay * 1.5, MAX_POLL_S)
        views = new
        print()
        print_table(HEADERS, rows_of(views))
    return 0
