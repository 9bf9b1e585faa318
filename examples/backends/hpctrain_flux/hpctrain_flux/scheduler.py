"""Flux as LLNL runs it (El Capitan, Tuolumne): ``flux batch`` reads ``#FLUX:`` directives, prints the job id and
returns; ``flux jobs`` reports states; ``flux cancel`` cancels. Sources: flux-core's man pages flux-batch(1),
flux-jobs(1), flux-cancel(1), job-other-options.rst (``--signal=SIG@TIME``) and the flux-docs FAQ (job ids)."""

from __future__ import annotations

from collections.abc import Mapping

from hpctrain.config.common import walltime_seconds
from hpctrain.submission.schedulers.base import (
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
    directive_options,
    double_dash_option,
    merged_directives,
    queue_submit_name,
)
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import directive_word

# ``flux jobs`` {status}: the active states, then the results of inactive jobs (flux-jobs(1), "JOB STATUS").
STATES = {"DEPEND": JobState.PENDING, "PRIORITY": JobState.PENDING, "SCHED": JobState.PENDING,
          "RUN": JobState.RUNNING, "CLEANUP": JobState.RUNNING, "COMPLETED": JobState.COMPLETED,
          "FAILED": JobState.FAILED, "CANCELED": JobState.CANCELLED, "TIMEOUT": JobState.TIMEOUT}
STATUS_FORMAT = "{id.f58} {status} {returncode}"


def ascii_job_id(text: str) -> str:
    """A Flux id as an argument can carry it: F58 ids start with ``ƒ``, or ``f`` where UTF-8 is not available; flux
    takes both (flux-docs FAQ)."""
    return text.strip().replace("ƒ", "f", 1)


def parse_flux_jobs(text: str) -> dict[str, JobStatus]:
    """``flux jobs -a -n -o STATUS_FORMAT``: one job per line."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        job, status = ascii_job_id(words[0]), words[1]
        code = words[2] if len(words) > 2 and words[2].lstrip("-").isdigit() else None
        out[job] = JobStatus(job, STATES.get(status, JobState.FAILED), exit_code=int(code) if code else None,
                             raw_state=status)
    return out


class Flux(Scheduler):
    name = "flux"
    title = "Flux"
    directive_prefix = "#FLUX:"
    job_id_variable = "FLUX_ENCLOSING_ID"  # what the batch script sees of its own job (flux-environment(7))
    job_environment = "hpctrain_flux.job_environment:FLUX"
    launchers = ("flux-run",)
    mpiexec_launcher = "flux-run"
    dependency_kinds = ("afterok", "afterany", "afternotok")
    supports_hold = True
    commands = ("flux",)
    detect_programs = ("flux",)
    script_note = ("# Flux sends SIG${signal} to this script and its tasks ${signal_lead_s} s before the time limit "
                   "(--signal);\n# the launch section below forwards it to the ranks so they checkpoint.")
    reserved_directives = frozenset({"nodes", "N", "time-limit", "t", "job-name", "queue", "q", "bank", "B",
                                     "signal", "exclusive", "x", "output", "error", "dependency", "urgency"})
    job_key_directives = frozenset({"exclusive"})

    def render_directives(self, job, site, placement, options: RenderOptions) -> list[str]:
        res, ckpt = job.resources, job.checkpoint
        minutes = -(-walltime_seconds(res.walltime) // 60)  # flux-batch: the time limit in minutes by default
        opts = [f"--nodes={res.nodes}", "--exclusive", f"--time-limit={minutes}m",
                f"--job-name={directive_word(job.name, what='job name')}",
                f"--signal={ckpt.signal}@{ckpt.signal_lead_s}s"]
        queue = queue_submit_name(placement)
        if queue:
            opts.append(f"--queue={directive_word(queue, what='queue')}")
        if placement.account:
            opts.append(f"--bank={directive_word(placement.account, what='account')}")
        opts += directive_options(merged_directives(site, placement, job), double_dash_option("="))
        return check_directive_lines([f"{self.directive_prefix} {o}" for o in opts], self.directive_prefix)

    def submit_argv(self, script_path, *, dependency=None, array=None, array_dir=None, hold=False) -> list[str]:
        dependency = check_request(self, dependency=dependency, array=array, hold=hold)
        argv = ["flux", "batch"]
        if dependency:
            argv.append(f"--dependency={dependency[0]}:{dependency[1]}")
        if hold:
            argv.append("--urgency=hold")
        return [*argv, script_path]

    def parse_job_id(self, stdout: str) -> str:
        lines = [line for line in stdout.splitlines() if line.strip()]
        return check_job_id(ascii_job_id(lines[-1])) if lines else check_job_id("")

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        argv = ["flux", "jobs", "-a", "-n", "-o", STATUS_FORMAT, *jobs]
        return [[StatusProbe("flux jobs", "live", argv, parse_flux_jobs)]]

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["flux", "cancel", check_job_id(job_id)]

    def log_names(self, job_id: str) -> list[str]:
        # flux batch's default --output is flux-{{id}}.out in the directory it ran in (the run directory).
        return [f"flux-{job_id}.out", f"flux-{job_id.replace('f', 'ƒ', 1)}.out"]


SCHEDULER = Flux()
