"""IBM Spectrum LSF as OLCF documented it for Summit: ``bsub SCRIPT`` (not ``bsub < SCRIPT``) reads ``#BSUB``
directives and prints ``Job <ID> is submitted to ... queue <NAME>.``; ``bjobs`` reports states; ``bkill`` cancels.
Sources: OLCF Summit user guide (archived), "Batch Scripts", "Common bsub Options", "Job States"; IBM LSF 10.1
``bjobs -o`` and ``bsub -W``; LSF's ``-wa``/``-wt`` warning action (IBM LSF 9.1.1 bsub option list)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from hpctrain.config.common import walltime_seconds
from hpctrain.submission.schedulers.base import (
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
    queue_submit_name,
)
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import directive_word

STATES = {"PEND": JobState.PENDING, "PSUSP": JobState.PENDING, "WAIT": JobState.PENDING, "RUN": JobState.RUNNING,
          "USUSP": JobState.RUNNING, "SSUSP": JobState.RUNNING, "DONE": JobState.COMPLETED,
          "POST_DONE": JobState.COMPLETED, "EXIT": JobState.FAILED, "POST_ERR": JobState.FAILED,
          "UNKWN": JobState.RUNNING, "ZOMBI": JobState.FAILED}
SUBMITTED = re.compile(r"^Job <(?P<id>\d+)> is submitted", re.MULTILINE)
LOG_NAME = "lsf-%J.out"  # %J: the job id (Summit guide, -o)


def parse_bjobs(text: str) -> dict[str, JobStatus]:
    """``bjobs -a -noheader -o "jobid stat exit_code"``: one job per line, ``-`` where there is no exit code."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or not words[0].isdigit():
            continue
        code = words[2] if len(words) > 2 and words[2].isdigit() else None
        out[words[0]] = JobStatus(words[0], STATES.get(words[1], JobState.FAILED),
                                  exit_code=int(code) if code else None, raw_state=words[1])
    return out


class Lsf(Scheduler):
    name = "lsf"
    title = "LSF"
    directive_prefix = "#BSUB"
    job_id_variable = "LSB_JOBID"
    job_environment = "hpctrain_lsf.job_environment:LSF"
    launchers = ("jsrun",)
    mpiexec_launcher = "jsrun"
    dependency_kinds = ("afterok", "afterany", "afternotok")
    commands = ("bsub", "bjobs", "bkill")
    detect_programs = ("bsub",)
    script_note = ("# LSF sends SIG${signal} to this script ${signal_lead_s} s before the run limit (-wa/-wt);\n"
                   "# the launch section below forwards it to the ranks so they checkpoint.")
    reserved_directives = frozenset({"nnodes", "W", "J", "o", "e", "q", "P", "w", "wa", "wt"})
    allowed_directives = frozenset({"alloc_flags", "U", "N", "B", "G"})
    # bsub -w conditions (Summit guide, "Job Dependencies").
    CONDITIONS = {"afterok": "done", "afterany": "ended", "afternotok": "exit"}

    def render_directives(self, job, site, placement, options: RenderOptions) -> list[str]:
        res, ckpt = job.resources, job.checkpoint
        minutes = -(-walltime_seconds(res.walltime) // 60)  # -W [hours:]minutes
        name = directive_word(job.name, what="job name")
        opts = [f"-nnodes {res.nodes}", f"-W {minutes // 60}:{minutes % 60:02d}", f"-J {name}",
                f"-o {options.log_path(LOG_NAME)}", f"-wa {ckpt.signal}", f"-wt {-(-ckpt.signal_lead_s // 60)}"]
        queue = queue_submit_name(placement)
        if queue:
            opts.append(f"-q {directive_word(queue, what='queue')}")
        if placement.account:
            opts.append(f"-P {directive_word(placement.account, what='account')}")
        for key, value in {**site.directives, **job.resources.directives}.items():
            opts.append(f"-{key} {directive_word(str(value), what=f'directive {key!r}:')}")
        return check_directive_lines([f"{self.directive_prefix} {o}" for o in opts], self.directive_prefix)

    def submit_argv(self, script_path, *, dependency=None, array=None, array_dir=None, hold=False) -> list[str]:
        dependency = check_request(self, dependency=dependency, array=array, hold=hold)
        wait = ["-w", f"{self.CONDITIONS[dependency[0]]}({dependency[1]})"] if dependency else []
        return ["bsub", *wait, script_path]

    def parse_job_id(self, stdout: str) -> str:
        match = SUBMITTED.search(stdout)
        return check_job_id(match["id"] if match else stdout.strip())

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        argv = ["bjobs", "-a", "-noheader", "-o", "jobid stat exit_code", *jobs]
        return [[StatusProbe("bjobs", "live", argv, parse_bjobs)]]

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["bkill", check_job_id(job_id)]

    def log_names(self, job_id: str) -> list[str]:
        return [LOG_NAME.replace("%J", job_id)]


SCHEDULER = Lsf()
