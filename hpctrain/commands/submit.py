"""``hpctrain submit JOB --site SITE [--remote USER@HOST]``: register, stage and submit a run; print its ids."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.commands.common_args import add_job_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("submit", help="submit a job to a site (here, over ssh, or local)")
    add_job_arguments(parser)
    parser.add_argument("--remote", default=None, metavar="USER@HOST",
                        help="submit over ssh to this login node (one ControlMaster connection)")
    parser.add_argument("--ssh-config", default=None, metavar="FILE", help="ssh client config (ssh -F FILE)")
    parser.add_argument("--run-root", default=None, metavar="DIR",
                        help="where run directories go (default: the site's remote_root, else $HPCTRAIN_RUNS "
                             "or ./runs)")
    parser.add_argument("--array", default=None, metavar="KEY=V1,V2,...",
                        help="one array job, one run per value of KEY (e.g. train.lr=1e-3,3e-3)")
    parser.add_argument("--after", default=None, metavar="RUN[:afterok|afterany]",
                        help="start only after RUN's current job ends (afterok by default)")
    parser.add_argument("--dry-run", action="store_true",
                        help="render and check the script (sbatch --test-only where available); submit nothing "
                             "(the files go to dry-run/ beside the run registry)")
    parser.add_argument("--wait", action="store_true",
                        help="wait until the run ends; exit 0 if it completed, 5 if it did not")
    # Replaces the rank command (`python -m hpctrain run ...`); for tests and quick experiments.
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(handler=cmd_submit)


def cmd_submit(args: argparse.Namespace) -> int:
    from hpctrain.exit_codes import EXIT_OK, EXIT_RUNTIME
    from hpctrain.submission.api import RunHandle, shell_command, submit_runs
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.transport import TransportPool

    pool = TransportPool()
    with RunRegistry() as registry:
        done = submit_runs(
            args.job, args.site, remote=args.remote, ssh_config=args.ssh_config, sets=args.sets,
            nodes=args.nodes, walltime=args.walltime, queue=args.queue, array=args.array, after=args.after,
            run_root=args.run_root, dry_run=args.dry_run,
            command=shell_command(args.command) if args.command else None, registry=registry, pool=pool)
    if done.excluded:
        from hpctrain.submission.blamed_nodes import nodes_text
        from hpctrain.text import printable

        site = done.runs[0].site if done.runs else args.site
        print(printable(f"leaving out nodes remembered as bad on site {site}: {nodes_text(done.excluded)} "
                        f"(`hpctrain sites forget-nodes {site}` lets them in again)"), file=sys.stderr)
    if done.dry_run:
        if done.message:
            print(done.message, file=sys.stderr)
        folder = Path(done.script_path).parent
        print(f"script: {done.script_path} (dry run: nothing submitted; the rendered script and spec are in "
              f"{folder}/, which `hpctrain runs --prune` clears)")
        return EXIT_OK
    for run, job_id in zip(done.runs, done.job_ids, strict=True):
        print(f"{run.run_id} {job_id}")
    if not args.wait:
        return EXIT_OK
    ok = True
    for run in done.runs:
        view = RunHandle(run.run_id, pool=pool).wait()
        print(f"{view.run_id} {view.state}" + (f" ({view.reason})" if view.reason else ""))
        ok = ok and view.state == "completed"
    return EXIT_OK if ok else EXIT_RUNTIME
