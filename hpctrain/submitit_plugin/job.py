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

from hpctrain.errors import HpctrainError, SchedulerError
from hpctrain.submission.api import cancel_run, read_log
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.run_record import read_meta
from hpctrain.submission.schedulers.base import get_scheduler
from hpctrain.submission.transport import CommandFailed, TransportPool
from hpctrain.submission.views import latest_job_id
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
                 registry_path: str | None = None, pool: TransportPool | None = None,
                 signal: str = "USR2") -> None:
        self.run_id = run_id
        self._registry_path = registry_path
        self._pool = pool
        self._ntasks = len(tuple(tasks))
        self._signal = signal  # the job's checkpoint signal (the executor's parameter signal)
        super().__init__(folder, job_id, tasks)
        for sub in self._sub_jobs:  # submitit builds them with (folder, job_id, tasks) only
            sub.run_id, sub._registry_path, sub._pool, sub._ntasks = run_id, registry_path, pool, self._ntasks
            sub._signal = signal
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
            with RunRegistry(self._registry_path) as reg:
                cancel_run(reg, reg.get_run(self.run_id), self._pool or DEFAULT_POOL)
        except HpctrainError:
            if check:
                raise

    def _interrupt(self, timeout: bool = False) -> None:
        """Send the job its checkpoint signal now, as the scheduler sends it before the walltime (submitit's hook
        to test preemption and time-outs): rank 0 checkpoints a Checkpointable and the job is requeued.

        ``timeout`` is taken for submitit's signature: hpctrain counts every requeue, preemption or walltime,
        against ``max_num_timeout``.
        """
        with RunRegistry(self._registry_path) as reg:
            run = reg.get_run(self.run_id)
            meta = read_meta(reg, run)
            job_id = latest_job_id(reg, run.run_id) or self.job_id
        scheduler = get_scheduler(meta.scheduler)
        signal_name = getattr(self, "_signal", "USR2")
        argv = scheduler.signal_argv(job_id, run.run_dir, signal_name)
        if argv is None:
            raise SchedulerError(f"{scheduler.name} has no command that signals a running job: job {job_id} of run "
                                 f"{self.run_id} cannot be sent SIG{signal_name} now",
                                 hint="its checkpoint signal comes signal_lead_s before the walltime")
        try:
            (self._pool or DEFAULT_POOL).get(run.remote, meta.ssh_config).run(argv, timeout=60)
        except CommandFailed as exc:
            detail = (exc.completed.stderr or exc.completed.stdout).strip().splitlines()
            raise SchedulerError(f"sending SIG{signal_name} to job {job_id} of run {self.run_id} failed: "
                                 f"{detail[-1] if detail else exc}") from None

    # -- results and logs ----------------------------------------------------------------------------------
    def results(self) -> list[core.R]:
        """Every task's value; with several tasks, the exception of the task that raised, when one did."""
        if self._sub_jobs:
            error = self.exception()
            if error is not None:
                raise error
        return super().results()

    def exception(self) -> utils.UncompletedJobError | utils.FailedJobError | None:
        """The job's error: with several tasks, the first task's own exception (its traceback), before the
        "no result" of tasks that the launcher ended because that task failed."""
        if not self._sub_jobs:
            return super().exception()
        self.wait()
        errors = [error for sub in self._sub_jobs if (error := sub.exception()) is not None]
        raised = [error for error in errors if isinstance(error, utils.FailedJobError)]
        return (raised or errors or [None])[0]

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
        raised = self._tasks_that_raised(watched)
        if raised:
            first, last_line = raised[0]
            lines.append(f"task {first} raised {last_line} (job.task({first}).exception() has its traceback); "
                         "the launcher ends the other tasks when one fails")
        for title, text in (("Error stream of the task", self._fetch_log("err")),
                            ("Output of the job script", self._scheduler_log())):
            if text and text.strip():
                lines += [f"{title} (last lines):", "-" * 40, _tail(text)]
        return "\n".join(lines)

    def _tasks_that_raised(self, watched: Watched) -> list[tuple[int, str]]:
        """(task, last line of its traceback) of the other tasks whose result is an error, fetched as needed."""
        others = [t for t in range(self._ntasks) if t != (self.task_id or 0)]
        if not others:
            return []
        self.watcher.fetch_results([watched])
        raised = []
        for task in others:
            local = watched.local_result(task)
            if not local.exists():
                continue
            try:
                outcome, value = utils.pickle_load(local)
            except Exception:  # a result that does not load here says nothing about this task
                continue
            if outcome == "error":
                raised.append((task, (str(value).strip().splitlines() or ["an error"])[-1]))
        return raised

    def _scheduler_log(self) -> str:
        try:
            with RunRegistry(self._registry_path) as reg:
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
