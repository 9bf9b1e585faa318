"""The ``local`` back-end: no scheduler, the script is a plain bash script run on this machine.

It has no directives and no queue; submitting means running ``bash SCRIPT`` (the local controller that
runs it in the background and records its process lives outside this module).
"""

from __future__ import annotations

from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.errors import SchedulerError
from hpctrain.submission.schedulers import status_parsers as sp
from hpctrain.submission.schedulers.base import RenderOptions, Scheduler


class Local(Scheduler):
    name = "local"
    directive_prefix = ""
    template = "local.tmpl"
    job_id_variable = "HPCTRAIN_LOCAL_JOB_ID"

    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        return []

    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, hold: bool = False) -> list[str]:
        if dependency or array or hold:
            raise SchedulerError("the local site runs one script at once: no dependencies, arrays or holds")
        return ["bash", script_path]

    def parse_job_id(self, stdout: str) -> str:
        raise SchedulerError("a local run has no scheduler job id; the local controller records its process id")

    def status_argv(self, job_ids: list[str]) -> list[list[str]]:
        return []

    def parse_status(self, argv_index: int, stdout: str) -> dict[str, sp.JobStatus]:
        raise SchedulerError("a local run has no status command")

    def cancel_argv(self, job_id: str) -> list[str]:
        raise SchedulerError("a local run is stopped by signalling its process, not by a command")


SCHEDULER = Local()
