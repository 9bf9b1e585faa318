"""Following a run on this machine (``submission.follow``): progress from the run's metrics file every tick, the
scheduler asked around the run's end and otherwise with back-off. The run here is a stand-in (a simulated clock
and a scheduler whose answer changes at a chosen time) because what is tested is *when* it is asked; the real
local site and its controller are followed end to end by tests/test_demo.py."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.submission.follow import FollowPolicy, follow_run, newest_record
from hpctrain.submission.schedulers.base import EXIT_LOG
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.views import RunView


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.events: list[tuple[float, object]] = []  # (time, callable) run once the clock passes it

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for when, action in list(self.events):
            if when <= self.now:
                self.events.remove((when, action))
                action()  # type: ignore[operator]

    def __call__(self) -> float:
        return self.now


class StandInRun:
    """A run whose scheduler says RUNNING until ``ends_at``, then ``final``; every status() is counted."""

    def __init__(self, run_dir: Path, clock: Clock, ends_at: float, final: JobState = JobState.COMPLETED) -> None:
        self.run_dir, self.clock, self.ends_at, self.final = run_dir, clock, ends_at, final
        self.asked_at: list[float] = []

    def status(self) -> RunView:
        self.asked_at.append(self.clock.now)
        state = self.final if self.clock.now >= self.ends_at else JobState.RUNNING
        return RunView("r1", "job", "local", None, "42", state.value, "", str(self.run_dir))


def write_step(run_dir: Path, step: int) -> None:
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"time": 0.0, "step": step, "loss": 1.0 / step, "per_rank_rate": 70.0}) + "\n")


def test_progress_every_tick_the_scheduler_rarely_and_the_end_at_once(tmp_path: Path) -> None:
    clock = Clock()
    for t in range(1, 300):
        clock.events.append((float(t), lambda t=t: write_step(tmp_path, 10 * t)))
    # the batch script appends its exit record at 300.5 s; the scheduler records the end 1.2 s later
    clock.events.append((300.5, lambda: (tmp_path / EXIT_LOG).write_text('{"event": "exit", "status": 0}\n')))
    run = StandInRun(tmp_path, clock, ends_at=301.7)
    shown: list[str] = []

    view, polls = follow_run(run, 3000, shown.append, clock=clock, sleep=clock.sleep)

    assert view.state == JobState.COMPLETED.value
    assert shown[0] == "step 10/3000  loss 0.1  70/s/rank" and shown[-1].startswith("step 2990/3000")
    assert len(shown) == 299  # every new step shown once
    assert polls == len(run.asked_at)
    # ~300 ticks while it ran: back-off to one poll per 30 s (1 + 14 here), not one per tick
    running = [t for t in run.asked_at if t < 300.5]
    assert len(running) <= 16
    assert max(b - a for a, b in zip(running, running[1:], strict=False)) <= FollowPolicy().max_poll_s + 1
    # once the exit record grew, asked every tick: the end is seen within a tick of the scheduler's record
    assert clock.now - run.ends_at <= FollowPolicy().tick_s


def test_an_end_without_an_exit_record_is_still_seen(tmp_path: Path) -> None:
    """A batch script killed before it wrote its exit record: the back-off poll finds the end."""
    clock = Clock()
    run = StandInRun(tmp_path, clock, ends_at=95.0, final=JobState.FAILED)
    view, _ = follow_run(run, None, lambda _: None, clock=clock, sleep=clock.sleep)
    assert view.state == JobState.FAILED.value
    assert run.ends_at <= clock.now <= run.ends_at + FollowPolicy().max_poll_s + FollowPolicy().tick_s


def test_a_requeue_goes_back_to_back_off(tmp_path: Path) -> None:
    """An exit record that is not the end (exit 75, requeued): every tick for ``urgent_s``, then back-off."""
    clock = Clock()
    clock.events.append((50.0, lambda: (tmp_path / EXIT_LOG).write_text('{"event": "exit", "status": 75}\n')))
    run = StandInRun(tmp_path, clock, ends_at=400.0)
    follow_run(run, None, lambda _: None, clock=clock, sleep=clock.sleep)
    urgent = [t for t in run.asked_at if 50.0 <= t <= 50.0 + FollowPolicy().urgent_s]
    later = [t for t in run.asked_at if 100.0 <= t < 400.0]
    assert len(urgent) >= FollowPolicy().urgent_s - 1
    assert len(later) <= 300 / FollowPolicy().max_poll_s + 2


def test_newest_record_reads_the_last_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert newest_record(path) is None  # not written yet
    path.write_text("")
    assert newest_record(path) is None
    for step in range(1, 200):  # larger than the tail that is read
        write_step(tmp_path, step)
    assert newest_record(path)["step"] == 199  # type: ignore[index]
    with path.open("a") as f:
        f.write('{"time": 0.0, "step": 2')  # a line still being written
    assert newest_record(path)["step"] == 199  # type: ignore[index]
    path.write_text('{"step": 5}')  # one line, shorter than the tail: not mistaken for a cut one
    assert newest_record(path) == {"step": 5}
