"""``hpctrain render JOB --site SITE``: the batch script for a job on a site, checked before it is shown."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.commands.common_args import add_job_arguments, load_job_from_args
from hpctrain.text import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("render", help="render the batch script of a job for a site")
    add_job_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="run directory written into the script "
                        "(default: <remote_root or ./runs>/<job name>)")
    parser.add_argument("--python", default=None, help="interpreter on the compute nodes")
    parser.add_argument("-o", "--output", default=None, help="write the script to this file (atomically)")
    parser.set_defaults(handler=cmd_render)


def cmd_render(args: argparse.Namespace) -> int:
    from hpctrain.config.site import load_site
    from hpctrain.submission.render import render_script

    job = load_job_from_args(args)
    site = load_site(args.site)
    root = site.remote_root or str(Path("runs").resolve())
    run_dir = args.run_dir or f"{root}/{job.name}"
    rendered = render_script(job, site, run_dir=run_dir, spec_path=f"{run_dir}/job.yaml", python=args.python)
    if args.output:
        write_script(Path(args.output), rendered.text)
        print(f"wrote {printable(args.output)}", file=sys.stderr)
    else:
        sys.stdout.write(rendered.text)
    return 0


def write_script(out: Path, text: str) -> None:
    """Write an executable script atomically (temp file beside it, then rename); a clean error, and no
    temp file left behind, when ``out`` is a directory or cannot be written."""
    from hpctrain.commands.out_file import check_out_file, write_out_file

    check_out_file(out, "-o", "job.sh")
    write_out_file(out, text, "-o", "the script", mode=0o755)
