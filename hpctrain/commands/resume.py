"""``hpctrain resume RUN [--nodes N] [--walltime T] [--queue Q] [--exclude NODE ...] [--include NODE ...]``: continue
a stopped run from its checkpoint, off the nodes it blamed (and those remembered as bad on its site)."""

from __future__ import annotations

import argparse

from hpctrain.config.numbers import flag_int


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("resume", help="continue a stopped run from its newest checkpoint")
    parser.add_argument("run", metavar="RUN", help="run id or unique prefix")
    parser.add_argument("--nodes", type=flag_int, default=None,
                        help="run on this many nodes (same or fewer; fewer is an elastic restart, not bit-exact)")
    parser.add_argument("--walltime", default=None, help="walltime of the continuation (HH:MM:SS)")
    parser.add_argument("--queue", default=None, help="queue of the continuation")
    parser.add_argument("--ssh-config", default=None, metavar="FILE",
                        help="ssh client config for a remote run (default: the one given at submit)")
    parser.add_argument("--exclude", action="append", default=[], metavar="NODE",
                        help="keep the continuation off this node too (repeatable)")
    parser.add_argument("--include", action="append", default=[], metavar="NODE",
                        help="let the continuation use this node although the run (or the site) blamed it "
                             "(repeatable)")
    parser.add_argument("--wait", action="store_true",
                        help="wait until the run ends; exit 0 if it completed, 5 if it did not")
    parser.set_defaults(handler=cmd_resume)


def cmd_resume(args: argparse.Namespace) -> int:
    import sys

    from hpctrain.exit_codes import EXIT_OK, EXIT_RUNTIME
    from hpctrain.submission.api import RunHandle
    from hpctrain.submission.blamed_nodes import nodes_text
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.resume import resume_run
    from hpctrain.submission.transport import TransportPool
    from hpctrain.text import printable

    pool = TransportPool()
    with RunRegistry() as registry:
        done = resume_run(registry, args.run, nodes=args.nodes, walltime=args.walltime, queue=args.queue,
                          ssh_config=args.ssh_config, pool=pool, exclude=args.exclude, include=args.include)
    if done.excluded:
        print(printable(f"excluding nodes: {nodes_text(done.excluded)}"), file=sys.stderr)
    print(f"{done.run.run_id} {done.job_id} (continues from step {done.from_step} of {done.total_steps})")
    if not args.wait:
        return EXIT_OK
    view = RunHandle(done.run.run_id, pool=pool).wait()
    print(f"{view.run_id} {view.state}" + (f" ({view.reason})" if view.reason else ""))
    return EXIT_OK if view.state == "completed" else EXIT_RUNTIME
