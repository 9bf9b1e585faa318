"""Slurm back-end: ``#SBATCH`` directives, ``sbatch --parsable``, status through sacct/squeue/scontrol.

Status polling falls back along sacct (slurmdbd) then ``sacct -c`` (job-completion file) for accounting, and
``squeue -t all`` then ``scontrol show job`` for the live view: real sites differ in which of these work. The
state map and the status parsers are in status.py, the reader of ``hpctrain sites discover``'s answers (and
what a partition's QOS does to its limits) in discovery.py, loaded only when discovery asks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.errors import SchedulerError
from hpctrain.submission.schedulers.base import (
    NodesProbe,
    QueuedJobsProbe,
    RenderOptions,
    Scheduler,
    StatusProbe,
    check_directive_lines,
    check_job_id,
    check_request,
    count_lines,
    directive_options,
    double_dash_option,
    merged_directives,
    queue_submit_name,
    requeue_block,
)
from hpctrain.submission.schedulers.slurm.status import (
    SINFO_NODES_FORMAT,
    parse_sacct,
    parse_sacct_completion,
    parse_scontrol_job,
    parse_sinfo_nodes,
    parse_squeue,
    sacct_argv,
    sacct_completion_argv,
    scontrol_argv,
    slurm_reason,
    squeue_argv,
)
from hpctrain.submission.shell import ShellWord, directive_word

if TYPE_CHECKING:
    from hpctrain.submission.discovery.facts import Fact, QosFacts, QueueFacts, SchedulerFacts
    from hpctrain.submission.discovery.probe import Probe


class Slurm(Scheduler):
    name = "slurm"
    directive_prefix = "#SBATCH"
    job_id_variable = "SLURM_JOB_ID"
    job_environment = "hpctrain.job_environment:SLURM"
    array_index_variable = "SLURM_ARRAY_TASK_ID"
    launchers = ("srun", "mpiexec", "local")  # or MPICH's hydra (proxies started through Slurm), one node
    dependency_kinds = ("afterok", "afterany", "afternotok", "after")
    supports_hold = True
    # A requeued job is held until its BeginTime (about cred_expire seconds): not a start time anyone asked for.
    requeue_hold_reasons = frozenset({slurm_reason("BeginTime")})
    node_failure_states = frozenset({"NODE_FAIL", "NF"})
    title = "Slurm"
    script_note = ("# Slurm sends SIG${signal} to this batch shell ${signal_lead_s} s before the walltime "
                   "(--signal=B:...); the\n# launch section below forwards it to the ranks so they checkpoint; the "
                   "script's end requeues the job\n# (--requeue) where the queue allows it.")
    has_qos = True
    queue_options = ("partition", "qos")  # sbatch --partition (the default) or --qos carries the queue name
    commands = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "salloc")
    detect_programs = ("sinfo", "scontrol")
    probe_programs = ("sacctmgr", "srun", "sbatch", "squeue")
    launch_programs = ("srun",)
    probe_variables = ("SLURM_CONF",)
    detect_order = 10  # first: sites often install PBS-style qstat wrappers beside Slurm
    # Options hpctrain writes itself from the checked job; a site directive with the same name would override
    # what the fit check passed. Allowed: resources, placement, accounting, mail and timing options; trusted
    # only: what chooses the job's shell, interpreter, container or exported environment.
    reserved_directives = frozenset({
        "J", "job-name", "N", "nodes", "n", "ntasks", "ntasks-per-node", "c", "cpus-per-task", "gpus-per-task",
        "mem", "t", "time", "p", "partition", "q", "qos", "A", "account", "o", "output", "e", "error",
        "signal", "requeue", "no-requeue", "open-mode", "a", "array", "d", "dependency", "H", "hold", "wrap",
        "D", "chdir", "threads-per-core"})
    allowed_directives = frozenset({
        "constraint", "C", "gres", "gres-flags", "gpus", "G", "gpus-per-node", "gpus-per-socket", "gpu-bind",
        "gpu-freq", "cpus-per-gpu", "mem-per-cpu", "mem-per-gpu", "mem-bind", "ntasks-per-socket",
        "ntasks-per-core", "ntasks-per-gpu", "sockets-per-node", "cores-per-socket", "B", "extra-node-info",
        "mincpus", "tmp", "tres-per-task", "exclusive", "oversubscribe", "s", "overcommit", "O", "contiguous",
        "spread-job", "use-min-nodes", "switches", "network", "hint", "distribution", "m", "cpu-freq", "S",
        "core-spec", "thread-spec", "prefer", "exclude", "x", "nodelist", "w", "reservation", "licenses", "L",
        "bb", "segment", "delay-boot", "mail-type", "mail-user", "comment", "wckey", "mcs-label", "profile",
        "acctg-freq", "power", "nice", "priority", "begin", "b", "deadline", "kill-on-invalid-dep", "k",
        "no-kill", "M", "clusters", "cluster-constraint"})
    trusted_only_directives = frozenset({
        "export", "export-file", "container", "container-id", "get-user-env", "propagate", "uid", "gid", "x11",
        "bbf", "nodefile", "F"})
    job_key_directives = frozenset({"exclusive", "reservation"})
    excludes_nodes = True
    lost_node_pattern = r"Node failure on (\S+)"  # srun's "srun: error: Node failure on NAME"

    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        res, plan = job.resources, options.plan
        opts = [f"--job-name={directive_word(job.name, what='job name')}",
                f"--nodes={res.allocated_nodes}",
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
            opts.append(f"--{self.queue_option(site)}={directive_word(queue, what='queue')}")
        if placement.queue is not None and placement.queue.qos:  # a queue that is a QOS on a partition
            opts.append(f"--qos={directive_word(placement.queue.qos, what='qos')}")
        if placement.account:
            opts.append(f"--account={directive_word(placement.account, what='account')}")
        if res.reservation:
            opts.append(f"--reservation={directive_word(res.reservation, what='reservation')}")
        if res.exclusive:
            opts.append("--exclusive")
        if res.spare_nodes:  # a node failing under the job ends its step, not the allocation: the spares replace it
            opts.append("--no-kill")
        if options.excluded_nodes:
            excluded = ",".join(directive_word(n, what="excluded node") for n in options.excluded_nodes)
            opts.append(f"--exclude={excluded}")
        opts += [f"--output={options.log_path('slurm-%j.out')}",
                 f"--error={options.log_path('slurm-%j.out')}",
                 f"--signal=B:{job.checkpoint.signal}@{job.checkpoint.signal_lead_s}",
                 # A queue that forbids chaining gets no --requeue: the job stops at its checkpoint.
                 *(["--requeue"] if placement.requeue else []),
                 "--open-mode=append"]
        opts += directive_options(merged_directives(site, placement, job), double_dash_option("="))
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
        scontrol = scontrol_argv(ids[0]) if len(ids) == 1 else ["scontrol", "show", "job", "-o"]
        return [
            [StatusProbe("sacct", "accounting", sacct_argv(ids), parse_sacct),
             StatusProbe("sacct -c", "accounting", sacct_completion_argv(ids), parse_sacct_completion,
                         ended_runs=True)],
            [StatusProbe("squeue", "live", squeue_argv(ids), parse_squeue),
             StatusProbe("scontrol", "live", scontrol, parse_scontrol_job)],
        ]

    def queued_jobs_probe(self, site: SiteProfile, queue_key: str) -> QueuedJobsProbe | None:
        # MaxSubmitPU counts every job of the user under the QOS that is not finished, an array's tasks one by
        # one (-r); --me is the user squeue runs as, here or on the login node.
        queue = site.queues[queue_key]
        name = queue.submit_as or queue_key
        argv = ["squeue", "--me", "-h", "-r", "-t", "PD,CF,R,S", "-o", "%i"]
        if self.queue_option(site) == "qos":
            argv += ["-q", name]
        else:
            argv += ["-p", name, *(["-q", queue.qos] if queue.qos else [])]
        return QueuedJobsProbe("squeue", argv, count_lines)

    def nodes_probe(self, site: SiteProfile, queue_key: str) -> NodesProbe | None:
        if self.queue_option(site) == "qos":  # a QOS spans partitions: no node list to ask for
            return None
        queue = site.queues[queue_key]
        return NodesProbe("sinfo", ["sinfo", "-h", "-N", "-p", queue.submit_as or queue_key, "-o", SINFO_NODES_FORMAT],
                          parse_sinfo_nodes)

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["scancel", check_job_id(job_id)]

    def signal_argv(self, job_id: str, run_dir: str, signal_name: str) -> list[str] | None:
        # --batch: to the batch shell only, as --signal=B:SIG@LEAD sends the warning.
        return ["scancel", "--batch", f"--signal={signal_name}", check_job_id(job_id)]

    def log_names(self, job_id: str) -> list[str]:
        # An array task's id (123_4) names its file too: --output=..._%a/slurm-%A_%a.out.
        return [f"slurm-{job_id}.out"]

    def lost_nodes_argv(self, run_dir: str, job_id: str) -> list[str] | None:
        # srun writes "srun: error: Node failure on NAME" to the job's error stream when slurmctld gives a node
        # up; the log's last MiB holds the attempt that ended so.
        log = f"{run_dir}/{self.log_names(check_job_id(job_id))[0]}"
        return ["sh", "-c", 'tail -c 1048576 -- "$1" 2>/dev/null | grep -a "Node failure on" | tail -n 64', "sh", log]

    def parse_lost_nodes(self, text: str) -> list[str]:
        return list(dict.fromkeys(re.findall(self.lost_node_pattern, text)))

    def job_log_word(self) -> ShellWord | None:
        return ShellWord("slurm-", ("SLURM_JOB_ID",), ".out")  # --output=slurm-%j.out in the run directory

    def requeue_lines(self, script_path: str, max_requeues: int) -> list[str]:
        # The job keeps its id; Slurm counts restarts in SLURM_RESTART_COUNT (the job has --requeue). Slurm takes a
        # job's excluded nodes (the run's blamed ones) only while it is pending, so they follow the requeue in the
        # same scontrol process: the requeue also ends this script, and a second scontrol started after it may not
        # run at all.
        return requeue_block("SLURM_RESTART_COUNT", max_requeues, [
            'if [ -n "${hpctrain_excluded_nodes:-}" ]; then',
            "    printf 'requeue %s\\nupdate JobId=%s ExcNodeList=%s\\n' \"${SLURM_JOB_ID}\" \"${SLURM_JOB_ID}\" "
            '"${hpctrain_excluded_nodes}" | scontrol && exit 0',
            "else",
            '    scontrol requeue "${SLURM_JOB_ID}" && exit 0',
            "fi"])


    # -- discovery (discovery.py) -----------------------------------------------------------------------------
    def probe_lines(self) -> list[str]:
        from hpctrain.submission.schedulers.slurm.discovery import QOS_FORMAT, SINFO_FORMAT

        return ["run slurm_partitions scontrol show partition -o", "run slurm_nodes scontrol show node -o",
                f"run slurm_sinfo sinfo -h -o '{SINFO_FORMAT}'", "run slurm_config scontrol show config",
                'have sacctmgr && run slurm_assoc sacctmgr -nP show assoc "user=$u" format=Account,Partition,QOS',
                f"have sacctmgr && run slurm_qos sacctmgr -nP show qos format={QOS_FORMAT}",
                "have srun && run slurm_mpi srun --mpi=list"]

    def read_discovery(self, probe: Probe) -> SchedulerFacts:
        from hpctrain.submission.schedulers.slurm.discovery import read_slurm

        return read_slurm(probe)

    def discovered_launcher(self, probe: Probe, mpi: Fact[str] | None) -> Fact[str] | None:
        from hpctrain.submission.discovery.facts import learned

        return learned("srun", "Slurm's own launcher" + (" (found)" if "srun" in probe.programs else ""))

    def discovered_launcher_args(self, facts: SchedulerFacts, mpi: Fact[str] | None) -> Fact[list[str]] | None:
        from hpctrain.submission.schedulers.slurm.discovery import srun_mpi_args

        return srun_mpi_args(facts, mpi)

    def with_qos(self, queue: QueueFacts, qos: QosFacts) -> QueueFacts:
        from hpctrain.submission.schedulers.slurm.discovery import with_qos

        return with_qos(queue, qos)

    def is_qos_limit(self, fact: Fact[Any]) -> bool:
        from hpctrain.submission.schedulers.slurm.discovery import is_qos_limit

        return is_qos_limit(fact)


SCHEDULER = Slurm()
