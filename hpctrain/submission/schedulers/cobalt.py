"""Cobalt back-end (ALCF Theta, retired): ``#COBALT`` directives, ``qsub`` in script mode, ``qstat -l -f``.

Cobalt takes the walltime in minutes (``-t``), node attributes through ``--attrs a=b:c=d``, and writes
``PREFIX.output``/``.error``/``.cobaltlog`` for ``-O PREFIX``. It has no job arrays and no warning signal.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpctrain.config.common import walltime_seconds
from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.config.walltime import format_minutes
from hpctrain.errors import SchedulerError
from hpctrain.submission.schedulers import status_parsers as sp
from hpctrain.submission.schedulers.base import (
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
    directive_value,
    merged_directives,
    queue_submit_name,
    requeue_block,
    resubmit_action,
)
from hpctrain.submission.shell import directive_word


class Cobalt(Scheduler):
    name = "cobalt"
    directive_prefix = "#COBALT"
    template = "cobalt.tmpl"
    job_id_variable = "COBALT_JOBID"
    needs_signal_timer = True
    launchers = ("aprun", "mpiexec", "local")  # ALPS on Theta, MPICH's hydra elsewhere, one node; no srun
    dependency_kinds = ("afterok", "afterany")  # --dependencies: the job starts after the others succeeded
    supports_hold = True

    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        res = job.resources
        opts = [f"-n {res.nodes}", f"-t {format_minutes(walltime_seconds(res.walltime))}"]
        # A Cobalt reservation is reached through its queue; nodes are always whole (exclusive needs no option).
        queue = res.reservation or queue_submit_name(placement)
        if queue:
            opts.append(f"-q {directive_word(queue, what='queue')}")
        if placement.account:
            opts.append(f"-A {directive_word(placement.account, what='account')}")
        opts.append(f"-O {options.log_path('cobalt')}")
        opts.append(f"--jobname {directive_word(job.name, what='job name')}")
        directives = merged_directives(site, placement, job)
        attrs = [directive_value(directives.pop("attrs"), key="attrs")] if directives.get("attrs") else []
        if site.filesystems:
            attrs.append("filesystems=" + ",".join(directive_word(f, what="filesystem") for f in site.filesystems))
        if attrs:
            opts.append(f"--attrs {':'.join(attrs)}")
        for key, value in directives.items():
            if value is None or value is False:
                continue
            flag = f"-{key}" if len(key) == 1 else f"--{key}"
            opts.append(flag if value is True else f"{flag} {directive_value(value, key=key)}")
        return check_directive_lines([f"{self.directive_prefix} {o}" for o in opts], self.directive_prefix)

    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, array_dir: str | None = None, hold: bool = False) -> list[str]:
        argv = ["qsub"]
        dep = check_request(self, dependency=dependency, array=array, hold=hold)
        if dep:
            argv += ["--dependencies", dep[1]]
        if hold:
            argv.append("-h")
        return [*argv, script_path]

    def requeue_lines(self, script_path: str, max_requeues: int) -> list[str]:
        # Cobalt cannot requeue a job: submit the script again, to start once this job has ended.
        return requeue_block("HPCTRAIN_RESTART_COUNT", max_requeues, resubmit_action("COBALT_JOBID", (
            f'qsub --dependencies "${{COBALT_JOBID}}" --env HPCTRAIN_RESTART_COUNT="$((restarts + 1))" {script_path}')))

    def parse_job_id(self, stdout: str) -> str:
        # qsub prints the numeric id on its own line (possibly after warnings).
        for line in reversed(stdout.strip().splitlines()):
            if line.strip().isdigit():
                return line.strip()
        raise SchedulerError(f"no job id in Cobalt qsub output {stdout.strip()[:200]!r}")

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        argv = sp.cobalt_qstat_argv([check_job_id(j) for j in jobs])
        return [[StatusProbe("qstat", "live", argv, sp.parse_cobalt_qstat)]]

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["qdel", check_job_id(job_id)]

    def log_names(self, job_id: str) -> list[str]:
        return ["cobalt.output"]


SCHEDULER = Cobalt()
