"""``hpctrain status [RUN...] [--json] [--watch]``: poll runs (one call per site and login node) and show them.

Without RUN it shows the active runs (or the newest few when none is active). Under the table, a line per run
that blamed nodes names the nodes its next attempt leaves out (and those it keeps: slow ones without spare nodes);
a running run's reason names its stragglers as they appear. ``--watch`` redraws a table,
polling every 2 s at first and backing off to 30 s while nothing changes; when its output is not a terminal
it prints a plain table each time something changed. The exit status is 0, or the code of the first cause
that kept a run from being polled (3 scheduler, 4 login node unreachable; see docs/submitting.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

RECENT = 10
FIRST_POLL_S, MAX_POLL_S = 2.0, 30.0
HEADERS = ["RUN", "SITE", "JOB", "STATE", "PROGRESS", "REASON"]


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


def node_lines(views: list[Any]) -> list[str]:
    """``RUN: excluded nodes: node03 (rank 2: killed by SIGKILL), ...`` per run that blamed nodes, and the blamed
    nodes the next attempt keeps (slow ones where no spare node can take their place)."""
    from hpctrain.submission.blamed_nodes import blame_words, nodes_text
    from hpctrain.text import printable

    lines = []
    for v in views:
        if v.left_out:
            lines.append(printable(f"{v.run_id}: excluded nodes: {nodes_text(v.left_out)}"))
        kept = {b.node: blame_words(b) for b in v.blamed if b.node not in v.left_out}
        if kept:
            lines.append(printable(f"{v.run_id}: blamed but not excluded (no spare node to take their place; "
                                   f"set resources.spare_nodes): {nodes_text(kept)}"))
    return lines


def exit_status(views: list[Any]) -> int:
    """0, or the exit code of a poll error (the highest: an unreachable host over a scheduler failure)."""
    return max((v.poll_error_code or 1 for v in views if v.poll_error), default=0)


def _rich_table(views: list[Any]) -> Any:
    from rich.table import Table

    rows = rows_of(views)
    table = Table(title=f"hpctrain runs at {time.strftime('%H:%M:%S')}")
    for i, header in enumerate(HEADERS):
        # Ids are never cut or wrapped (they are what the next command needs); the reason wraps instead.
        if header in ("RUN", "JOB", "STATE"):
            width = max([len(header)] + [len(r[i]) for r in rows])
            table.add_column(header, no_wrap=True, min_width=width)
        else:
            table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def cmd_status(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.tracking import poll_runs
    from hpctrain.submission.transport import TransportPool

    pool = TransportPool()
    with RunRegistry() as registry:
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
                for line in node_lines(views):
                    print(line)
            else:
                print("no runs in the registry", file=sys.stderr)
            return exit_status(views)
        if sys.stdout.isatty():
            return _watch_live(views, poll)
        return _watch_plain(views, poll, lambda vs: print_table(HEADERS, rows_of(vs)))


def _done(views: list[Any]) -> bool:
    from hpctrain.submission.views import is_terminal

    return all(is_terminal(v.state) for v in views)


def _next_delay(delay: float, old: list[Any], new: list[Any]) -> float:
    """Poll soon again after a state changed, else back off (progress alone does not count)."""
    changed = [(v.state, v.reason) for v in new] != [(v.state, v.reason) for v in old]
    return FIRST_POLL_S if changed else min(delay * 1.5, MAX_POLL_S)


def _watch_live(views: list[Any], poll: Callable[[], list[Any]]) -> int:
    from rich.live import Live

    delay = FIRST_POLL_S
    with Live(_rich_table(views), refresh_per_second=2) as live:
        while not _done(views):
            time.sleep(delay)
            new = poll()
            delay, views = _next_delay(delay, views, new), new
            live.update(_rich_table(views))
    return exit_status(views)


def _watch_plain(views: list[Any], poll: Callable[[], list[Any]], show: Callable[[list[Any]], None]) -> int:
    """Not a terminal (a pipe, a log file): a plain table now and after every change, nothing in between."""
    show(views)
    sys.stdout.flush()
    delay = FIRST_POLL_S
    while not _done(views):
        time.sleep(delay)
        new = poll()
        changed = rows_of(new) != rows_of(views)
        delay, views = _next_delay(delay, views, new), new
        if changed:
            print()
            show(views)
            sys.stdout.flush()
    return exit_status(views)
