"""Cobalt back-end (ALCF Theta, retired): ``#COBALT`` directives, ``qsub`` in script mode, ``qstat -l -f``.

Cobalt takes the walltime in minutes (``-t``), node attributes through ``--attrs a=b:c=d``, and writes
``PREFIX.output``/``.error``/``.cobaltlog`` for ``-O PREFIX``. It has no job arrays and no warning signal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from hpctrain.config.common import DirectiveValue, walltime_seconds
from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.config.walltime import format_minutes
from hpctrain.errors import SchedulerError
from hpctrain.submission.schedulers.base import (
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
    directive_options,
    directive_value,
    double_dash_option,
    merged_directives,
    queue_submit_name,
    requeue_block,
    resubmit_action,
)
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import directive_word

if TYPE_CHECKING:
    from hpctrain.submission.discovery.facts import Fact, SchedulerFacts
    from hpctrain.submission.discovery.probe import Probe

# --attrs: name=value pairs joined by ':' (values may hold ',' lists, never another ':').
_ATTRS = re.compile(r"[A-Za-z0-9_-]+=[A-Za-z0-9_.,/-]+(?::[A-Za-z0-9_-]+=[A-Za-z0-9_.,/-]+)*")


# --- status: the state map (codes to JobState) and the parsers of the status commands ----------------
# Source: Cobalt's qstat states.
# Cobalt's qstat only knows live jobs: a finished job disappears (→ MISSING); its exit code lives in the
# <jobid>.cobaltlog. "exiting" and "killing" are therefore still active.
COBALT_STATES: dict[str, JobState] = {
    "queued": JobState.PENDING,
    "user_hold": JobState.PENDING,
    "admin_hold": JobState.PENDING,
    "dep_hold": JobState.PENDING,
    "maxrun_hold": JobState.PENDING,
    "user_hold:dep_hold": JobState.PENDING,
    "dep_fail": JobState.FAILED,  # a dependency failed: the job will never run
    "starting": JobState.RUNNING,
    "running": JobState.RUNNING,
    "exiting": JobState.RUNNING,
    "killing": JobState.RUNNING,
    "done": JobState.COMPLETED,
}


COBALT_REASONS: dict[str, str] = {
    "user_hold": "held by the user (qrls ID)",
    "admin_hold": "held by an administrator",
    "dep_hold": "waiting for a job it depends on to finish",
    "maxrun_hold": "you have the maximum number of running jobs allowed",
    "dep_fail": "will never start: a job it depends on failed",
    "killing": "being killed",
}


def cobalt_qstat_argv(job_ids: Iterable[str]) -> list[str]:
    """Cobalt ``qstat -l -f``: one ``Key: value`` block per live job."""
    return ["qstat", "-l", "-f", *job_ids]


def parse_cobalt_qstat(text: str) -> dict[str, JobStatus]:
    """Parse Cobalt ``qstat -l -f``: blocks starting ``JobID: N`` followed by ``Key : value`` lines."""
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "JobID":
            blocks.append({"JobID": value})
        elif blocks and key:
            blocks[-1].setdefault(key, value)
    out: dict[str, JobStatus] = {}
    for b in blocks:
        job_id = b["JobID"]
        raw = b.get("State", "")
        state = COBALT_STATES.get(raw)
        reason = COBALT_REASONS.get(raw, "")
        if state is None:
            # Combined holds read "user_hold:dep_hold"; anything with "hold" is still pending.
            state = JobState.PENDING if "hold" in raw else JobState.FAILED
            reason = reason or (raw.replace("_", " ") if "hold" in raw else f"unknown Cobalt state {raw!r}")
        exit_text = b.get("ExitStatus") or b.get("exit_status") or ""
        exit_code = int(exit_text) if exit_text.lstrip("-").isdigit() else None
        out[job_id] = JobStatus(job_id, state, reason, exit_code, 0, raw)
    return out


class Cobalt(Scheduler):
    name = "cobalt"
    directive_prefix = "#COBALT"
    job_id_variable = "COBALT_JOBID"
    job_environment = "hpctrain.job_environment:COBALT"
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
        opts = [f"-n {res.allocated_nodes}", f"-t {format_minutes(walltime_seconds(res.walltime))}"]
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
        opts += directive_options(directives, double_dash_option(" "))
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
        argv = cobalt_qstat_argv([check_job_id(j) for j in jobs])
        return [[StatusProbe("qstat", "live", argv, parse_cobalt_qstat)]]

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["qdel", check_job_id(job_id)]

    def log_names(self, job_id: str) -> list[str]:
        return ["cobalt.output"]


    def directive_value_problem(self, key: str, value: DirectiveValue) -> str | None:
        if key == "attrs" and not (isinstance(value, str) and _ATTRS.fullmatch(value)):
            return (f"directive 'attrs': {value!r} is not Cobalt's name=value[:name=value...] "
                    "(e.g. mcdram=cache:numa=quad)")
        return None

    # -- discovery ---------------------------------------------------------------------------------------
    def detects(self, probe: Probe) -> bool:
        from hpctrain.submission.schedulers.cobalt.discovery import is_cobalt_queue_table

        return super().detects(probe) or is_cobalt_queue_table(probe.out("qstat_queues"))

    def probe_lines(self) -> list[str]:
        return ["have qstat && run qstat_queues qstat -Q", "run cobalt_partlist partlist"]

    def read_discovery(self, probe: Probe) -> SchedulerFacts:
        from hpctrain.submission.schedulers.cobalt.discovery import read_cobalt

        return read_cobalt(probe)

    def discovered_launcher(self, probe: Probe, mpi: Fact[str] | None) -> Fact[str] | None:
        from hpctrain.submission.discovery.environment import batch_launcher

        return batch_launcher(probe, mpi, prefer_aprun=True)


SCHEDULER = Cobalt()
