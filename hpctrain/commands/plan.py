"""``hpctrain plan JOB --site SITE``: predicted step time, efficiency and time at N nodes, with what limits it.

The job's step profile comes from a run (``--from RUN``) or a short calibration run (``--calibrate``); the
network from the site profile; every other number is a named assumption, printed, and ``--set`` changes any.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from hpctrain.errors import ConfigError
from hpctrain.text import printable

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import SiteProfile
    from hpctrain.planning.measurements import Measurements
    from hpctrain.planning.model import Prediction

DEFAULT_MAX_NODES = 4096


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="predict a job's efficiency and time at N nodes")
    parser.add_argument("job", help="job spec (YAML file)")
    parser.add_argument("--site", default=None, help="site profile name or YAML path (default: local)")
    parser.add_argument("--nodes", default=None, metavar="N,N,...",
                        help="node counts to predict (default: 1, 2, 4, ... up to the machine's size)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--from", dest="from_run", default=None, metavar="RUN",
                        help="measurements of a run: a run id (local or remote) or a run directory")
    source.add_argument("--calibrate", action="store_true",
                        help="measure with a short one-node run in the site's smallest queue, then plan")
    parser.add_argument("--calibration-steps", type=int, default=None, metavar="N",
                        help="steps of the calibration run (default 30; the first 3 are not timed)")
    parser.add_argument("--remote", default=None, metavar="USER@HOST", help="submit the calibration run over ssh")
    parser.add_argument("--ssh-config", default=None, metavar="FILE", help="ssh client config (ssh -F FILE)")
    parser.add_argument("--run-root", default=None, metavar="DIR", help="where the calibration run's directory goes")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a planner parameter (e.g. latency_us=2.5; the table lists them) or, with a dot, "
                             "a job spec key (e.g. train.batch_per_rank=8); repeatable")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--samples", type=float, default=None, help="predict the time to train this many samples")
    target.add_argument("--steps", type=float, default=None, help="predict the time to train this many steps")
    parser.add_argument("--compare", nargs="?", const=True, default=None, metavar="RUN",
                        help="with --from: predict at the run's own nodes and ranks per node and print the prediction "
                             "next to what the run measured (or what RUN, another run of the job, measured)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="draw efficiency against nodes with the loss terms stacked")
    parser.set_defaults(handler=cmd_plan)


def parse_nodes(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4] (sorted, without repeats)."""
    try:
        nodes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"--nodes {text!r}: expected whole numbers separated by commas, e.g. 1,2,4,8") from None
    if not nodes:
        raise ConfigError("--nodes is empty", hint="e.g. --nodes 1,2,4,8")
    return nodes


MAX_TARGET = 1e18


def check_target(value: float | None, option: str) -> None:
    """A target of samples or steps is a finite count above 0."""
    if value is not None and not (0 < value <= MAX_TARGET):
        raise ConfigError(f"{option} {value!r}: expected a number above 0 and at most {MAX_TARGET:g}", key=option)


def default_nodes(limit: int | None) -> list[int]:
    top = min(limit or DEFAULT_MAX_NODES, DEFAULT_MAX_NODES)
    nodes, n = [], 1
    while n <= top:
        nodes.append(n)
        n *= 2
    return nodes


def queue_checked(prediction: Prediction, job: JobSpec, site: SiteProfile) -> Prediction:
    """The prediction with a warning where the job's queue would refuse the job at that node count."""
    from dataclasses import replace

    from hpctrain.config.queue_policy import refusal_text

    refusal = refusal_text(site, job.resources.queue or site.default_queue, prediction.nodes, job.resources.walltime)
    if refusal is None:
        return prediction
    return replace(prediction, warnings=[*prediction.warnings, f"the queue refuses this size: {refusal}"])


