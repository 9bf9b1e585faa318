"""The shared status watcher of hpctrain's submitit jobs: one batched poll for all of them, results fetched in bulk.

submitit's ``InfoWatcher`` calls the cluster at 0, 2, 4, 8, ... seconds after the last submission, then at
least every ``delay_s``, for all registered jobs at once. Here an update is ``poll_runs`` (ONE status command
per site and login node, any number of runs and array tasks) plus ONE command per login node that copies
back every result written since (``fetch.py``). A run is done when all its tasks' results are here or hpctrain
says it has ended; jobs are keyed by run id, which is unique where job ids are not (two sites).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submitit.core import core, logger, utils

from hpctrain.errors import HpctrainError
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.run_record import read_meta
from hpctrain.submission.schedulers.exit_status import SIGNAL_DEATH
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import Transport, TransportPool
from hpctrain.submission.views import is_terminal
from hpctrain.submitit_plugin.fetch import fetch_files
from hpctrain.submitit_plugin.runner import result_name

# Jobs that lost their pool (unpickled in another process) poll through this one: one ssh master per host.
DEFAULT_POOL = TransportPool()


TIMEOUT_WORDS = "stopped at its walltime (timeout_min)"


def reason_in_submitit_words(state: str, reason: str) -> str:
    """hpctrain's reason for a run, as a submitit user reads it: a run that reached its walltime says so, not
    the exit status of the signal that ended it (``exit code -15``, or Slurm's ``0``)."""
    if state.upper() != "TIMEOUT":
        return reason
    parts = [part for part in reason.split("; ")
             if part and not part.startswith("exit code ") and not SIGNAL_DEATH.fullmatch(part)]
    if not any("walltime" in part for part in parts):
        parts.insert(0, TIMEOUT_WORDS)
    return "; ".join(parts)


@dataclass
class Watched:
    """A run the watcher polls: where its registry is, how to reach its machine, where its results go."""

    run_id: str
    registry_path: str
    folder: Path  # the executor's folder (it may hold %j): local copies go where submitit's JobPaths say
    job_id: str
    tasks: int
    pool: TransportPool | None = None
    run_dir: str | None = None  # learned from the registry at the first poll
    remote: str | None = None
    ssh_config: str | None = None

    def local_result(self, task: int) -> Path:
        return utils.JobPaths(self.folder, job_id=self.job_id, task_id=task).result_pickle

    def missing_results(self) -> list[tuple[str, Path]]:
        """(remote path, local path) of the results not fetched yet."""
        if self.run_dir is None:
            return []
        return [(f"{self.run_dir}/{result_name(t)}", self.local_result(t)) for t in range(self.tasks)
                if not self.local_result(t).exists()]

    def transport(self) -> Transport:
        return (self.pool or DEFAULT_POOL).get(self.remote, self.ssh_config)


class HpctrainInfoWatcher(core.InfoWatcher):
    """Polls every registered, unfinished run in one batched call per site and login node."""

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s)
        self._runs: dict[str, Watched] = {}
        self._ended: set[str] = set()

    def register_run(self, watched: Watched) -> None:
        if watched.run_id not in self._runs:
            self._runs[watched.run_id] = watched
        self.register_job(watched.run_id)

    def watched(self, run_id: str) -> Watched:
        """The run's record, its location read from the registry if no poll has read it yet."""
        watched = self._runs[run_id]
        if watched.run_dir is None:
            with RunRegistry(watched.registry_path) as reg:
                self._locate(reg, watched)
        return watched

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode=mode).get("State") or "UNKNOWN"

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        if job_id not in self._finished:
            self.update_if_long_enough(mode)
        return job_id in self._finished

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        raise NotImplementedError("the hpctrain watcher reads hpctrain's run views, not command output")

    def update(self) -> None:
        """Poll the runs that have not ended, fetch the results written since, and mark the runs that are done.

        A run is done (submitit's ``done()``) once its results are all here, but polled until it has ended, so
        that ``state`` reads COMPLETED rather than the RUNNING of the poll that found its results.
        """
        active = [w for run_id, w in self._runs.items() if run_id in self._registered and run_id not in self._ended]
        if active:
            self._num_calls += 1
            by_registry: dict[str, list[Watched]] = defaultdict(list)
            for watched in active:
                by_registry[watched.registry_path].append(watched)
            for path, members in by_registry.items():
                try:
                    self._poll(path, members)
                except HpctrainError as exc:
                    logger.get_logger().warning(f"hpctrain: status poll failed, states may be stale: {exc}")
            self.fetch_results([w for w in active if w.run_id not in self._finished])
            for watched in active:
                if watched.run_id in self._ended or (watched.run_dir and not watched.missing_results()):
                    self._finished.add(watched.run_id)
        self._last_status_check = time.time()

    def _locate(self, reg: RunRegistry, watched: Watched) -> None:
        run = reg.get_run(watched.run_id)
        watched.run_dir, watched.remote = run.run_dir, run.remote
        watched.ssh_config = read_meta(reg, run).ssh_config

    def _poll(self, registry_path: str, members: list[Watched]) -> None:
        by_pool: dict[int, list[Watched]] = defaultdict(list)
        for watched in members:
            by_pool[id(watched.pool)].append(watched)
        with RunRegistry(registry_path) as reg:
            for group in by_pool.values():
                for watched in group:
                    if watched.run_dir is None:
                        self._locate(reg, watched)
                runs = [reg.get_run(w.run_id) for w in group]
                for view in poll_runs(reg, runs, group[0].pool or DEFAULT_POOL, progress=False):
                    reason = reason_in_submitit_words(view.state, view.reason)
                    self._info_dict[view.run_id] = {"State": view.state.upper(), "Reason": reason,
                                                    "JobID": view.job_id or "", "RunDir": view.run_dir,
                                                    "PollError": view.poll_error}
                    if is_terminal(view.state):
                        self._ended.add(view.run_id)

    def fetch_results(self, members: list[Watched]) -> None:
        """Copy back the results of ``members`` that exist now: one command per login node."""
        by_transport: dict[tuple[int, str | None, str | None], list[Watched]] = defaultdict(list)
        for watched in members:
            by_transport[(id(watched.pool), watched.remote, watched.ssh_config)].append(watched)
        for group in by_transport.values():
            files = [pair for watched in group for pair in watched.missing_results()]
            if not files:
                continue
            try:
                fetch_files(group[0].transport(), files)
            except HpctrainError as exc:
                logger.get_logger().warning(f"hpctrain: fetching results failed, will try again: {exc}")

    def info(self, run_id: str) -> dict[str, Any]:
        """What the last poll said about a run (no call)."""
        return dict(self._info_dict.get(run_id, {}))
