"""Slurm back-end: ``#SBATCH`` directives, ``sbatch --parsable``, status through sacct/squeue/scontrol.

Status polling falls back along sacct (slurmdbd) then ``sacct -c`` (job-completion file) for accounting, and
``squeue -t all`` then ``scontrol show job`` for the live view: real sites differ in which of these work.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.errors import SchedulerError
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
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import directive_word

if TYPE_CHECKING:
    from hpctrain.submission.discovery.facts import Fact, SchedulerFacts
    from hpctrain.submission.discovery.probe import Probe


# --- status: the state map (codes to JobState) and the parsers of the status commands ----------------
# Sources: squeue(1) "JOB STATE CODES" and "JOB REASON CODES".
# Long names (squeue %T, sacct State, scontrol JobState) and the short codes (squeue %t). PREEMPTED is
# terminal for the job record: with requeue enabled Slurm reports the job as REQUEUED/PENDING instead.
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "PD": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,  # nodes allocated, booting: not running user code yet
    "CF": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "R": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # some processes still alive; the final state comes next
    "CG": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,  # holds its allocation; resumes by itself
    "S": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "ST": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "SI": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SO": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "RS": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "CD": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "F": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "NF": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "OOM": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "BF": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,  # exited with the site's requeue-and-hold special exit code
    "SE": JobState.FAILED,
    "TIMEOUT": JobState.TIMEOUT,
    "TO": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,  # could not finish before its --deadline
    "DL": JobState.TIMEOUT,
    "CANCELLED": JobState.CANCELLED,
    "CA": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,  # federation: a sibling job started elsewhere
    "RV": JobState.CANCELLED,
    "PREEMPTED": JobState.PREEMPTED,
    "PR": JobState.PREEMPTED,
    "REQUEUED": JobState.REQUEUED,
    "RQ": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "RH": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "RF": JobState.REQUEUED,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RD": JobState.PENDING,
}


# Slurm pending/hold reasons (squeue %r, scontrol Reason=) in words a researcher understands.
SLURM_REASONS: dict[str, str] = {
    "None": "",
    "Priority": "waiting: other jobs have higher priority",
    "Resources": "waiting for nodes to become free",
    "Dependency": "waiting for a job it depends on to finish",
    "DependencyNeverSatisfied": "will never start: a job it depends on failed (cancel and resubmit)",
    "BeginTime": "waiting for its requested start time",
    "JobHeldUser": "held by the user (scontrol release ID)",
    "JobHeldAdmin": "held by an administrator",
    "BadConstraints": "will never start: its constraints cannot be met by any node",
    "ReqNodeNotAvail": "a required node is down, drained or reserved",
    "PartitionTimeLimit": "walltime is above the partition's limit",
    "PartitionNodeLimit": "node count is outside the partition's limits",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "PartitionConfig": "the request does not match the partition's configuration",
    "NodeDown": "a node it needs is down",
    "Reservation": "waiting for its advanced reservation",
    "Licenses": "waiting for a license",
    "InvalidAccount": "the account is invalid (check --account)",
    "InvalidQOS": "the QOS is invalid (check --qos)",
    "QOSMaxNodePerJobLimit": "node count is above the QOS per-job limit",
    "QOSMaxWallDurationPerJobLimit": "walltime is above the QOS per-job limit",
    "QOSMaxJobsPerUserLimit": "you have the maximum number of running jobs allowed by the QOS",
    "QOSMaxSubmitJobPerUserLimit": "you have the maximum number of submitted jobs allowed by the QOS",
    "QOSMaxCpuPerJobLimit": "CPU count is above the QOS per-job limit",
    "QOSJobLimit": "the QOS has its maximum number of jobs",
    "QOSResourceLimit": "the QOS has used its resource limit",
    "QOSGrpNodeLimit": "the QOS group has all the nodes it may use",
    "QOSGrpCpuLimit": "the QOS group has all the CPUs it may use",
    "QOSNotAllowed": "the QOS is not allowed for this account or partition",
    "AssocGrpNodeLimit": "your account's group has all the nodes it may use",
    "AssocGrpCpuLimit": "your account's group has all the CPUs it may use",
    "AssocGrpJobsLimit": "your account's group has its maximum number of running jobs",
    "AssocMaxJobsLimit": "your account has its maximum number of running jobs",
    "AssocMaxWallDurationPerJobLimit": "walltime is above your account's per-job limit",
    "AssocGrpBillingMinutes": "your account has used its allocation (billing minutes)",
    "AssocGrpCPUMinutesLimit": "your account has used its CPU-minutes allocation",
    "JobLaunchFailure": "the job could not be launched (file system or node problem)",
    "NonZeroExitCode": "the job exited with a non-zero exit code",
    "TimeLimit": "the job reached its walltime",
    "SystemFailure": "failure of the Slurm system, a file system or the network",
    "Prolog": "the prolog program is still running",
    "launch failed requeued held": "launch failed; requeued and held (scontrol release ID)",
    "BeginTime,Dependency": "waiting for its start time and a dependency",
    "Cleaning": "the job is being requeued and is still cleaning up",
    "FrontEndDown": "no front-end node is available",
    "OutOfMemory": "the job ran out of memory",
    "MaxRequeueExceeded": "the job was requeued too many times",
}


def slurm_state(code: str) -> JobState:
    """Map a Slurm state as printed by squeue/sacct/scontrol ("CANCELLED by 0", "RUNNING") to JobState."""
    word = code.strip().split(" ", 1)[0].rstrip("+")
    if not word:
        raise ValueError("empty Slurm state")
    try:
        return SLURM_STATES[word.upper()]
    except KeyError:
        raise ValueError(f"unknown Slurm job state {code!r}") from None


def slurm_reason(reason: str) -> str:
    """Readable words for a Slurm reason code; unknown codes are returned as they are."""
    reason = reason.strip()
    if reason in ("", "None", "(null)"):
        return ""
    if reason in SLURM_REASONS:
        return SLURM_REASONS[reason]
    # "ReqNodeNotAvail, UnavailableNodes:nid000050": translate the code, keep the detail.
    code, sep, detail = reason.partition(",")
    if sep and code in SLURM_REASONS:
        return f"{SLURM_REASONS[code]} ({detail.strip()})"
    return reason


# Field lists: the parsers below read exactly these columns, in this order, '|'-separated (-P / %..|..).
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Reason", "Elapsed", "Start", "End", "NodeList")


SACCT_COMPLETION_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Elapsed", "Start", "End", "NodeList")


SQUEUE_FORMAT = "%i|%T|%r|%M|%N|%j"  # job name last: it may itself contain '|'


def sacct_argv(job_ids: Iterable[str]) -> list[str]:
    """``sacct`` for many jobs at once (needs slurmdbd accounting); ``-D`` lists each run of a requeued job,
    oldest first, so ``parse_sacct`` counts the restarts."""
    return ["sacct", "-P", "-n", "-X", "-o", ",".join(SACCT_FIELDS), "-D", "-j", ",".join(job_ids)]


def sacct_completion_argv(job_ids: Iterable[str]) -> list[str]:
    """``sacct -c`` reads the job-completion file (JobCompType=jobcomp/filetxt); it has no Reason column."""
    return ["sacct", "-c", "-P", "-n", "-o", ",".join(SACCT_COMPLETION_FIELDS), "-j", ",".join(job_ids)]


def squeue_argv(job_ids: Iterable[str]) -> list[str]:
    """``squeue`` over all states (finished jobs stay visible for MinJobAge seconds)."""
    return ["squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT, "-j", ",".join(job_ids)]


def scontrol_argv(job_id: str) -> list[str]:
    """``scontrol show job -o`` for one job (or one array)."""
    return ["scontrol", "show", "job", "-o", job_id]


def parse_slurm_exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's ``EXIT:SIGNAL`` ("3:0", "0:9") as (exit code, signal or None)."""
    text = text.strip()
    if not text:
        return None, None
    code, _, sig = text.partition(":")
    try:
        exit_code = int(code)
        signal = int(sig) if sig else 0
    except ValueError:
        return None, None
    return exit_code, (signal or None)


