"""Every exit status hpctrain gives, defined once: the CLI's, by cause, and the runtime's requeue request.

The CLI exits with the ``exit_code`` of the error it caught (``hpctrain.errors`` maps each error class to
one of these); batch scripts, the local controller and the local launcher compare with ``EXIT_REQUEUE``.
docs/submitting.md ("Exit codes") prints this table.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1  # an unexpected failure (a bug): the message says what happened
EXIT_CONFIG = 2  # a site profile, job spec, command-line value or dataset is invalid (file, line, key named)
EXIT_SCHEDULER = 3  # the scheduler refused or failed (sbatch, qsub, qstat), or a run/job is unknown to it
EXIT_TRANSPORT = 4  # the login node could not be reached or a command on it could not run (ssh)
EXIT_RUNTIME = 5  # training failed on a rank (dead or stuck rank, non-finite loss, collective timeout)
EXIT_CHECKPOINT = 6  # no valid checkpoint could be read, or one could not be written
EXIT_INTERRUPTED = 130  # Ctrl-C
# `hpctrain run` stopped at a checkpoint after a walltime/preemption signal and asks to be requeued
# (EX_TEMPFAIL from sysexits.h): not a failure. Batch scripts requeue on it; the local controller re-runs.
EXIT_REQUEUE = 75
