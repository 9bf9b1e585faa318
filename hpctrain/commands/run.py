"""``hpctrain run SPEC``: the runtime entry started on every rank by the launcher inside an allocation."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="train a job spec on the ranks the launcher started")
    parser.add_argument("spec", help="job spec (the resolved job.yaml of a run directory, or any spec)")
    parser.add_argument("--run-dir", default=None, help="where metrics and checkpoints go (default: ./runs/NAME)")
    parser.add_argument("--backend", default=os.environ.get("HPCTRAIN_COMM_BACKEND", "auto"),
                        choices=["auto", "mpi", "gloo", "nccl", "xccl", "none"],
                        help="communication backend (default: $HPCTRAIN_COMM_BACKEND set by the rendered script)")
    parser.add_argument("--check-sync", type=int, default=0, metavar="N",
                        help="every N steps check that all ranks hold identical parameters")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(handler=cmd_run)


def _rank() -> str:
    from hpctrain.launch_env import rank_label

    return rank_label(os.environ)


def cmd_run(args: argparse.Namespace) -> int:
    import faulthandler
    import logging

    from hpctrain.checkpoint.signals import catch_early_signals, ignore_late_signals
    from hpctrain.config.job import load_job
    from hpctrain.errors import HpctrainError
    from hpctrain.exit_codes import EXIT_REQUEUE

    # A rank that dies in native code (SIGSEGV, SIGBUS, SIGABRT from std::terminate) prints every thread's
    # Python stack first: on one of 2048 ranks, the launcher's "signal 11" alone says nothing of where.
    faulthandler.enable(all_threads=True)
    catch_early_signals(os.environ.get("HPCTRAIN_STOP_SIGNAL", "USR2"))
    # hpctrain's local launcher prefixes every line with the rank already.
    prefix = "" if os.environ.get("HPCTRAIN_LAUNCHER") == "local" else f"[rank {_rank()}] "
    logging.basicConfig(level=logging.INFO, format=f"{prefix}%(levelname)s %(name)s: %(message)s")
    run_dir = Path(args.run_dir) if args.run_dir else None
    try:
        job = _with_staged_data(load_job(args.spec, sets=args.sets))
        run_dir = run_dir or Path("runs") / job.name
        _record_rank(run_dir)
        _preflight(job)
        from hpctrain.runtime.trainer import train

        outcome = train(job, run_dir, backend=args.backend, check_sync_every=args.check_sync)
        # Finished or stopped after its checkpoint: a walltime signal during the teardown must not kill the rank.
        ignore_late_signals(os.environ.get("HPCTRAIN_STOP_SIGNAL", "USR2"))
        _write_counters(run_dir)
    except HpctrainError as exc:
        line = _failure_line(exc)
        received = hasattr(exc, "origin")  # another rank's error, which this rank stops with (RankFailure)
        print(f"hpctrain: error: rank {_rank()}: stopped with {line}" if received else f"hpctrain: error: {line}",
              file=sys.stderr, flush=True)
        _note_failure(run_dir, line, peer=False)
        _abort_others(exc.exit_code)
        return exc.exit_code
    except Exception as exc:  # a bug or a library failure on one rank must not leave the others waiting
        import traceback

        traceback.print_exc()
        line = _failure_line(exc)
        peer = _is_peer_failure(exc)
        tail = " (a consequence of another rank's failure: see that rank's error)" if peer else ""
        print(f"hpctrain: error: {line}{tail}", file=sys.stderr, flush=True)
        _note_failure(run_dir, line, peer=peer)
        _abort_others(1)
        return 1
    if outcome.stopped_by_signal:
        print(f"hpctrain: rank {_rank()}: stopped at step {outcome.end_step} after a checkpoint "
              f"(walltime/preemption signal); exit {EXIT_REQUEUE} asks for a requeue", file=sys.stderr)
        return EXIT_REQUEUE
    if _rank() == "0":
        print(f"hpctrain: training finished at step {outcome.end_step}; parameter checksum "
              f"{outcome.parameters_checksum:.10e}", file=sys.stderr)
    return 0


def _record_rank(run_dir: Path) -> None:
    """MPI launchers report a dead process by pid: this rank's pid goes to its node's list in the run directory
    (runtime/rank_list.py), or to the log where that cannot be written."""
    import socket

    from hpctrain.runtime.rank_list import record_rank

    try:
        record_rank(run_dir, os.environ)
    except OSError as exc:
        print(f"hpctrain: rank {_rank()} is pid {os.getpid()} on {socket.gethostname()} ({run_dir}/ranks: {exc})",
              file=sys.stderr, flush=True)


def _with_staged_data(job: JobSpec) -> JobSpec:
    """The job reading the input files the batch script copied to this node (``$HPCTRAIN_STAGED_DATA``); the run's
    job.yaml keeps the paths the user wrote."""
    from hpctrain.config.staging import rewrite_data, staged_data_from_env

    staged = staged_data_from_env(os.environ)
    if staged is None:
        return job
    files, root = staged
    return job.model_copy(update={"data": rewrite_data(job.data, files, root)})


def _preflight(job: JobSpec) -> None:
    """The laptop's checks again, on every rank before any data is read: a spec that skipped them (or data
    that moved since) fails here with the same message, not hours later."""
    from hpctrain.config.preflight import check_job
    from hpctrain.launch_env import detect_launch_env

    world = detect_launch_env(os.environ).size
    for warning in check_job(job, local_paths=True, at_start=True, world_size=world):
        if _rank() == "0":
            print(f"hpctrain: warning: {warning}", file=sys.stderr, flush=True)


def _write_counters(run_dir: Path) -> None:
    """This rank's file-open counts (runtime/counting/counters.py), work counts (runtime/counting/work_counts.py: input,
    messages, checkpoint files) and rendezvous store calls (runtime/counting/store_counts.py), when HPCTRAIN_COUNTERS
    turned counting on."""
    from hpctrain.runtime.counting import counters, store_counts, work_counts

    if counters.enabled():
        from hpctrain.launch_env import detect_launch_env

        env = detect_launch_env(os.environ)
        counters.write_record(run_dir, env.rank, env.size, **work_counts.sections(), **store_counts.sections())


def _failure_line(exc: BaseException) -> str:
    """"rank N: message" (an hpctrain error), "rank N failed: Type: message" (anything else); another rank's error
    received through the runtime's agreement (RankFailure) keeps that rank's line."""
    comm = sys.modules.get("hpctrain.runtime.comm.base")  # loaded (with torch) once the runtime has started
    if comm is not None:
        return str(comm.failure_text(_rank(), exc))
    from hpctrain.errors import HpctrainError

    if isinstance(exc, HpctrainError):
        return f"rank {_rank()}: {exc}"
    return f"rank {_rank()} failed: {type(exc).__name__}: {exc}"


def _is_peer_failure(exc: BaseException) -> bool:
    if "hpctrain.runtime.comm.base" not in sys.modules:
        return False
    from hpctrain.runtime.comm.base import is_peer_failure

    return is_peer_failure(exc)


def _note_failure(run_dir: Path | None, message: str, *, peer: bool) -> None:
    """Offer the run's failure note (submission/failure.py): what ``hpctrain status`` shows as the reason. A rank's
    own error outranks an error caused by another rank's failure, whichever is written first."""
    if run_dir is not None:
        from hpctrain.submission.failure import OWN, PEER, record_failure

        record_failure(run_dir, message, PEER if peer else OWN)


def _abort_others(code: int) -> None:
    """Under MPI, take the whole job down now rather than leave peers blocked in a collective."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(code)
