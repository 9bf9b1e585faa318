"""Slurm back-end: ``#SBATCH`` directives, ``sbatch --parsable``, status through sacct/squeue/scontrol.

Status polling falls back along sacct (slurmdbd) then ``sacct -c`` (job-completion file) for accounting, and
``squeue -t all`` then ``scontrol show job`` for the live view: real sites differ in which of these work.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.errors import SchedulerError
from hpctrain.submission.schedulers import status_parsers as sp
from hpctrain.submission.schedulers.base import (
    QueuedJobsProbe,
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
    count_lines,
    directive_value,
    merged_directives,
    queue_submit_name,
    requeue_block,
)
from hpctrain.submission.shell import directive_word


class Slurm(Scheduler):
    name = "slurm"
    directive_prefix = "#SBATCH"
    template = "slurm.tmpl"
    job_id_variable = "SLURM_JOB_ID"
    array_index_variable = "SLURM_ARRAY_TASK_ID"
    launchers = ("srun", "mpiexec", "local")  # or MPICH's hydra (proxies started through Slurm), one node
    dependency_kinds = ("afterok", "afterany", "afternotok", "after")
    supports_hold = True
    # A requeued job is held until its BeginTime (about cred_expire seconds): not a start time anyone asked for.
    requeue_hold_reasons = frozenset({sp.slurm_reason("BeginTime")})

    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        res, plan = job.resources, options.plan
        opts = [f"--job-name={directive_word(job.name, what='job name')}",
                f"--nodes={res.nodes}",
                f"--ntasks-per-node={res.ranks_per_node}",
                f"--cpus-per-task={plan.cpus_per_task}"]
        if plan.threads_per_core is not None:
            opts.append(f"--threads-per-core={plan.threads_per_core}")
        if res.gpus_per_rank > 0:
            opts.append(f"--gpus-per-task={res.gpus_per_rank}")
        if res.memory_mb is not None:  # rounded up: --mem=0 means all of the node's memory to Slurm
            opts.append(f"--mem={res.memory_mb}M")
        opts.append(f"--time={res.walltime}")
        queue = queue_submit_name(placement)
        if queue:
            opts.append(f"--{site.queue_option}={directive_word(queue, what='queue')}")
        if placement.queue is not None and placement.queue.qos:  # a queue that is a QOS on a partition
            opts.append(f"--qos={directive_word(placement.queue.qos, what='qos')}")
        if placement.account:
            opts.append(f"--account={directive_word(placement.account, what='account')}")
        if res.reservation:
            opts.append(f"--reservation={directive_word(res.reservation, what='reservation')}")
        if res.exclusive:
            opts.append("--exclusive")
        opts += [f"--output={options.log_path('slurm-%j.out')}",
                 f"--error={options.log_path('slurm-%j.out')}",
                 f"--signal=B:{job.checkpoint.signal}@{job.checkpoint.signal_lead_s}",
                 # A queue that forbids chaining gets no --requeue: the job stops at its checkpoint.
                 *(["--requeue"] if placement.requeue else []),
                 "--open-mode=append"]
        for key, value in merged_directives(site, placement, job).items():
            if value is None or value is False:
                continue
            if len(key) == 1:
                opts.append(f"-{key}" if value is True else f"-{key} {directive_value(value, key=key)}")
            else:
                opts.append(f"--{key}" if value is True else f"--{key}={directive_value(value, key=key)}")
        return check_directive_lines([f"{self.directive_prefix} {o}" for o in opts], self.directive_prefix)

    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, array_dir: str | None = None, hold: bool = False) -> list[str]:
        argv = ["sbatch", "--parsable"]
        dep = check_request(self, dependency=dependency, array=array, hold=hold)
        if dep:
            argv.append(f"--dependency={dep[0]}:{dep[1]}")
        if array:
            argv.append(f"--array={directive_word(array, what='array range')}")
            if array_dir:
                # Each task's output goes to its own run directory (command-line options beat #SBATCH lines).
                out = f"{array_dir}_%a/slurm-%A_%a.out"
                argv += [f"--output={out}", f"--error={out}"]
        if hold:
            argv.append("--hold")
        return [*argv, script_path]

    def array_task_id(self, master: str, index: int) -> str:
        return f"{master}_{index}"

    def parse_job_id(self, stdout: str) -> str:
        # --parsable prints "ID" or "ID;cluster"; without it "Submitted batch job ID".
        for line in reversed(stdout.strip().splitlines()):
            word = line.strip().split(";")[0].split()[-1] if line.strip() else ""
            if word.isdigit():
                return word
        raise SchedulerError(f"no job id in sbatch output {stdout.strip()[:200]!r}")

    def test_only_argv(self, script_path: str) -> list[str] | None:
        return ["sbatch", "--test-only", script_path]

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        ids = [check_job_id(j) for j in jobs]
        scontrol = sp.scontrol_argv(ids[0]) if len(ids) == 1 else ["scontrol", "show", "job", "-o"]
        return [
            [StatusProbe("sacct", "accounting", sp.sacct_argv(ids), sp.parse_sacct),
             StatusProbe("sacct -c", "accounting", sp.sacct_completion_argv(ids), sp.parse_sacct_completion,
                         ended_runs=True)],
            [StatusProbe("squeue", "live", sp.squeue_argv(ids), sp.parse_squeue),
             StatusProbe("scontrol", "live", scontrol, sp.parse_scontrol_job)],
        ]

    def queued_jobs_probe(self, site: SiteProfile, queue_key: str) -> QueuedJobsProbe | None:
        # MaxSubmitPU counts every job of the user under the QOS that is not finished, an array's tasks one by
        # one (-r); --me is the user squeue runs as, here or on the login node.
        queue = site.queues[queue_key]
        name = queue.submit_as or queue_key
        argv = ["squeue", "--me", "-h", "-r", "-t", "PD,CF,R,S", "-o", "%i"]
        if site.queue_option == "qos":
            argv += ["-q", name]
        else:
            argv += ["-p", name, *(["-q", queue.qos] if queue.qos else [])]
        return QueuedJobsProbe("squeue", argv, count_lines)

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["scancel", check_job_id(job_id)]

    def signal_argv(self, job_id: str, run_dir: str, signal_name: str) -> list[str] | None:
        # --batch: to the batch shell only, as --signal=B:SIG@LEAD sends the warning.
        return ["scancel", "--batch", f"--signal={signal_name}", check_job_id(job_id)]

    def log_names(self, job_id: str) -> list[str]:
        # An array task's id (123_4) names its file too: --output=..._%a/slurm-%A_%a.out.
        return [f"slurm-{job_id}.out"]

    def requeue_lines(self, script_path: str, max_requeues: int) -> list[str]:
        # The job keeps its id; Slurm counts restarts in SLURM_RESTART_COUNT (the job has --requeue).
        return requeue_block("SLURM_RESTART_COUNT", max_requeues,
                             ['scontrol requeue "${SLURM_JOB_ID}" && exit 0'])


SCHEDULER = Slurm()
