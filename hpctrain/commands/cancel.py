"""``hpctrain cancel RUN...``: cancel runs' current jobs (scancel, qdel, or the local controller)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cancel", help="cancel runs")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run id (or a unique prefix)")
    parser.add_argument("--ssh-config", default=None, metavar="FILE", help=argparse.SUPPRESS)
    parser.set_defaults(handler=cmd_cancel)


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpctrain.submission.api import cancel_run
    from hpctrain.submission.registry import Registry
    from hpctrain.submission.tracking import TransportPool

    pool = TransportPool()
    with Registry() as registry:
        for ref in args.runs:
            run = registry.get_run(ref)
            job_id = cancel_run(registry, run, pool)
            print(f"{run.run_id} {'cancelled job ' + job_id if job_id else 'had no job to cancel'}")
    return 0