def _slurm_status(
    job_id: str, raw: str, exit_text: str = "", reason: str = "", restarts: int = 0
) -> JobStatus:
    try:
        state = slurm_state(raw)
    except ValueError:
        # The completion file loses the state when a job name holds a space; treat what we cannot read
        # as a failure rather than guess success.
        state = JobState.FAILED
        reason = reason or f"unreadable Slurm state {raw!r}"
    exit_code, signal = parse_slurm_exit_code(exit_text)
    words = slurm_reason(reason)
    if raw.startswith("CANCELLED by"):
        words = words or f"cancelled by uid {raw.split()[-1]}"
    if signal and state in (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT):
        words = (words + "; " if words else "") + f"killed by signal {signal}"
    return JobStatus(job_id, state, words, exit_code, restarts, raw.strip(), signal,
                     run_ended=raw.strip() in ("COMPLETING", "CG"))


def _split_fields(line: str, n: int, name_index: int | None) -> list[str] | None:
    parts = line.split("|")
    if len(parts) < n:
        return None
    if len(parts) > n and name_index is not None:
        extra = len(parts) - n
        name = "|".join(parts[name_index : name_index + extra + 1])
        parts = parts[:name_index] + [name] + parts[name_index + extra + 1 :]
    return parts[:n]


def _is_step(job_id: str) -> bool:
    return "." in job_id  # 123.batch, 123.extern, 123.0, 123_4.batch


def parse_sacct(text: str, fields: tuple[str, ...] = SACCT_FIELDS) -> dict[str, JobStatus]:
    """Parse ``sacct -P -n [-X] -o <fields>``; steps are skipped, a job listed twice keeps its last line."""
    col = {f: i for i, f in enumerate(fields)}
    out: dict[str, JobStatus] = {}
    restarts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = _split_fields(line, len(fields), col.get("JobName"))
        if parts is None:
            continue
        job_id = parts[col["JobID"]].strip()
        if not job_id or _is_step(job_id):
            continue
        raw = parts[col["State"]]
        get = (lambda k, p=parts: p[col[k]] if k in col else "")  # noqa: E731
        # sacct -D lists a requeued job once per run, oldest first: count the earlier runs.
        if job_id in out:
            restarts[job_id] = restarts.get(job_id, 0) + 1
        out[job_id] = _slurm_status(job_id, raw, get("ExitCode"), get("Reason"), restarts.get(job_id, 0))
    return out


