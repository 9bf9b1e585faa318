"""submitit's ``Job`` for a run hpctrain submitted: state from the batched watcher, results and logs over the transport.

The laptop keeps submitit's own files in the executor's folder (``%j_submitted.pkl``, ``%j_%t_result.pkl``,
``%j_%t_log.out``); the results and logs are copied there from the run directory when asked for, so the
folder is never read by the job. A job that ended without a result raises submitit's ``UncompletedJobError``
naming how it ended (hpctrain's reason), with the end of its logs, after a bounded wait: it never hangs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from submitit.core import core, utils

from hpctrain.errors import HpctrainError
from hpctrain.submission.api import cancel_run, read_log
from hpctrain.submission.registry import Registry
from hpctrain.submission.transport import TransportPool
from hpctrain.submitit_plugin.fetch import fetch_files
from hpctrain.submitit_plugin.runner import log_name, result_name
from hpctrain.submitit_plugin.watcher import DEFAULT_POOL, HpctrainInfoWatcher, Watched

# An ended job's result may reach a shared file system's other clients a little late: look again this often.
RESULT_RETRIES = 3
RESULT_RETRY_S = 1.0
LOG_TAIL_LINES = 40


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class HpctrainJob(core.Job[core.R]):
    """A submitted callable: one hpctrain run (a task of an array job, or a job of its own)."""

    watcher = HpctrainInfoWatcher(delay_s=60)

    def __init__(self, folder: str | Path, job_id: str, tasks: Sequence[int] = (0,), *, run_id: str = "",
                 registry_path: str | None = None, pool: TransportPool | None = None) -> None:
        self.run_id = run_id
        self._registry_path = registry_path
        self._pool = pool
        self._ntasks = len(tuple(tasks))
        super().__init__(folder, job_id, tasks)
        for sub in self._sub_jobs:  # submitit builds them with (folder, job_id, tasks) only
            sub.run_id, sub._registry_path, sub._pool, sub._ntasks = run_id, registry_path, pool, self._ntasks
            sub._register_in_watcher()

    def _register_in_watcher(self) -> None:
        if self.run_id and self._registry_path:
            self.watcher.register_run(Watched(self.run_id, self._registry_path, self._paths._folder, self.job_id,
                                              self._ntasks, self._pool))

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", run_id={self.run_id}>"

    # -- state -------------------------------------------------------------------------------------------
    def done(self, force_check: bool = False) -> bool:
        """True once every task's result is here or hpctrain says the run has ended (polls are batched)."""
        if self._sub_jobs:
            return all(sub.done(force_check) for sub in self._sub_jobs)
        if self.paths.result_pickle.exists():
            return True
        return self.watcher.is_done(self.run_id, mode="force" if force_check else "standard")

    @property
    def state(self) -> str:
        """hpctrain's state of the run, upper-case as submitit shows states (PENDING, RUNNING, COMPLETED...)."""
        return self.watcher.get_state(self.run_id, mode="standard")

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return self.watcher.get_info(self.run_id, mode=mode)

    def cancel(self, check: bool = True) -> None:
        """Cancel the run's job through hpctrain (nothing is sent when it has already ended)."""
        try:
            with Registry(self._registry_path) as reg:
                cancel_run(reg, reg.get_run(self.run_id), self._pool or DEFAULT_POOL)
        except HpctrainError:
            if check:
                raise

    # -- results and logs ----------------------------------------------------------------------------------
    def _get_outcome_and_result(self) -> tuple[str, Any]:
        assert not self._sub_jobs, "This should not be called for a meta-job"
        local = self.paths.result_pickle
        for attempt in range(RESULT_RETRIES + 1):
            if local.exists():
                break
            if attempt:
                time.sleep(RESULT_RETRY_S)
            self.watcher.fetch_results([self.watcher.watched(self.run_id)])
        if not local.exists():
            raise utils.UncompletedJobError(self._no_result_message())
        outcome: tuple[str, Any] = utils.pickle_load(local)
        return outcome

    def _no_result_message(self) -> str:
        watched = self.watcher.watched(self.run_id)
        info = self.watcher.info(self.run_id) or self.watcher.get_info(self.run_id, mode="force")
        task = self.task_id or 0
        lines = [f"Job {self.job_id} (run {self.run_id}, task {task}) has not produced any output "
                 f"(state: {info.get('State', 'UNKNOWN')}): no {result_name(task)} in {watched.run_dir} "
                 f"on {watched.transport().host}"]
        if info.get("Reason"):
            lines.append(f"hpctrain: {info['Reason']}")
        for title, text in (("Error stream of the task", self._fetch_log("err")),
                            ("Output of the job script", self._scheduler_log())):
            if text and text.strip():
                lines += [f"{title} (last lines):", "-" * 40, _tail(text)]
        return "\n".join(lines)

    def _scheduler_log(self) -> str:
        try:
            with Registry(self._registry_path) as reg:
                return read_log(reg, reg.get_run(self.run_id), self._pool or DEFAULT_POOL)
        except HpctrainError as exc:
            return f"(could not read it: {exc})"

    def _fetch_log(self, stream: str) -> str | None:
        """The task's stdout (``out``) or stderr (``err``) copied from the run directory; None if absent."""
        local = self.paths.stdout if stream == "out" else self.paths.stderr
        watched = self.watcher.watched(self.run_id)
        remote = f"{watched.run_dir}/{log_name(self.task_id or 0, stream)}"
        if not fetch_files(watched.transport(), [(remote, local)], exact=False):
            return None
        return local.read_text(encoding="utf-8", errors="replace")

    def _get_logs_string(self, name: str) -> str | None:
        streams = {"stdout": "out", "stderr": "err"}
        if name not in streams:
            raise ValueError(f'Unknown "{name}", available are {list(streams)}')
        return self._fetch_log(streams[name])

    # -- lifetime ------------------------------------------------------------------------------------------
    def __del__(self) -> None:
        if getattr(self, "_cancel_at_deletion", False) and not self.watcher.is_done(self.run_id, mode="cache"):
            self.cancel(check=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # transports are this process's; a job loaded elsewhere uses DEFAULT_POOL
        return state
