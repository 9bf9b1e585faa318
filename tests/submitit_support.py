"""Fixtures and the callables shared by the tests of the submitit plug-in (tests/test_submitit*.py).

Each test gets its own registry (HPCTRAIN_HOME), a laptop folder and a run root in different directories,
and a fresh status watcher that polls every 2 s (submitit's watcher is shared by all jobs of a process).
The test modules have cloudpickle pickle this module by value: a job's Python cannot import it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import submitit
from submitit.helpers import Checkpointable

from hpctrain.submission.transport import Completed, LocalTransport
from hpctrain.submitit_plugin.job import HpctrainJob
from hpctrain.submitit_plugin.watcher import HpctrainInfoWatcher
from tests.transport_record import as_recorded


@dataclass(frozen=True)
class Places:
    """Where a test's files go: the executor's folder (the "laptop") and the run root (the "cluster")."""

    root: Path
    folder: Path
    runs: Path
    home: Path


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Places:
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    monkeypatch.delenv("HPCTRAIN_RUNS", raising=False)
    return Places(tmp_path, tmp_path / "laptop" / "submitit", tmp_path / "cluster" / "runs", tmp_path / "home")


@pytest.fixture(autouse=True)
def fresh_watcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[HpctrainInfoWatcher]:
    watcher = HpctrainInfoWatcher(delay_s=2)
    monkeypatch.setattr(HpctrainJob, "watcher", watcher)
    yield watcher


class CountingTransport(LocalTransport):
    """The real LocalTransport, recording every command it runs (with what it sends on stdin as a last word:
    a script run by ``run_script`` travels there)."""

    def __init__(self, calls: list[list[str]]) -> None:
        self.calls = calls

    def run(self, argv: list[str], **kw: Any) -> Completed:
        self.calls.append(as_recorded(argv, kw))
        return super().run(argv, **kw)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.3) -> None:
    """Poll ``predicate`` until it holds; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout:.0f} s")
        time.sleep(poll_s)


def slurm_queue(default: str) -> str:
    """The partition the tests submit to ($HPCTRAIN_SLURM_PARTITION from scripts/ci/slurm.sh env)."""
    return os.environ.get("HPCTRAIN_SLURM_PARTITION") or default


# --- callables the tests submit (pickled by value: the jobs cannot import this module) ----------------------


def add(a: int, b: int) -> int:
    print(f"adding {a} and {b}")
    print("a line on stderr", file=sys.stderr)
    return a + b


def fail(value: int) -> None:
    raise ValueError(f"bad value {value}")


def square(x: int) -> int:
    return x * x


def task_environment(tag: str) -> dict[str, Any]:
    """What submitit.JobEnvironment() says inside the job."""
    env = submitit.JobEnvironment()
    return {"tag": tag, "cluster": env.cluster, "rank": env.global_rank, "size": env.num_tasks,
            "local_rank": env.local_rank, "node": env.node, "nodes": env.num_nodes, "job_id": env.job_id,
            "cwd": os.getcwd(), "result_path": str(env.paths.result_pickle)}


def hold(pid_file: str, seconds: float) -> str:
    """Write this process's pid, then sleep (the tests kill or cancel it meanwhile)."""
    tmp = Path(f"{pid_file}.tmp")
    tmp.write_text(str(os.getpid()))
    tmp.rename(pid_file)  # whole or not at all: the test reads it as soon as it exists
    time.sleep(seconds)
    return "woke up"


def wait_then_look(go_file: str, folder: str) -> dict[str, Any]:
    """Wait until the test says go, then report where the job runs and whether it sees the laptop's folder."""
    deadline = time.monotonic() + 120
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{go_file} never appeared")
        time.sleep(0.2)
    return {"cwd": os.getcwd(), "sees_folder": os.path.exists(folder), "files": sorted(os.listdir("."))}


class Resumable(Checkpointable):
    """Counts until the checkpoint signal; after a requeue it returns what it had counted (its pickled state).

    ``finish``: False makes it count forever, requeue or not (to hit the requeue cap).
    """

    def __init__(self, marker: str, finish: bool = True) -> None:
        self.marker = marker
        self.finish = finish
        self.count = 0
        self.runs = 0
        self.checkpointed_at: int | None = None

    def __call__(self) -> dict[str, Any]:
        self.runs += 1
        Path(self.marker).write_text(f"{self.runs}\n")  # the test waits for this before it signals
        while self.checkpointed_at is None or not self.finish:
            self.count += 1
            time.sleep(0.05)
        return {"runs": self.runs, "resumed_from": self.checkpointed_at, "count": self.count}

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        self.checkpointed_at = self.count
        return super().checkpoint(*args, **kwargs)


def fail_on_task_1(go_file: str) -> int:
    """Task 1 raises; task 0 waits for a word that never comes (as for a peer in a collective) until the
    launcher ends it."""
    env = submitit.JobEnvironment()
    if env.global_rank == 1:
        raise ValueError("task 1 cannot go on")
    deadline = time.monotonic() + 240
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {env.global_rank} was not ended after task 1 failed")
        time.sleep(0.2)
    return env.global_rank


def requeue_once() -> dict[str, Any]:
    """Asks for a requeue through submitit's JobEnvironment the first time; returns the restart count after."""
    env = submitit.JobEnvironment()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("HPCTRAIN_RESTART_COUNT") or 0)
    if restarts == 0:
        env._requeue(1)
        return {"requeued": False}
    return {"requeued": True, "restarts": restarts, "rank": env.global_rank}
