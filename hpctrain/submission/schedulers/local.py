"""The ``local`` back-end: this machine is the scheduler, through hpctrain's local controller.

Its ``#LOCAL`` directives carry the walltime, the warning signal and the requeue budget; submitting runs
``local_controller submit`` (a detached supervisor whose pid is the job id), status reads the supervisors'
records and cancel signals one — argv lists run through the transport like ``sbatch``/``squeue``/``scancel``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from hpctrain.config.common import walltime_seconds
from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.errors import SchedulerError
from hpctrain.submission.schedulers.base import (
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
)
from hpctrain.submission.schedulers.local_controller import LOG_FILE, STATES
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus

CONTROLLER = "hpctrain.submission.schedulers.local_controller"


def controller_argv(action: str, *args: str) -> list[str]:
    """``python -m ...local_controller ACTION ARGS`` with this interpreter (the machine is this one)."""
    return [sys.executable, "-m", CONTROLLER, action, *args]


def parse_controller_status(text: str) -> dict[str, JobStatus]:
    """Parse ``local_controller status``: one JSON object per job (job, state, exit_code, reason, restarts)."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("job"), str):
            continue
        raw = str(record.get("state", ""))
        state = JobState[raw] if raw in STATES else JobState.FAILED
        code = record.get("exit_code")
        out[record["job"]] = JobStatus(record["job"], state, str(record.get("reason", "")),
                                       code if isinstance(code, int) else None,
                                       int(record.get("restarts", 0) or 0), raw)
    return out


class Local(Scheduler):
    name = "local"
    directive_prefix = "#LOCAL"
    job_id_variable = "HPCTRAIN_LOCAL_JOB_ID"
    job_environment = "hpctrain.job_environment:LOCAL"
    submits_over_ssh = False
    max_nodes = 1
    launchers = ("local", "mpiexec")
    job_options = frozenset()  # this machine: no reservations, nothing to share, no scheduler options
    title = "no scheduler"
    script_note = ("# No scheduler: hpctrain's local controller runs this script on this machine (`hpctrain submit "
                   "--site local`,\n# or by hand: python -m hpctrain.submission.schedulers.local_controller submit "
                   "job.sh, in the run directory),\n# reading the #LOCAL lines above. It sends SIG${signal} before "
                   "the walltime; the launch section forwards it\n# to the ranks so they checkpoint, and the "
                   "controller runs the script again when they stopped for it.")
    runs_here = True
    detect_order = 1000  # last: a login node where no other back-end's commands answer is a machine of its own

    def detects(self, probe: object) -> bool:
        return True

    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        ckpt = job.checkpoint
        opts = [f"--walltime-s={int(walltime_seconds(job.resources.walltime))}",
                f"--signal={ckpt.signal}@{ckpt.signal_lead_s}",
                f"--max-requeues={ckpt.max_requeues}"]
        return check_directive_lines([f"{self.directive_prefix} {o}" for o in opts], self.directive_prefix)

    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, array_dir: str | None = None, hold: bool = False) -> list[str]:
        check_request(self, dependency=dependency, array=array, hold=hold)
        return controller_argv("submit", script_path)

    def parse_job_id(self, stdout: str) -> str:
        for line in reversed(stdout.strip().splitlines()):
            if line.strip().isdigit():
                return line.strip()
        raise SchedulerError(f"no job id in the local controller's output {stdout.strip()[:200]!r}")

    def test_only_argv(self, script_path: str) -> list[str] | None:
        return ["bash", "-n", script_path]

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        pairs = [word for job, run_dir in jobs.items() for word in (check_job_id(job), run_dir)]
        return [[StatusProbe("local controller", "live", controller_argv("status", "--", *pairs),
                             parse_controller_status)]]

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return controller_argv("cancel", "--", check_job_id(job_id), run_dir)

    def signal_argv(self, job_id: str, run_dir: str, signal_name: str) -> list[str] | None:
        return controller_argv("signal", "--", check_job_id(job_id), run_dir, signal_name)

    def log_names(self, job_id: str) -> list[str]:
        return [LOG_FILE]


SCHEDULER = Local()
