"""Follow a run whose directory this process can read (the ``local`` site, or a shared file system) to its end.

Asking the scheduler costs a process per poll (``local_controller status`` is a Python start-up: ~80 ms of CPU),
and on the machine that trains that CPU is taken from the ranks. So progress is read from the run's own
``metrics.jsonl`` every tick, and the scheduler is asked only when the batch script has appended to its exit
record (``EXIT_LOG``: the launcher ended), then every tick for a short while (the scheduler's record of the end
follows the exit record), and otherwise with back-off, so that an end without an exit record (a killed batch
script) is still seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpctrain.submission.schedulers.base import EXIT_LOG
from hpctrain.submission.tracking import METRICS_FILE, last_json_record
from hpctrain.submission.views import RunView, is_terminal, progress_from_record

TAIL_BYTES = 4096  # a metrics record is ~300 bytes: the tail holds the newest whole line


class PolledRun(Protocol):
    def status(self) -> RunView: ...


@dataclass(frozen=True)
class FollowPolicy:
    """When the scheduler is asked: after ``urgent_s`` of every tick once the exit record grew, else after
    ``first_poll_s``, growing by ``backoff`` up to ``max_poll_s``."""

    tick_s: float = 1.0
    urgent_s: float = 15.0
    first_poll_s: float = 2.0
    backoff: float = 1.5
    max_poll_s: float = 30.0


def newest_record(path: Path) -> dict[str, Any] | None:
    """The last whole JSON line of ``path`` (read from its tail), or None when there is none yet."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return last_json_record("\n".join(lines if size <= TAIL_BYTES else lines[1:]))  # the tail's first line may be cut


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def follow_run(run: PolledRun, total_steps: int | None, show: Callable[[str], None],
               policy: FollowPolicy | None = None, *, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> tuple[RunView, int]:
    """Wait for ``run`` to end, calling ``show`` with each new progress line; (its last view, scheduler polls)."""
    p = policy or FollowPolicy()
    view = run.status()
    polls = 1
    run_dir = Path(view.run_dir)
    exit_log = run_dir / EXIT_LOG
    exit_size = _size(exit_log)
    delay = p.first_poll_s
    next_poll = clock() + delay
    urgent_until = 0.0
    shown = ""
    while not is_terminal(view.state):
        sleep(p.tick_s)
        progress = progress_from_record(newest_record(run_dir / METRICS_FILE), total_steps)
        text = progress.text() if progress else ""
        if text and text != shown:
            shown = text
            show(text)
        now = clock()
        size = _size(exit_log)
        if size != exit_size:
            exit_size, urgent_until = size, now + p.urgent_s
        if now < urgent_until or now >= next_poll:
            view = run.status()
            polls += 1
            delay = min(delay * p.backoff, p.max_poll_s)
            next_poll = now + delay
    return view, polls