def parse_sacct_completion(
    text: str, fields: tuple[str, ...] = SACCT_COMPLETION_FIELDS
) -> dict[str, JobStatus]:
    """Parse ``sacct -c -P -n -o <fields>`` (job-completion file); later records of a job win.

    The filetxt plug-in records only the array's master id for array tasks and loses the state of a
    job whose name holds a space; both cases are still returned (the latter as FAILED with a reason).
    """
    return parse_sacct(text, fields)


def parse_squeue(text: str) -> dict[str, JobStatus]:
    """Parse ``squeue -h -t all -o '%i|%T|%r|%M|%N|%j'`` (see ``SQUEUE_FORMAT``)."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) < 3 or not parts[0].strip():
            continue
        job_id, raw, reason = (p.strip() for p in parts[:3])
        out[job_id] = _slurm_status(job_id, raw, "", reason)
    return out


# Keys in scontrol's one-line output: identifiers that may hold '/' or ':' ("CPUs/Task", "AllocNode:Sid").
_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """Split ``Key=value Key2=value two`` where values may hold spaces (job names, commands)."""
    matches = list(_SCONTROL_KEY.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        end = nxt.start() if nxt else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


def parse_scontrol_job(text: str) -> dict[str, JobStatus]:
    """Parse ``scontrol show job -o ID`` (one line per job; array tasks keyed ``ARRAYID_TASK``)."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        if "JobId=" not in line:
            continue
        kv = parse_key_values(line.strip())
        job_id = kv["JobId"]
        task = kv.get("ArrayTaskId", "")
        if kv.get("ArrayJobId") and task:
            # A pending array range prints like squeue does: 15_[0-3].
            job_id = f"{kv['ArrayJobId']}_{task}" if task.isdigit() else f"{kv['ArrayJobId']}_[{task}]"
        try:
            restarts = int(kv.get("Restarts", "0") or 0)
        except ValueError:
            restarts = 0
        out[job_id] = _slurm_status(
            job_id, kv.get("JobState", ""), kv.get("ExitCode", ""), kv.get("Reason", ""), restarts
        )
    return out


class Slurm(Scheduler):
    name = "slurm"
    directive_prefix = "#SBATCH"
    job_id_variable = "SLURM_JOB_ID"
    array_index_variable = "SLURM_ARRAY_TASK_ID"
    launchers = ("srun", "mpiexec", "local")  # or MPICH's hydra (proxies started through Slurm), one node
    dependency_kinds = ("afterok", "afterany", "afternotok", "after")
    supports_hold = True
    # A requeued job is held until its BeginTime (about cred_expire seconds): not a start time anyone asked for.
    requeue_hold_reasons = frozenset({slurm_reason("BeginTime")})
    title = "Slurm"
    script_note = ("# Slurm sends SIG${signal} to this batch shell ${signal_lead_s} s before the walltime "
                   "(--signal=B:...); the\n# launch section below forwards it to the ranks so they checkpoint; the "
                   "script's end requeues the job\n# (--requeue) where the queue allows it.")
    has_qos = True
    array_job_variable = "SLURM_ARRAY_JOB_ID"
    commands = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "salloc")
    detect_programs = ("sinfo", "scontrol")
    probe_programs = ("sacctmgr", "srun", "sbatch", "squeue")
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


    # -- discovery ---------------------------------------------------------------------------------------
    def probe_lines(self) -> list[str]:
        from hpctrain.submission.discovery.slurm import QOS_FORMAT, SINFO_FORMAT

        return ["run slurm_partitions scontrol show partition -o", "run slurm_nodes scontrol show node -o",
                f"run slurm_sinfo sinfo -h -o '{SINFO_FORMAT}'", "run slurm_config scontrol show config",
                'have sacctmgr && run slurm_assoc sacctmgr -nP show assoc "user=$u" format=Account,Partition,QOS',
                f"have sacctmgr && run slurm_qos sacctmgr -nP show qos format={QOS_FORMAT}",
                "have srun && run slurm_mpi srun --mpi=list"]

    def read_discovery(self, probe: Probe) -> SchedulerFacts:
        from hpctrain.submission.discovery.slurm import read_slurm

        return read_slurm(probe)

    def discovered_launcher(self, probe: Probe, mpi: Fact[str] | None) -> Fact[str] | None:
        from hpctrain.submission.discovery.facts import learned

        return learned("srun", "Slurm's own launcher" + (" (found)" if "srun" in probe.programs else ""))

    def discovered_launcher_args(self, facts: SchedulerFacts, mpi: Fact[str] | None) -> Fact[list[str]] | None:
        from hpctrain.submission.discovery.environment import srun_mpi_args

        return srun_mpi_args(facts, mpi)


SCHEDULER = Slurm()
