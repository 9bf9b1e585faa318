"""Two processes polling one remote run at once (``hpctrain status --watch`` and ``hpctrain logs RUN --follow``):
whatever order their answers reach the registry in, a run that ended stays ended and shows its last metrics record.

The login node is this machine with stand-in ``squeue``/``sacct`` on PATH (the real batched ``sh`` script runs);
the interleaving is made explicit: the watcher's answer is held back while the follower polls and stores the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.run_record import (
    META_FILE,
    PROGRESS_FILE,
    KeptProgress,
    RunMeta,
    newer_progress,
    record_dir,
    save_progress,
    saved_progress,
    write_record_file,
)
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import Completed, LocalTransport, TransportPool
from hpctrain.submission.views import view_of
from tests.transport_record import as_recorded

JOB = "4242"
STEPS = 300


def _record(step: int) -> dict[str, float]:
    return {"time": 1_800_000_000.0 + step, "step": step, "loss": 1.0 / step}


class Cluster:
    """The remote side: the job's state as squeue prints it, and the run directory's metrics.jsonl."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.run_dir = root / "run"
        self.run_dir.mkdir()
        self.state_file = root / "squeue.out"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        (bin_dir / "squeue").write_text(f'#!/bin/sh\ncat "{self.state_file}"\n')
        (bin_dir / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\n"
                                       "exit 1\n")
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def training(self, step: int) -> None:
        self.state_file.write_text(f"{JOB}|RUNNING|None|1:00|node01|tiny\n")
        self._metrics(step)

    def finished(self) -> None:
        self._metrics(STEPS)
        self.state_file.write_text(f"{JOB}|COMPLETED|None|5:00|node01|tiny\n")

    def _metrics(self, step: int) -> None:
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(_record(step)) + "\n")


class LoginNode(LocalTransport):
    """Reads the cluster like ssh would; ``before_answering`` runs once between reading and answering (the
    round trip of a slow ssh connection, during which the other process polls)."""

    def __init__(self, before_answering: Callable[[], None] | None = None) -> None:
        self.before_answering = before_answering

    def run(self, argv: list[str], **kw) -> Completed:  # type: ignore[no-untyped-def, override]
        answer = super().run(argv, **kw)
        hook, self.before_answering = self.before_answering, None
        if hook is not None:
            hook()
        return answer


def _pool(node: LoginNode) -> TransportPool:
    return TransportPool(lambda remote, cfg: node)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, Cluster]:
    """A registry with one remote Slurm run whose job trains (step 120 of 300)."""
    cluster = Cluster(tmp_path, monkeypatch)
    path = tmp_path / "home" / "registry.db"
    with RunRegistry(path) as reg:
        run = reg.create_run("tiny", "ci-slurm", "abc", str(cluster.run_dir), remote="me@login1")
        reg.add_submission(run.run_id, JOB, "submit", ok=True)
        write_record_file(record_dir(reg, run.run_id) / META_FILE, RunMeta("slurm", total_steps=STEPS).to_json())
    cluster.training(120)
    return path, run.run_id, cluster


def _status(path: Path, run_id: str, pool: TransportPool, *, progress: bool = True):  # noqa: ANN202
    """One poll from its own process (its own registry handle), as `hpctrain status` or `logs --follow` makes."""
    with RunRegistry(path) as reg:
        (view,) = poll_runs(reg, [reg.get_run(run_id)], pool, progress=progress)
        return view


# --- the registry keeps the end -------------------------------------------------------------------------------


