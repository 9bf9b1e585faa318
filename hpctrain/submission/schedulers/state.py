"""One job-state enum shared by every scheduler back-end. Each back-end's module holds the plain table from its
scheduler's state codes to it (PSI/J layout), with the scheduler's documentation named as the source.
"""

from __future__ import annotations

import enum


class JobState(enum.Enum):
    """What hpctrain needs to know about a scheduler job; TIMEOUT is kept apart from FAILED."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    MISSING = "missing"  # the scheduler no longer knows the job

    @property
    def is_terminal(self) -> bool:
        """True when the job will not change state again by itself (MISSING counts: nothing left to poll)."""
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        """True while the job is queued, running or about to be requeued: worth polling again."""
        return not self.is_terminal


_TERMINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.CANCELLED,
        JobState.PREEMPTED,
        JobState.MISSING,
    }
)
