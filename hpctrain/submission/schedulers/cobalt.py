"""Cobalt back-end (ALCF Theta, retired): ``#COBALT`` directives, ``qsub`` in script mode, ``qstat -l -f``.

Cobalt takes the walltime in minutes (``-t``), node attributes through ``--attrs a=b:c=d``, and writes
``PREFIX.output``/``.error``/``.cobaltlog`` for ``-O PREFIX``. It has no job arrays and no warning signal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from hpctrain.submission.discovery.facts import Fact, SchedulerFacts
    from hpctrain.submission.discovery.probe import Probe


class Cobalt(Scheduler):
    name = "cobalt"
    directive_prefix = "#COBALT"
    job_id_variable = "COBALT_JOBID"
    needs_signal_timer = True
    launchers = ("aprun", "mpiexec", "local")  # ALPS on Theta, MPICH's hydra elsewhere, one node; no srun
    dependency_kinds = ("afterok", "afterany")  # --dependencies: the job starts after the others succeeded
    supports_hold = True
    title = "Cobalt"
    script_note = ("# Cobalt sends no warning before the walltime: a timer in this shell raises SIG${signal} "
                   "${signal_lead_s} s\n# before it, and the launch section forwards the signal to the ranks so "
                   "they checkpoint.")
    commands = ("qsub", "qstat", "qdel", "qalter", "qrls", "qhold")
    detect_programs = ("partlist", "cqsub")
    probe_programs = ("nodelist",)
    detect_order = 20  # before PBS: both answer qstat, only Cobalt's qstat -Q prints its own table
    # Options hpctrain writes itself; options a profile or job may set; options that choose the job's kernel,
    # mode or environment (trusted only).
    reserved_directives = frozenset({
        "n", "nodecount", "t", "time", "q", "queue", "A", "project", "O", "outputprefix", "o", "output", "e",
        "error", "jobname", "dependencies", "env"})
    allowed_directives = frozenset({"attrs", "M", "notify"})
    trusted_only_directives = frozenset({"kernel", "mode", "user_list", "env"})

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


    # -- discovery ---------------------------------------------------------------------------------------
    def detects(self, probe: Probe) -> bool:
        from hpctrain.submission.discovery.cobalt import is_cobalt_queue_table

        return super().detects(probe) or is_cobalt_queue_table(probe.out("qstat_queues"))

    def probe_lines(self) -> list[str]:
        return ["have qstat && run qstat_queues qstat -Q", "run cobalt_partlist partlist"]

    def read_discovery(self, probe: Probe) -> SchedulerFacts:
        from hpctrain.submission.discovery.cobalt import read_cobalt

        return read_cobalt(probe)

    def discovered_launcher(self, probe: Probe, mpi: Fact[str] | None) -> Fact[str] | None:
        from hpctrain.submission.discovery.environment import batch_launcher

        return batch_launcher(probe, mpi, prefer_aprun=True)


SCHEDULER = Cobalt()