def test_a_running_answer_read_before_the_end_never_undoes_the_stored_end(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    with RunRegistry(path) as watcher, RunRegistry(path) as follower:
        rid = watcher.create_run("tiny", "ci-slurm", "abc", "/runs/tiny").run_id
        watcher.add_submission(rid, JOB, "submit", ok=True)
        follower.update_states({JOB: JobStatus(JOB, JobState.COMPLETED, exit_code=0)})
        # the watcher's answer was read before the job ended and is stored after the follower's
        assert watcher.update_states({JOB: JobStatus(JOB, JobState.RUNNING)}) == 0
        assert watcher.get_run(rid).state == "completed" and watcher.chain(rid)[-1].exit_code == 0
        assert watcher.active_jobs_by_site() == {}
        # a new job of the run (resume) is a new submission: it starts active again
        watcher.add_submission(rid, "4243", "resume", ok=True)
        follower.update_states({"4243": JobStatus("4243", JobState.RUNNING)})
        assert watcher.get_run(rid).state == "running"


def test_kept_progress_only_moves_forward(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    with RunRegistry(path) as watcher, RunRegistry(path) as other:
        rid = watcher.create_run("tiny", "ci-slurm", "abc", "/runs/tiny").run_id
        assert save_progress(other, rid, _record(300), after_end_of=JOB)["step"] == 300
        # the watcher's record, read while the job ran, arrives after the last one
        assert save_progress(watcher, rid, _record(120))["step"] == 300
        assert saved_progress(watcher, rid)["step"] == 300  # type: ignore[index]
    # a resumed run starts again at its checkpoint's (earlier) step: rank 0's time says which record is newer
    resumed = {"time": _record(300)["time"] + 60, "step": 250}
    assert newer_progress(KeptProgress(resumed), KeptProgress(_record(300), JOB)).record == resumed
    # the same record read again after the end is marked so; records without times compare by step
    assert newer_progress(KeptProgress(_record(300), JOB), KeptProgress(_record(300))).after_end_of == JOB
    assert newer_progress(KeptProgress({"step": 5}), KeptProgress({"step": 7})).record == {"step": 7}


# --- two processes polling the same run -----------------------------------------------------------------------


@pytest.mark.parametrize("follower_reads_progress", [False, True], ids=["logs-follow", "second-status"])
def test_the_end_stored_by_another_process_while_a_poll_was_under_way(
        setup: tuple[Path, str, Cluster], follower_reads_progress: bool) -> None:
    """The watcher's ssh call reads RUNNING and step 120; before it answers, the job completes (step 300) and the
    follower polls and stores the end; then the watcher's answer is stored."""
    path, rid, cluster = setup

    def follower_polls() -> None:
        cluster.finished()
        view = _status(path, rid, _pool(LoginNode()), progress=follower_reads_progress)
        assert view.state == "completed"

    watcher = _status(path, rid, _pool(LoginNode(before_answering=follower_polls)))
    assert watcher.state == "completed"
    assert watcher.progress is not None and (watcher.progress.step, watcher.progress.total) == (STEPS, STEPS)
    later = _status(path, rid, _pool(LoginNode()))
    assert later.state == "completed" and later.progress is not None and later.progress.step == STEPS
    with RunRegistry(path) as reg:  # `hpctrain runs`: the registry and the kept record only
        shown = view_of(reg, reg.get_run(rid))
        assert shown.progress is not None and shown.progress.step == STEPS


def test_the_follower_sees_the_end_first_and_status_still_shows_the_last_step(
        setup: tuple[Path, str, Cluster]) -> None:
    """The watcher polls while the job trains (step 120 kept); the log follower, which reads no metrics, is the
    one that sees the job complete; the watcher's next poll must still read the last record."""
    path, rid, cluster = setup
    first = _status(path, rid, _pool(LoginNode()))
    assert first.state == "running" and first.progress is not None and first.progress.step == 120
    cluster.finished()
    assert _status(path, rid, _pool(LoginNode()), progress=False).state == "completed"
    calls: list[list[str]] = []

    class Counting(LoginNode):
        def run(self, argv: list[str], **kw) -> Completed:  # type: ignore[no-untyped-def, override]
            calls.append(as_recorded(argv, kw))
            return super().run(argv, **kw)

    node = Counting()
    view = _status(path, rid, _pool(node))
    assert view.state == "completed" and view.progress is not None and view.progress.step == STEPS
    assert len(calls) == 1 and "squeue" not in calls[0][-1]  # metrics only: an ended job is not asked about
    calls.clear()
    assert _status(path, rid, _pool(node)).progress.step == STEPS  # type: ignore[union-attr]
    assert calls == []  # the last record is kept: nothing more to read


def test_a_record_kept_by_an_older_hpctrain_is_read_again_once_the_run_has_ended(
        setup: tuple[Path, str, Cluster]) -> None:
    path, rid, cluster = setup
    cluster.finished()
    with RunRegistry(path) as reg:
        reg.update_states({JOB: JobStatus(JOB, JobState.COMPLETED)})
        write_record_file(record_dir(reg, rid) / PROGRESS_FILE, json.dumps(_record(120)))  # the bare record it kept
        assert view_of(reg, reg.get_run(rid)).progress.step == 120  # type: ignore[union-attr]
    assert _status(path, rid, _pool(LoginNode())).progress.step == STEPS  # type: ignore[union-attr]
