"""One job-state enum shared by every scheduler back-end, and plain tables from each scheduler's codes to it.

Tables follow the PSI/J layout: a dict per scheduler from its state code to ``JobState``, plus Slurm's pending
reason codes to readable words. Sources: Slurm squeue(1) "JOB STATE CODES"/"JOB REASON CODES", the PBS Pro
Reference Guide "Job States" and ``JOB_EXEC_*`` exit statuses, and Cobalt's qstat states.
"""

from __future__ import annotations

import enum


class JobState(enum.Enum):
    """What hpctrain needs to know about a scheduler job; TIMEOUT is kept apart from FAILED."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    MISSING = "missing"  # the scheduler no longer knows the job

    @property
    def is_terminal(self) -> bool:
        """True when the job will not change state again by itself (MISSING counts: nothing left to poll)."""
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        """True while the job is queued, running or about to be requeued: worth polling again."""
        return not self.is_terminal


_TERMINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.CANCELLED,
        JobState.PREEMPTED,
        JobState.MISSING,
    }
)

# --- Slurm -----------------------------------------------------------------------------------------------
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

# --- PBS Pro ---------------------------------------------------------------------------------------------
# job_state letters. F (finished) and X (finished sub-job) need Exit_status to say how it ended.
PBS_STATES: dict[str, JobState] = {
    "Q": JobState.PENDING,  # queued
    "H": JobState.PENDING,  # held
    "W": JobState.PENDING,  # waiting for its Execution_Time
    "T": JobState.PENDING,  # transiting between servers
    "M": JobState.PENDING,  # moved to another server (query that server)
    "B": JobState.RUNNING,  # array job has begun
    "R": JobState.RUNNING,
    "E": JobState.RUNNING,  # exiting after having run
    "S": JobState.RUNNING,  # suspended by the server
    "U": JobState.RUNNING,  # suspended: workstation busy
    "F": JobState.COMPLETED,  # finished; refined by Exit_status
    "X": JobState.COMPLETED,  # finished sub-job; refined by Exit_status
}

# Negative Exit_status values are PBS's own JOB_EXEC_* codes (PBS Pro job.h); 256+N means killed by signal N.
PBS_EXEC_CODES: dict[int, tuple[str, JobState]] = {
    -1: ("JOB_EXEC_FAIL1: job exec failed before files, no retry", JobState.FAILED),
    -2: ("JOB_EXEC_FAIL2: job exec failed after files, no retry", JobState.FAILED),
    -3: ("JOB_EXEC_RETRY: job exec failed, will be retried", JobState.REQUEUED),
    -4: ("JOB_EXEC_INITABT: job aborted on MoM initialization", JobState.FAILED),
    -5: ("JOB_EXEC_INITRST: job aborted on MoM init, checkpoint, no migrate", JobState.FAILED),
    -6: ("JOB_EXEC_INITRMG: job aborted on MoM init, checkpoint, ok migrate", JobState.FAILED),
    -7: ("JOB_EXEC_BADRESRT: job restart failed", JobState.FAILED),
    -10: ("JOB_EXEC_FAILUID: invalid uid/gid for job", JobState.FAILED),
    -11: ("JOB_EXEC_RERUN: job was rerun", JobState.REQUEUED),
    -12: ("JOB_EXEC_CHKP: job was checkpointed and killed", JobState.REQUEUED),
    -13: ("JOB_EXEC_FAIL_PASSWORD: job failed due to a bad password", JobState.FAILED),
    -14: ("JOB_EXEC_RERUN_ON_SIS_FAIL: job requeued after a sister MoM failed", JobState.REQUEUED),
    -15: ("JOB_EXEC_QUERST: requeue job for restart from checkpoint", JobState.REQUEUED),
    -16: ("JOB_EXEC_FAILHOOK_RERUN: a hook failed; job requeued", JobState.REQUEUED),
    -17: ("JOB_EXEC_FAILHOOK_DELETE: a hook failed; job deleted", JobState.FAILED),
    -18: ("JOB_EXEC_HOOK_RERUN: a hook requested a rerun", JobState.REQUEUED),
    -19: ("JOB_EXEC_HOOK_DELETE: a hook requested deletion", JobState.CANCELLED),
    -20: ("JOB_EXEC_RERUN_MS_FAIL: mother superior connection lost; job requeued", JobState.REQUEUED),
    -21: ("JOB_EXEC_FAIL_SECURITY: security setup failed", JobState.FAILED),
    -22: ("JOB_EXEC_HOOKERROR: a hook errored", JobState.FAILED),
    -23: ("JOB_EXEC_FAIL_KRB5: Kerberos credentials failed", JobState.FAILED),
    -24: ("JOB_EXEC_KILL_NCPUS_BURST: killed for using too many CPUs (burst)", JobState.FAILED),
    -25: ("JOB_EXEC_KILL_NCPUS_SUM: killed for using too many CPUs", JobState.FAILED),
    -26: ("JOB_EXEC_KILL_VMEM: killed for exceeding its vmem", JobState.FAILED),
    -27: ("JOB_EXEC_KILL_MEM: killed for exceeding its memory", JobState.FAILED),
    -28: ("JOB_EXEC_KILL_CPUT: killed for exceeding its CPU time", JobState.TIMEOUT),
    -29: ("JOB_EXEC_KILL_WALLTIME: killed for exceeding its walltime", JobState.TIMEOUT),
}


def pbs_exit_state(exit_status: int | None, comment: str = "") -> tuple[JobState, str]:
    """Interpret a finished PBS job's Exit_status (and comment) as a state plus a readable reason."""
    if exit_status is None:
        # Deleted before it ran: PBS leaves Exit_status unset and says so in the comment.
        if "delet" in comment.lower():
            return JobState.CANCELLED, "deleted before it ran"
        return JobState.COMPLETED, ""
    if exit_status == 0:
        return JobState.COMPLETED, ""
    if exit_status in PBS_EXEC_CODES:
        text, state = PBS_EXEC_CODES[exit_status]
        return state, text
    if exit_status < 0:
        return JobState.FAILED, f"PBS exec failure code {exit_status}"
    if exit_status > 256:
        signal = exit_status - 256
        # MoM kills an over-walltime job with SIGTERM then SIGKILL and says so in the comment; a plain
        # SIGTERM/SIGKILL is what qdel sends.
        if "walltime" in comment.lower():
            return JobState.TIMEOUT, f"killed by signal {signal} after exceeding its walltime"
        if signal in (9, 15):
            return JobState.CANCELLED, f"killed by signal {signal} (qdel)"
        return JobState.FAILED, f"killed by signal {signal}"
    return JobState.FAILED, f"exited with status {exit_status}"


# --- Cobalt ----------------------------------------------------------------------------------------------
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
