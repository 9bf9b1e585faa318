"""``hpctrain report RUN [-o FILE] [--serve]``: one self-contained HTML page of a run (docs/report.md), or the same
page live on 127.0.0.1 until the run ends."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.text import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="an HTML report of a run (loss, speed, ranks, plan, checkpoints)")
    parser.add_argument("run", metavar="RUN", help="run id, a unique prefix, or a run directory")
    parser.add_argument("-o", "--out", default=None, metavar="FILE.html",
                        help="where to write it (default: report.html in the run directory, or in the copy of a "
                             "remote run's files)")
    parser.add_argument("--serve", action="store_true",
                        help="serve it live on 127.0.0.1 (a URL with a random token) until the run ends")
    parser.add_argument("--port", type=int, default=0, help="with --serve: the port (default: any free one)")
    parser.add_argument("--refresh", type=float, default=5.0, metavar="SECONDS",
                        help="with --serve: how often the page reloads and the report is rebuilt")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="DIR",
                        help="also look here for evaluation files (scores.json, *segmentation*.h5); repeatable")
    parser.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from hpctrain.commands.out_file import check_out_file
    from hpctrain.errors import ConfigError
    from hpctrain.report.build import build_report
    from hpctrain.report.source import open_source

    if not args.refresh > 0:
        raise ConfigError(f"--refresh {args.refresh}: expected seconds above 0", key="--refresh")
    out = check_out_file(args.out, "-o", "report.html") if args.out is not None else None
    source = open_source(args.run)
    extra = tuple(Path(p) for p in args.extra)
    if not args.serve:
        path, _ = build_report(source, out, extra_dirs=extra)
        print(printable(str(path)))
        return 0
    from hpctrain.report.serve import ReportServer

    try:
        server = ReportServer(source, port=args.port, refresh_s=args.refresh, extra_dirs=extra, out=out)
    except (OSError, OverflowError) as exc:
        raise ConfigError(f"cannot listen on 127.0.0.1:{args.port} ({exc})", key="--port",
                          hint="choose a free port from 1024 to 65535, or leave --port out for any free one") from None
    server.live.current()  # the first build: a file the report refuses ends the command before it serves
    if server.live.error is not None:
        server.httpd.server_close()
        raise server.live.error
    print(f"serving the live report of {printable(source.facts.title)} at {server.url}", flush=True)
    print("(127.0.0.1 only; it stops by itself when the run ends, or press Ctrl-C)", file=sys.stderr, flush=True)
    server.serve(written=lambda p: print(f"the run has ended; report written to {printable(str(p))}", flush=True))
    return 0
