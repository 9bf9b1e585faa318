"""submitit's ``JobEnvironment`` inside an hpctrain job: ranks, world size and node from the back-ends' job
environments (hpctrain/job_environment.py).

Registered as the ``submitit`` entry point ``job_environment``: ``submitit.JobEnvironment()`` returns it in a job
started by the runner (which sets ``SUBMITIT_EXECUTOR=hpctrain``), under srun, PALS mpiexec, aprun, hydra or
hpctrain's local launcher alike (``hpctrain.launch_env``). Requeueing is the batch script's, on exit 75:
``_requeue`` ends the task with it.
"""

from __future__ import annotations

import os
from pathlib import Path

from submitit.core.job_environment import JobEnvironment
from submitit.core.utils import JobPaths

from hpctrain.launch_env import LaunchEnv, detect_launch_env, job_id_of, scheduler_job_id, scheduler_nodes
from hpctrain.submitit_plugin.runner import (
    PAYLOAD_FILE,
    array_task_of,
    log_name,
    result_name,
    stop_for_requeue,
)


class HpctrainJobPaths(JobPaths):
    """One task's files in its run directory (the runner's names; the laptop keeps submitit's own)."""

    @property
    def folder(self) -> Path:
        return self._folder

    @property
    def submission_file(self) -> Path:
        return self._folder / "job.sh"

    @property
    def submitted_pickle(self) -> Path:
        return self._folder / PAYLOAD_FILE

    @property
    def result_pickle(self) -> Path:
        return self._folder / result_name(self.task_id)

    @property
    def stdout(self) -> Path:
        return self._folder / log_name(self.task_id, "out")

    @property
    def stderr(self) -> Path:
        return self._folder / log_name(self.task_id, "err")


class HpctrainJobEnvironment(JobEnvironment):
    """Where this task sits in an hpctrain job, read from the launcher's variables on every access."""

    @staticmethod
    def _launch() -> LaunchEnv:
        return detect_launch_env(os.environ)

    @property
    def paths(self) -> HpctrainJobPaths:
        return HpctrainJobPaths(os.environ["SUBMITIT_FOLDER"], job_id=self.job_id, task_id=self.global_rank)

    @property
    def job_id(self) -> str:
        return job_id_of(os.environ)

    @property
    def raw_job_id(self) -> str:
        return scheduler_job_id(os.environ) or os.environ.get("HPCTRAIN_LOCAL_JOB_ID", "unknown")

    @property
    def array_job_id(self) -> str | None:
        task = array_task_of(os.environ)
        return task[0] if task else None

    @property
    def array_task_id(self) -> str | None:
        task = array_task_of(os.environ)
        return task[1] if task else None

    @property
    def num_tasks(self) -> int:
        return self._launch().size

    @property
    def num_nodes(self) -> int:
        return self._launch().nodes

    @property
    def node(self) -> int:
        return self._launch().node_rank

    @property
    def global_rank(self) -> int:
        return self._launch().rank

    @property
    def local_rank(self) -> int:
        return self._launch().local_rank

    @property
    def hostnames(self) -> list[str]:
        return scheduler_nodes(os.environ) or [self.hostname]

    def _requeue(self, countdown: int) -> None:
        """Requeue this job: the task exits 75 and the batch script puts the job back in line (``scontrol
        requeue``, a new ``qsub``, the local controller), at most ``max_num_timeout`` times in all.

        submitit's own signal handler calls it after checkpointing; called in the callable, it ends the callable
        there (``countdown`` is not used: the batch script counts the requeues).
        """
        if not self.activated():
            raise RuntimeError("_requeue is for a task of an hpctrain submitit job (SUBMITIT_EXECUTOR=hpctrain)")
        stop_for_requeue(Path(os.environ["SUBMITIT_FOLDER"]), self.global_rank)
