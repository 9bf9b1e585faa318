"""Inside the job: run the submitit callable staged in the run directory on this rank and write its result.

``python -m hpctrain.submitit_plugin.runner`` starts once per rank in the run directory (the batch script's
launcher runs it). It needs cloudpickle and what the callable imports, never torch or submitit: submitit's
pickled ``DelayedSubmission`` loads into a stand-in class where submitit is not installed. On the checkpoint
signal a callable with ``checkpoint`` (``submitit.helpers.Checkpointable``) is checkpointed on rank 0, which
then tells the others (they wait for it); every rank exits 75, which the batch script turns into a requeue; past
``--max-requeues`` it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from hpctrain.errors import RuntimeFailure
from hpctrain.exit_codes import EXIT_ERROR, EXIT_REQUEUE, REQUEUE_MARKER
from hpctrain.files import write_atomic
from hpctrain.job_environment import job_environments
from hpctrain.launch_env import detect_launch_env, job_id_of, restarts_of

MODULE = "hpctrain.submitit_plugin.runner"
PAYLOAD_FILE = "submitted.pkl"
EXECUTOR_NAME = "hpctrain"  # SUBMITIT_EXECUTOR in the job: how submitit.JobEnvironment() finds ours
# The class of submitit's pickled submissions: the one submitit name a plain callable's pickle holds.
DELAYED_CLASS = ("submitit.core.utils", "DelayedSubmission")
# Rank 0's word to the other ranks after the checkpoint signal: the requeue marker (checkpoint written: exit 75)
# or this note (it was not: run on). They wait for it, since a rank that exits first makes the launcher end the
# others (srun --kill-on-bad-exit): rank 0 would be killed while it writes the checkpoint.
DECLINED_NOTE = "checkpoint-declined.json"
DECISION_WAIT_S = 300.0


def result_name(task: int) -> str:
    """The file, in the run directory, holding task ``task``'s ``(outcome, value)``."""
    return f"result-{task}.pkl"


def log_name(task: int, stream: str) -> str:
    """The file, in the run directory, that task ``task``'s stdout (``out``) or stderr (``err``) goes to."""
    return f"log-{task}.{stream}"


