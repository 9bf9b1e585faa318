"""``hpctrain cancel RUN...``: cancel runs' current jobs (scancel, qdel, or the local controller).

A run whose job has already ended is reported as such and nothing is sent; that is not an error (exit 0):
after the command, none of the named runs is running.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cancel", help="cancel runs")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run id (or a unique prefix)")
    parser.add_argument("--ssh-config", default=None, metavar="FILE", help=argparse.SUPPRESS)
    parser.set_defaults(handler=cmd_cancel)


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpctrain.submission.api import cancel_run
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.transport import TransportPool

    pool = TransportPool()
    with RunRegistry() as registry:
        for ref in args.runs:
            run = registry.get_run(ref)
            done = cancel_run(registry, run, pool)
            if done.sent:
                print(f"{run.run_id} cancelled job {done.job_id}")
            elif done.job_id is None:
                print(f"{run.run_id} had no job to cancel ({done.state})")
            else:
                print(f"{run.run_id} had already ended ({done.state}): nothing sent to job {done.job_id}")
    return 0
