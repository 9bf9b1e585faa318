"""Every exit status hpctrain gives, defined once: the CLI's, by cause, and the runtime's requeue request.

The CLI exits with the ``exit_code`` of the error it caught (``hpctrain.errors`` maps each error class to
one of these); batch scripts, the local controller and the local launcher compare with ``EXIT_REQUEUE``.
docs/submitting.md ("Exit codes") holds ``markdown_table()``; tests/test_exit_codes.py keeps the two equal.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_SCHEDULER = 3
EXIT_TRANSPORT = 4
EXIT_RUNTIME = 5
EXIT_CHECKPOINT = 6
# EX_TEMPFAIL from sysexits.h: not a failure. Batch scripts requeue on it; the local controller re-runs.
EXIT_REQUEUE = 75
# Written into the run directory by rank 0 once every rank has agreed to stop and the checkpoint is committed,
# before any rank exits. Launchers end a job step when its first rank exits non-zero (srun --kill-on-bad-exit,
# MPICH's hydra, aprun), so ranks still exiting when the first one leaves with 75 are killed and the launcher
# reports 143 or 137; the batch script reads this file to know that the stop was a requeue all the same.
REQUEUE_MARKER = "stopped-for-requeue.json"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C

# (code, cause): the same cause gives the same code in every command.
MEANINGS: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success; also `cancel` of a run that had already ended (nothing is sent)"),
    (EXIT_ERROR, "an unexpected failure (a bug): the message says what happened"),
    (EXIT_CONFIG, "invalid input: a site profile, job spec, model argument, command-line value or dataset "
                  "(file, line and key named), a job that does not fit its site, or a RUN that names no run"),
    (EXIT_SCHEDULER, "the scheduler refused or failed (sbatch, qsub, the local controller), no status command "
                     "answered, or the run is still active where it must not be (`resume`)"),
    (EXIT_TRANSPORT, "the login node could not be reached or a command on it could not run: host unreachable "
                     "or unknown, authentication, a command missing there, disk full"),
    (EXIT_RUNTIME, "training failed on a rank (dead or stuck rank, non-finite loss, collective timeout), or a "
                   "batch script's staging failed on a node before the ranks started; `submit --wait`/`resume "
                   "--wait`: the run ended but did not complete"),
    (EXIT_CHECKPOINT, "no checkpoint to continue from (none, or the last one is the final step), or one could "
                      "not be read or written"),
    (EXIT_REQUEUE, "`hpctrain run` stopped at a checkpoint after the walltime/preemption signal and asks to be "
                   "requeued (batch scripts and the local controller act on it)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)


def markdown_table() -> str:
    """The table docs/submitting.md shows."""
    lines = ["| exit | cause |", "|---:|---|"]
    lines += [f"| {code} | {text} |" for code, text in MEANINGS]
    return "\n".join(lines) + "\n"
