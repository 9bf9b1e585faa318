"""The batch script's node check: one launcher step runs ``hpctrain.nodes.check`` on every node of the allocation
at once, each node reports to this process on the first node over TCP, and the whole is timed out as one. Then
the training nodes are chosen (``hpctrain.nodes.select``), written one per line to ``training-nodes`` for the
launch, the results to ``node-check.json`` and each bad node to the run's blame file; with too few healthy nodes
the run's failure note names them and this exits with EXIT_RUNTIME before any rank starts.

``--reselect`` (after a launch failed, with spare nodes): the nodes blamed for this failure (a rank srun saw
killed, a node it lost) leave the training nodes and the spares take their places — exit 0, and the script
starts the ranks again from the last checkpoint in the same allocation; exit EXIT_REQUEUE when too few healthy
nodes are left (the script requeues the job around them), 1 when no node was blamed (the failure was the
program's: nothing to replace).

``python -m hpctrain.submission.launchers.node_check --run-dir DIR --nodes N --timeout S [--exclude NODE,...]
[--lost-nodes-log FILE --lost-nodes-pattern RE] -- STEP...`` (STEP: the launcher's argv running the check once per
node). Its cost: one process per node, one connection per node to the first node (a gather), whatever N is.
Plain standard library (it runs in the batch script).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.exit_codes import EXIT_REQUEUE, EXIT_RUNTIME
from hpctrain.files import write_atomic
from hpctrain.job_environment import job_environments
from hpctrain.launch_env import job_id_of, restarts_of
from hpctrain.nodes.blame import Blame, append_blames, nodes_to_leave_out, read_blames
from hpctrain.nodes.check import ADDRESS_ENV, MAX_LINE, RESULTS_FILE, short_name
from hpctrain.nodes.select import TRAINING_NODES_FILE, Selection, select_nodes
from hpctrain.submission.failure import NOTE_FILES, OWN, record_failure

MAX_OFFSET_S = 5.0  # clocks further apart than this (beyond the round trip) make timestamps and timeouts lie


@dataclass
class Gathered:
    """What the nodes reported (by short name) and when the last report came."""

    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    connections: int = 0  # counted where they happen: what the check costs the first node as N grows
    received: int = 0
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    all_in: threading.Event = field(default_factory=threading.Event)


def _serve_one(conn: socket.socket, gathered: Gathered, expected: set[str], deadline: float) -> None:
    received = sent = 0
    try:
        conn.settimeout(max(deadline - time.monotonic(), 0.1))
        reader = conn.makefile("rb")
        hello = json.loads(reader.readline(MAX_LINE))
        received += 1
        conn.sendall(json.dumps({"t1": time.time()}).encode() + b"\n")
        sent += 1
        report = json.loads(reader.readline(MAX_LINE))
        received += 1
        if not isinstance(report, dict) or not isinstance(hello, dict):
            return
        node = short_name(str(report.get("node", hello.get("node", ""))))
        conn.sendall(b'{"ok": true}\n')
        sent += 1
        with gathered.lock:
            gathered.reports[node] = report
            if expected <= set(gathered.reports):
                gathered.all_in.set()
    except (OSError, ValueError):
        pass  # a node whose report did not arrive whole is named missing
    finally:
        conn.close()
        with gathered.lock:
            gathered.connections, gathered.received, gathered.sent = (
                gathered.connections + 1, gathered.received + received, gathered.sent + sent)


def gather(server: socket.socket, expected: set[str], deadline: float) -> Gathered:
    """Accept reports until every expected node reported or ``deadline`` (monotonic) passed."""
    gathered = Gathered()
    server.settimeout(0.2)

    def accept_loop() -> None:
        while not gathered.all_in.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_serve_one, args=(conn, gathered, expected, deadline), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    gathered.all_in.wait(max(deadline - time.monotonic(), 0))
    thread.join(1.0)
    return gathered


def judge(allocation: Sequence[str], reports: dict[str, dict[str, Any]], timeout_s: float,
          first_node: str) -> dict[str, str]:
    """node -> its problems, for every node that reported one, did not report, or whose clock is off."""
    failed: dict[str, str] = {}
    for node in allocation:
        report = reports.get(short_name(node))
        if report is None:
            failed[node] = (f"no report within {timeout_s:.0f} s (the node, its link to {first_node} or its "
                            "interpreter is down or hung)")
            continue
        problems = [str(p) for p in report.get("problems", [])]
        offset, trip = report.get("offset_s"), report.get("round_trip_s")
        if isinstance(offset, int | float) and isinstance(trip, int | float) and abs(offset) - trip / 2 > MAX_OFFSET_S:
            problems.append(f"its clock is {offset:+.1f} s off {first_node}'s")
        if problems:
            failed[node] = "; ".join(problems)
    return failed


def lost_nodes(log: str, pattern: str) -> list[str]:
    """Nodes the launcher said were lost in the job's log (earlier attempts'), first seen first."""
    try:
        with open(log, "rb") as f:
            f.seek(max(os.fstat(f.fileno()).st_size - (4 << 20), 0))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return list(dict.fromkeys(re.findall(pattern, text)))


def _stop(step: subprocess.Popen[bytes], wait_s: float) -> None:
    if step.poll() is not None:
        return
    try:
        step.wait(wait_s)
        return
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            step.send_signal(sig)
            step.wait(grace)
            return
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue


def _avoid(run_dir: Path, excluded: Sequence[str], lost: Sequence[str], job: str, restart: int) -> dict[str, str]:
    """Nodes not to train on where others can: blamed earlier in this run, excluded by a person, lost before."""
    blames = read_blames(run_dir)
    known = {b.node for b in blames}
    new = [Blame(node=n, cause="the scheduler lost it under the job (a node failure)", source="scheduler", job=job,
                 restart=max(restart - 1, 0)) for n in lost if n not in known]
    append_blames(run_dir, new)
    avoid = {n: f"blamed earlier in this run ({b.source}: {b.cause})"
             for n, b in nodes_to_leave_out([*blames, *new], spares=True).items()}
    avoid.update({n: "excluded when the run was resumed" for n in excluded})
    return avoid


def _summary(selection: Selection, allocation: Sequence[str], elapsed: float) -> list[str]:
    lines = [f"hpctrain: node check of {len(allocation)} node{'s' if len(allocation) != 1 else ''} in {elapsed:.1f} s: "
             f"training on {len(selection.training)}"
             + (f", {len(selection.spares)} spare" if selection.spares else "")]
    lines += [f"hpctrain: node check: {node} left out: {why}" for node, why in selection.left_out.items()]
    lines += [f"hpctrain: node check: {node} trains although {why} (no other node to take its place)"
              for node, why in selection.kept_despite.items()]
    return lines


def failure_text(selection: Selection, failed: dict[str, str]) -> str:
    """One line: the bad nodes with their reasons, how many healthy of how many needed, what to do."""
    named = "; ".join(f"{node}: {why}" for node, why in failed.items())
    return (f"node check: {named} — {len(selection.training)} healthy node{'s' if len(selection.training) != 1 else ''}"
            f" for {selection.needed} needed, no training started; `hpctrain resume RUN` leaves the bad "
            "node out (or give resources.spare_nodes)")


def this_job() -> tuple[list[str], str, int]:
    """(the allocation's nodes, the job id, its restart count) from the job environment."""
    environ = os.environ
    envs = job_environments(environ)
    allocation = next((nodes for env in envs if (nodes := env.nodes(environ))), None) or [socket.gethostname()]
    return allocation, job_id_of(environ), restarts_of(environ)


def reselect(args: argparse.Namespace) -> int:
    """After a failed launch: the training nodes without those blamed for it (see the module's docstring)."""
    run_dir = Path(args.run_dir)
    allocation, job, restart = this_job()
    try:
        previous = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
        training = (run_dir / TRAINING_NODES_FILE).read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        print("hpctrain: no node check of this attempt to start again from", file=sys.stderr, flush=True)
        return 1
    blames = read_blames(run_dir)
    known = {(b.node, b.job, b.restart) for b in blames}
    lost = lost_nodes(args.lost_nodes_log, args.lost_nodes_pattern) if args.lost_nodes_log else []
    new = [Blame(node=n, cause="the scheduler lost it under the job (a node failure)", source="scheduler", job=job,
                 restart=restart) for n in lost if n in training and (n, job, restart) not in known]
    append_blames(run_dir, new)
    blames += new
    now = {b.node: b.cause for b in blames if b.kind == "failed" and (b.job, b.restart) == (job, restart)
           and b.source in ("launcher", "scheduler") and b.node in training}
    if not now:
        print("hpctrain: no node is blamed for the failure: not starting again", file=sys.stderr, flush=True)
        return 1
    failed = {**previous.get("failed", {}), **{n: f"blamed earlier in this run ({b.source}: {b.cause})"
                                                for n, b in nodes_to_leave_out(blames, spares=False).items()}}
    avoid = {n: f"blamed earlier in this run ({b.source}: {b.cause})"
             for n, b in nodes_to_leave_out(blames, spares=True).items() if n not in failed}
    avoid.update({n: "excluded when the run was resumed" for n in args.exclude.split(",") if n})
    selection = select_nodes(allocation, args.nodes, failed, avoid)
    named = ", ".join(f"{n} ({why})" for n, why in now.items())
    if not selection.enough:
        print(f"hpctrain: {named} failed and too few healthy nodes are left in the allocation: the job goes back "
              "in the queue without them", file=sys.stderr, flush=True)
        return EXIT_REQUEUE
    for name in NOTE_FILES:  # the relaunched ranks' failure, if any, is the run's next note
        (run_dir / name).unlink(missing_ok=True)
    write_atomic(run_dir / RESULTS_FILE, json.dumps({**previous, "training": list(selection.training),
                                                      "spares": list(selection.spares),
                                                      "left_out": selection.left_out}, indent=1) + "\n")
    write_atomic(run_dir / TRAINING_NODES_FILE, "".join(f"{n}\n" for n in selection.training))
    print(f"hpctrain: {named} failed: training again on {', '.join(selection.training)}", flush=True)
    return 0


def run_check(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    environ = os.environ
    allocation, job, restart = this_job()
    first_node = short_name(socket.gethostname())
    lost = lost_nodes(args.lost_nodes_log, args.lost_nodes_pattern) if args.lost_nodes_log else []
    avoid = _avoid(run_dir, [n for n in args.exclude.split(",") if n], lost, job, restart)

    start = time.monotonic()
    deadline = start + args.timeout
    server = socket.create_server(("", 0), backlog=min(len(allocation) + 16, 4096))
    port = server.getsockname()[1]
    step = subprocess.Popen(args.step, env={**environ, ADDRESS_ENV: f"{first_node}:{port}"},
                            stdin=subprocess.DEVNULL)
    try:
        gathered = gather(server, {short_name(n) for n in allocation}, deadline)
    finally:
        server.close()
        _stop(step, max(min(deadline - time.monotonic(), 10.0), 1.0))
    elapsed = time.monotonic() - start
    failed = judge(allocation, gathered.reports, args.timeout, first_node)
    selection = select_nodes(allocation, args.nodes, failed, avoid)
    append_blames(run_dir, [Blame(node=n, cause=why, source="check", job=job, restart=restart)
                            for n, why in failed.items()])
    results = {"job": job, "restart": restart, "elapsed_s": round(elapsed, 3), "allocation": list(allocation),
               "training": list(selection.training), "spares": list(selection.spares),
               "left_out": selection.left_out, "failed": failed, "reports": gathered.reports,
               "first_node": {"connections": gathered.connections, "messages_received": gathered.received,
                              "messages_sent": gathered.sent}}
    write_atomic(run_dir / RESULTS_FILE, json.dumps(results, indent=1) + "\n")
    for line in _summary(selection, allocation, elapsed):
        print(line, flush=True)
    if not selection.enough:
        text = failure_text(selection, failed or selection.left_out)
        record_failure(run_dir, text, OWN)
        print(f"hpctrain: {text}", file=sys.stderr, flush=True)
        return EXIT_RUNTIME
    write_atomic(run_dir / TRAINING_NODES_FILE, "".join(f"{n}\n" for n in selection.training))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.launchers.node_check", description=__doc__)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--nodes", type=int, required=True, help="nodes the job trains on")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole check")
    parser.add_argument("--exclude", default="", help="nodes not to train on where others can, comma-separated")
    parser.add_argument("--lost-nodes-log", default="", help="the job's log, where the launcher names lost nodes")
    parser.add_argument("--lost-nodes-pattern", default=r"Node failure on (\S+)")
    parser.add_argument("--reselect", action="store_true",
                        help="after a failed launch: leave out the nodes blamed for it (no check step)")
    parser.add_argument("step", nargs=argparse.REMAINDER, help="-- the launcher's argv running the check per node")
    args = parser.parse_args(argv)
    args.step = args.step[1:] if args.step[:1] == ["--"] else args.step
    if args.reselect:
        return reselect(args)
    if not args.step:
        parser.error("give the check step after --")
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