def array_task_of(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(array job id, index) of this task from its scheduler's job environment, None outside an array."""
    return next((task for env in job_environments(environ) if (task := env.array_task(environ))), None)


class DelayedCall:
    """Takes the place of submitit's DelayedSubmission where submitit is not installed: the same state."""

    function: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    _timeout_min: int = 0
    _timeout_countdown: int = 0


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except ImportError:
            if (module, name) == DELAYED_CLASS:
                return DelayedCall
            raise


def checkpoint_of(function: object) -> Any:
    """The callable's ``checkpoint`` as submitit finds it (``submitit.helpers.Checkpointable``, or any callable
    with a ``checkpoint`` method); None for a callable that cannot be checkpointed, so is never requeued."""
    return getattr(function, "__submitit_checkpoint__", None) or getattr(function, "checkpoint", None)


def load_submission(path: str | os.PathLike[str]) -> Any:
    """The pickled submission (``function``, ``args``, ``kwargs``) at ``path``."""
    with open(path, "rb") as f:
        return _Unpickler(f).load()


def _dumps(value: object) -> bytes:
    try:
        import cloudpickle
    except ImportError:  # a callable pickled by reference loads without it; its result may pickle without it
        return pickle.dumps(value)
    return cloudpickle.dumps(value)


def write_result(path: Path, outcome: str, value: object) -> None:
    """``(outcome, value)`` as submitit pickles results; an error's value is text (plain pickle suffices)."""
    data = _dumps((outcome, value)) if outcome == "success" else pickle.dumps((outcome, str(value)))
    write_atomic(path, data)


def say(text: str) -> None:
    print(f"hpctrain submitit runner: {text}", file=sys.stderr, flush=True)


class _Requeue(BaseException):
    """Unwinds the callable after a checkpoint (a BaseException: ``except Exception`` in it does not stop it)."""


def stop_for_requeue(run_dir: Path, rank: int) -> NoReturn:
    """Leave the callable to be requeued, from inside it (``JobEnvironment()._requeue``): every rank exits 75,
    rank 0 first writing the requeue marker that tells the batch script (and the other ranks) it was one."""
    if rank == 0:
        attempt = f"{job_id_of(os.environ)}/{restarts_of(os.environ)}"
        write_atomic(run_dir / REQUEUE_MARKER, json.dumps({"attempt": attempt}).encode())
    say(f"task {rank} asked for a requeue; exit {EXIT_REQUEUE} asks the batch script for one")
    raise _Requeue


class CheckpointSignal:
    """The handler of the checkpoint signal: rank 0 checkpoints the callable; every rank then exits 75.

    A callable without ``checkpoint`` (or one whose ``checkpoint`` returns None) runs on: it may still finish
    before the walltime. So does one already requeued ``max_requeues`` times: hpctrain's cap, not a loop.
    """

    def __init__(self, rank: int, max_requeues: int, payload: Path, *, attempt: str = "",
                 decision_wait_s: float = DECISION_WAIT_S) -> None:
        self.rank = rank
        self.max_requeues = max_requeues
        self.payload = payload
        self.attempt = attempt  # job id and restart count: a note of an earlier attempt is not this one's
        self.decision_wait_s = decision_wait_s
        self.submission: Any = None
        self.pending: int | None = None  # a signal that came before the callable was loaded
        self.stopped = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.submission is None:
            self.pending = signum
            return
        self.handle(signum)

    def handle(self, signum: int) -> None:
        if self.stopped:
            return
        name = signal.Signals(signum).name
        function = self.submission.function
        checkpoint = checkpoint_of(function)
        done = restarts_of(os.environ)
        if checkpoint is None:
            say(f"{name}: the callable has no checkpoint(); it runs on until the walltime")
            return
        if done >= self.max_requeues:
            say(f"{name}: requeued {done} time(s) already, max_requeues is {self.max_requeues}; "
                "not requeued again, the callable runs on until the walltime")
            return
        if self.rank == 0:
            requeue = self._checkpoint(checkpoint, name)
            self._tell_the_others(REQUEUE_MARKER if requeue else DECLINED_NOTE)
            if not requeue:
                return
        elif not self._wait_for_rank_0(name):
            return
        self.stopped = True
        say(f"{name}: stopped at a checkpoint; exit {EXIT_REQUEUE} asks the batch script for a requeue")
        raise _Requeue

    def _tell_the_others(self, note: str) -> None:
        try:
            write_atomic(self.payload.with_name(note), json.dumps({"attempt": self.attempt}).encode())
        except OSError as exc:
            say(f"cannot write {note} for the other ranks ({exc}); they wait {self.decision_wait_s:g} s, then run on")

    def _wait_for_rank_0(self, name: str) -> bool:
        """Whether rank 0 checkpointed (True: exit 75 with it) or not (False: run on), as its note says."""
        deadline = time.monotonic() + self.decision_wait_s
        while time.monotonic() < deadline:
            for note, requeue in ((REQUEUE_MARKER, True), (DECLINED_NOTE, False)):
                try:
                    said = json.loads(self.payload.with_name(note).read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(said, dict) and said.get("attempt") == self.attempt:
                    return requeue
            time.sleep(0.2)
        say(f"{name}: rank 0 said nothing about its checkpoint within {self.decision_wait_s:g} s; running on")
        return False

    def _checkpoint(self, checkpoint: Any, name: str) -> bool:
        """Call ``checkpoint`` as submitit does and store what it returns as the next submission."""
        current = self.submission
        try:
            following = checkpoint(*current.args, **current.kwargs)
            if following is None:
                say(f"{name}: checkpoint() returned None; not requeued, the callable runs on")
                return False
            following._timeout_min = getattr(current, "_timeout_min", 0)
            following._timeout_countdown = max(getattr(current, "_timeout_countdown", 0) - 1, 0)
            write_atomic(self.payload, _dumps(following))
        except Exception:
            say(f"{name}: checkpoint failed, not requeued:\n{traceback.format_exc()}")
            return False
        return True


def _redirect(run_dir: Path, task: int, merge: bool) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, children too) to the task's logs."""
    sys.stdout.flush()
    sys.stderr.flush()
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out = os.open(run_dir / log_name(task, "out"), flags, 0o644)
    err = out if merge else os.open(run_dir / log_name(task, "err"), flags, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def _load_failure(exc: BaseException) -> str:
    where = f"{sys.executable} on {socket.gethostname()}"
    text = f"cannot load the submitted callable ({PAYLOAD_FILE}) with {where}: {type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        text += (f"; install {exc.name.split('.')[0]} in that Python, or have the laptop pickle the module by value "
                 "(cloudpickle.register_pickle_by_value)")
    return text


def run(run_dir: Path, *, max_requeues: int, signal_name: str, merge_logs: bool,
        sys_path: Sequence[str] = ()) -> int:
    """Run the staged callable as this rank; the exit status (0, 1 for an error, 75 after a checkpoint).

    ``sys_path``: directories put first on ``sys.path`` before the callable is loaded (the submitting script's
    directory, as a submitit job started in it would have).
    """
    sys.path[0:0] = list(sys_path)
    try:
        rank = detect_launch_env(os.environ).rank
    except RuntimeFailure as exc:
        say(str(exc))
        return EXIT_ERROR
    payload = run_dir / PAYLOAD_FILE
    attempt = f"{job_id_of(os.environ)}/{restarts_of(os.environ)}"
    if rank == 0:  # an earlier attempt's note (the batch script removes the requeue marker itself)
        (run_dir / DECLINED_NOTE).unlink(missing_ok=True)
    stopper = CheckpointSignal(rank, max_requeues, payload, attempt=attempt)
    sig = getattr(signal, f"SIG{signal_name}")
    signal.signal(sig, stopper)  # first: the batch script forwards the walltime signal whenever it comes
    _redirect(run_dir, rank, merge_logs)
    os.environ.update(SUBMITIT_EXECUTOR=EXECUTOR_NAME, SUBMITIT_FOLDER=str(run_dir))
    say(f"task {rank}, job {job_id_of(os.environ)} (restart {restarts_of(os.environ)}), on {socket.gethostname()} "
        f"with {sys.executable}")
    result = run_dir / result_name(rank)
    try:
        try:
            submission = load_submission(payload)
        except Exception as exc:
            write_result(result, "error", _load_failure(exc))
            say(_load_failure(exc))
            return EXIT_ERROR
        stopper.submission = submission
        try:
            if stopper.pending is not None:
                stopper.handle(stopper.pending)
            value = submission.function(*submission.args, **submission.kwargs)
        finally:
            signal.signal(sig, signal.SIG_IGN)
    except _Requeue:
        return EXIT_REQUEUE
    except BaseException:  # SystemExit and KeyboardInterrupt in the callable are its outcome too
        write_result(result, "error", traceback.format_exc())
        say("the callable raised; the traceback is its result")
        return EXIT_ERROR
    try:
        write_result(result, "success", value)
    except Exception:
        write_result(result, "error", f"the callable returned, but its result cannot be pickled:\n"
                                      f"{traceback.format_exc()}")
        return EXIT_ERROR
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--max-requeues", type=int, default=0, help="requeues after a checkpoint at most")
    parser.add_argument("--signal", default="USR2", help="the checkpoint signal's name, without SIG")
    parser.add_argument("--stderr-to-stdout", action="store_true", help="one log per task")
    parser.add_argument("--sys-path", action="append", default=[], metavar="DIR",
                        help="a directory to put first on sys.path before the callable is loaded (repeatable)")
    args = parser.parse_args(argv)
    return run(Path.cwd(), max_requeues=args.max_requeues, signal_name=args.signal,
               merge_logs=args.stderr_to_stdout, sys_path=args.sys_path)


if __name__ == "__main__":
    # Run as the imported module rather than as __main__: the job environment's _requeue, called in the callable,
    # raises the imported module's _Requeue, which main must be the one to catch.
    from hpctrain.submitit_plugin import runner

    sys.exit(runner.main())