def _compare(args: argparse.Namespace, job: JobSpec, site: SiteProfile, measured: Measurements | None,
             planner_sets: list[str]) -> int:
    """``--compare``: the prediction at a run's scale next to that run's measurements."""
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.planning import compare
    from hpctrain.planning.inputs import plan_inputs
    from hpctrain.planning.model import predict
    from hpctrain.planning.runs import read_run

    if measured is None:
        raise ConfigError("--compare needs --from RUN: the run whose measurements the plan starts from",
                          hint="e.g. hpctrain plan JOB --from RUN --compare")
    run = measured if args.compare is True else read_run(str(args.compare))
    given = {s.partition("=")[0].strip() for s in planner_sets}
    scale = [] if "ranks_per_node" in given else [f"ranks_per_node={run.ranks_per_node}"]
    inputs = plan_inputs(job, args.job, site, measured, [*planner_sets, *scale])
    nodes = compare.run_nodes(run)
    prediction = predict(inputs.workload, nodes)
    rows = compare.compare(prediction, run)
    if args.json:
        print_json(compare.as_json(prediction, run, rows))
        return 0
    print(f"plan for {job.name} on {site.name} at the run's scale: {nodes} node{'s' * (nodes != 1)}, "
          f"{prediction.ranks} rank{'s' * (prediction.ranks != 1)} ({run.where})")
    print_table(["quantity", "predicted", "measured", "measured / predicted"], compare.table(rows))
    print("\nA ratio far from 1 on a real multi-node run is a site figure to correct: see docs/planning.md, "
          "\"Sending a site's numbers back\".")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from hpctrain.commands.output import print_json, print_table
    from hpctrain.config.job import load_job
    from hpctrain.config.site import load_site
    from hpctrain.planning import report
    from hpctrain.planning.advice import annotate
    from hpctrain.planning.inputs import check_before_measuring, check_nodes, plan_inputs
    from hpctrain.planning.model import predict

    check_target(args.samples, "--samples")
    check_target(args.steps, "--steps")
    job_sets = [s for s in args.sets if "." in s.partition("=")[0]]
    planner_sets = [s for s in args.sets if s not in job_sets]
    nodes = parse_nodes(args.nodes) if args.nodes is not None else None
    if args.calibration_steps is not None and args.calibration_steps < 5:
        raise ConfigError("--calibration-steps must be at least 5 (the first 3 steps are not timed)")
    job = load_job(args.job, sets=job_sets)
    site = load_site(args.site)
    if args.plot:
        from hpctrain.planning.plot import check_plot_path

        check_plot_path(args.plot)
    # what needs no measurement is refused before one is read or made (a calibration run waits in a queue)
    check_before_measuring(job, args.job, site, None if args.compare is not None else nodes, planner_sets)
    measured = None
    if args.from_run is not None:
        from hpctrain.planning.runs import read_run

        measured = read_run(args.from_run)
    elif args.calibrate:
        from hpctrain.planning.calibrate import CALIBRATION_STEPS, calibrate

        print(f"calibrating {job.name} on one node of {site.name} ...", file=sys.stderr)
        run_id, measured = calibrate(args.job, site, job_sets=job_sets,
                                     steps=args.calibration_steps or CALIBRATION_STEPS, remote=args.remote,
                                     ssh_config=args.ssh_config, run_root=args.run_root)
        print(f"calibration run: {run_id}", file=sys.stderr)
    if args.compare is not None:
        return _compare(args, job, site, measured, planner_sets)
    inputs = plan_inputs(job, args.job, site, measured, planner_sets)
    nodes = nodes or default_nodes(inputs.max_nodes)
    check_nodes(nodes, inputs.site_name, inputs.max_nodes)
    for note in inputs.notes:
        print(f"hpctrain: warning: {printable(note)}", file=sys.stderr)
    w = inputs.workload
    predictions = [annotate(w, predict(w, n, target_samples=args.samples, target_steps=args.steps),
                            inputs.lr_scaling, inputs.warmup_kind, inputs.model) for n in nodes]
    predictions = [queue_checked(p, job, site) for p in predictions]
    target = ({"samples": args.samples} if args.samples is not None else
              {"steps": args.steps} if args.steps is not None else None)
    if args.plot:
        from hpctrain.planning.plot import plot

        written = plot(predictions, args.plot, f"{job.name} on {site.name}")
        print(f"wrote {printable(str(written))}", file=sys.stderr)
    if args.json:
        print_json(report.as_json(inputs, predictions, target))
        return 0
    print(f"plan for {job.name} on {site.name}")
    print("\nparameters (assumptions first; change any with --set NAME=VALUE):")
    print_table(["name", "value", "source", "from"], report.parameter_rows(inputs))
    print("\npredictions (efficiency against one rank alone, start-up amortised over the walltime):")
    headers, rows = report.prediction_rows(predictions, inputs.sample_unit)
    print_table(headers, rows)
    print()
    for line in report.advice_lines(predictions):
        print(line)
    return 0
