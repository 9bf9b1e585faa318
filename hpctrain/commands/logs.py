"""``hpctrain logs RUN [--follow] [--rank N]``: print a run's scheduler output (or rank N's log)."""

from __future__ import annotations

import argparse
import sys
import time

from hpctrain.config.numbers import flag_int

FOLLOW_FIRST_S, FOLLOW_MAX_S = 1.0, 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("logs", help="print a run's output")
    parser.add_argument("run", metavar="RUN", help="run id or a unique prefix")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    parser.add_argument("--rank", type=flag_int, default=None, help="rank N's own log (rank-N.log) when written")
    parser.set_defaults(handler=cmd_logs)


def cmd_logs(args: argparse.Namespace) -> int:
    from hpctrain.submission.api import read_log
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.tracking import poll_runs
    from hpctrain.submission.transport import TransportPool
    from hpctrain.submission.views import is_terminal

    pool = TransportPool()
    # Without --follow nothing is polled, so nothing is written: a read-only registry (file system) will do.
    with RunRegistry(readonly=not args.follow) as registry:
        run = registry.get_run(args.run)
        offset = 0
        delay = FOLLOW_FIRST_S
        while True:
            # The state is read before the log so that the last chunk after the end is not lost.
            ended = is_terminal(run.state) if not args.follow else \
                is_terminal(poll_runs(registry, [run], pool, progress=False)[0].state)
            text = read_log(registry, run, pool, rank=args.rank, offset=offset)
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
                offset += len(text.encode("utf-8", errors="replace"))
            if not args.follow or ended:
                return 0
            delay = FOLLOW_FIRST_S if text else min(delay * 1.5, FOLLOW_MAX_S)
            time.sleep(delay)
            run = registry.get_run(run.run_id)
