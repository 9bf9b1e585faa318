"""Slurm's job states and pending reasons, its status commands (sacct, ``sacct -c``, squeue, ``scontrol show job``)
and the parsers of their output: what the Slurm back-end's status probes run and read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from hpctrain.submission.schedulers.base import NodeAvailability
from hpctrain.submission.schedulers.exit_status import ended_text
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus, PastRun

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
    "RaisedSignal": "the job was ended by a signal",
    "InactiveLimit": "the job reached the system's InactiveLimit",
    "DeadLine": "the job could not finish before its deadline",
    "BurstBufferOperation": "a burst buffer operation failed",
}


def parse_sinfo_nodes(text: str) -> list[NodeAvailability]:
    """``sinfo -h -N -p PART -o SINFO_NODES_FORMAT``: one NodeAvailability per node (a node listed twice once)."""
    nodes: dict[str, NodeAvailability] = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if not name or not state:
            continue
        base = state.strip().lower().rstrip("*~#!%$@^-+")
        words = set(base.split("+"))
        usable = not (state.strip().endswith("*") or words & UNUSABLE_NODE_STATES)
        reason = "" if reason.strip() in ("none", "(null)") else reason.strip()
        nodes.setdefault(name, NodeAvailability(name, usable, state.strip(), reason))
    return list(nodes.values())


def slurm_state(code: str) -> JobState:
    """Map a Slurm state as printed by squeue/sacct/scontrol ("CANCELLED by 0", "RUNNING") to JobState."""
    word = code.strip().split(" ", 1)[0].rstrip("+")
    if not word:
        raise ValueError("empty Slurm state")
    try:
        return SLURM_STATES[word.upper()]
    except KeyError:
        raise ValueError(f"unknown Slurm job state {code!r}") from None


# The reasons Slurm gives a job when it ends it (its FAIL_* codes, and a dependency that can never be met, for which
# a job may be cancelled). Every other code says why a job waits; Slurm keeps the last one on a job that has since
# started or ended (sacct's Reason of a requeued job that completed is BeginTime, the hold after its requeue; so is
# squeue's of one cancelled in that hold), where it no longer says anything true.
SLURM_END_REASONS = frozenset({
    "NonZeroExitCode", "RaisedSignal", "TimeLimit", "OutOfMemory", "JobLaunchFailure", "SystemFailure", "NodeDown",
    "PartitionDown", "BadConstraints", "InactiveLimit", "InvalidAccount", "InvalidQOS", "BurstBufferOperation",
    "DeadLine", "DependencyNeverSatisfied"})
# States whose reason says why the job waits: queued, or requeued and about to queue again.
_WAITING_STATES = frozenset({JobState.PENDING, JobState.REQUEUED})


def job_reason(state: JobState, reason: str) -> str:
    """Readable words for the reason Slurm gives a job in ``state``: a reason to wait only while the job waits."""
    code = reason.strip().partition(",")[0]
    if state not in _WAITING_STATES and code not in SLURM_END_REASONS:
        return ""
    return slurm_reason(reason)


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

SINFO_NODES_FORMAT = "%N|%T|%E"  # node, long state (suffix * = not responding), reason (may contain '|')
# Node states (sinfo %T) in which no new job will be placed on the node until someone or something acts: an
# administrator resumes it, or it answers again. Jobs can still wait for the others (allocated, completing).
UNUSABLE_NODE_STATES = frozenset({"down", "drained", "draining", "drain", "fail", "failing", "future", "inval",
                                  "unknown", "not_responding", "blocked"})


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
        words = job_reason(state, reason)
    except ValueError:
        # The completion file loses the state when a job name holds a space; treat what we cannot read
        # as a failure rather than guess success.
        state = JobState.FAILED
        words = slurm_reason(reason) or f"unreadable Slurm state {raw!r}"
    exit_code, signal = parse_slurm_exit_code(exit_text)
    if raw.startswith("CANCELLED by"):
        words = words or f"cancelled by uid {raw.split()[-1]}"
    if signal and state in (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT):
        words = (words + "; " if words else "") + ended_text(exit_code, signal)
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
    earlier: dict[str, tuple[PastRun, ...]] = {}
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
        # sacct -D lists a requeued job once per run, oldest first: the earlier runs, and how each ended.
        if job_id in out:
            earlier[job_id] = (*earlier.get(job_id, ()), PastRun(out[job_id].raw_state, out[job_id].nodes))
        status = _slurm_status(job_id, raw, get("ExitCode"), get("Reason"), len(earlier.get(job_id, ())))
        out[job_id] = replace(status, earlier_runs=earlier.get(job_id, ()), nodes=get("NodeList").strip())
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
