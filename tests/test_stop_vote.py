"""How often the ranks vote on a stop (``checkpoint.stop_check_every``): the vote is a collective, so every rank
must skip the same steps; a signal raised between votes is acted on at the next one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from hpctrain.checkpoint.session import HOLD_AT_STEP_ENV, STOP_AT_STEP_ENV, CheckpointSession
from hpctrain.config.job import JobSpec
from hpctrain.runtime.comm.base import Handle, SingleProcessCommunicator


class VoteCounter(SingleProcessCommunicator):
    """One rank that records the step of every stop vote it joins."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.votes: list[int] = []

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        if label == "stop flag":
            self.votes.append(self.step)
        return super().allreduce_async_(tensor, op, label)


def _session(tmp_path: Path, steps: int, every: int, environ: dict[str, str] | None = None
             ) -> tuple[CheckpointSession, VoteCounter]:
    job = JobSpec.model_validate({"name": "votes", "model": "digits",
                                  "train": {"steps": steps, "batch_per_rank": 1, "lr": 0.1},
                                  "checkpoint": {"stop_check_every": every}})
    comm = VoteCounter()
    none: Any = None
    session = CheckpointSession(job, tmp_path, comm, task=none, model=torch.nn.Linear(1, 1), optimizer=none,
                                schedule=none, combiner=none, environ=environ or {})
    return session, comm


def _run(session: CheckpointSession, comm: VoteCounter, steps: int, signal_at: int | None = None) -> int | None:
    """The trainer's loop as far as the vote goes: returns the step it stopped after (None: it ran out)."""
    try:
        for step in range(1, steps + 1):
            comm.step = step
            if step == signal_at:
                session.flag.set()  # what the walltime signal's handler does during a step
            if session.stop_requested(step):
                return step
        return None
    finally:
        session.close()


def test_a_signal_between_votes_stops_at_the_next_vote(tmp_path: Path) -> None:
    session, comm = _session(tmp_path, steps=30, every=4)
    assert _run(session, comm, 30, signal_at=5) == 8
    assert comm.votes == [4, 8]


def test_votes_every_n_steps_and_at_the_last(tmp_path: Path) -> None:
    session, comm = _session(tmp_path, steps=10, every=4)
    assert _run(session, comm, 10) is None
    assert comm.votes == [4, 8, 10]
    session, comm = _session(tmp_path, steps=5, every=1)  # the default: after every step
    assert _run(session, comm, 5) is None and comm.votes == [1, 2, 3, 4, 5]


def test_the_test_hooks_step_is_voted_on_whatever_the_cadence(tmp_path: Path) -> None:
    session, comm = _session(tmp_path, steps=30, every=4, environ={STOP_AT_STEP_ENV: "6"})
    assert _run(session, comm, 30) == 6
    assert comm.votes == [4, 6]


class SignalWhileHeld(VoteCounter):
    """The signal arrives during the third vote at the held step (as the walltime signal would, some time later)."""

    def __init__(self) -> None:
        super().__init__()
        self.session: CheckpointSession | None = None

    def allreduce_async_(self, tensor: torch.Tensor, op: str = "sum", label: str = "") -> Handle:
        if label == "stop flag" and self.votes.count(self.step) == 2 and self.session is not None:
            self.session.flag.set()
            tensor[0] = 1.0
        return super().allreduce_async_(tensor, op, label)


def test_the_hold_hook_votes_at_its_step_until_the_signal_comes(tmp_path: Path) -> None:
    job = JobSpec.model_validate({"name": "votes", "model": "digits",
                                  "train": {"steps": 30, "batch_per_rank": 1, "lr": 0.1},
                                  "checkpoint": {"stop_check_every": 4}})
    comm = SignalWhileHeld()
    none: Any = None
    session = CheckpointSession(job, tmp_path, comm, task=none, model=torch.nn.Linear(1, 1), optimizer=none,
                                schedule=none, combiner=none, environ={HOLD_AT_STEP_ENV: "6"})
    comm.session = session
    assert _run(session, comm, 30) == 6
    assert comm.votes == [4, 6, 6, 6]
    # Resumed after the held step (a requeue), the hook does not hold again: votes keep their cadence.
    session, comm = _session(tmp_path, steps=30, every=4, environ={HOLD_AT_STEP_ENV: "6"})
    try:
        for step in range(7, 31):
            comm.step = step
            assert not session.stop_requested(step)
    finally:
        session.close()
    assert comm.votes == [8, 12, 16, 20, 24, 28, 30]


def test_stop_check_every_must_be_positive() -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"name": "votes", "model": "digits", "train": {"steps": 3, "batch_per_rank": 1,
                                                                            "lr": 0.1},
                                "checkpoint": {"stop_check_every": 0}})
    (error,) = info.value.errors()
    assert error["loc"] == ("checkpoint", "stop_check_every") and error["type"] == "greater_than_equal"
