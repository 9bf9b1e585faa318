"""Pure parsers from scheduler status output (sacct, sacct -c, squeue, scontrol, qstat) to JobStatus.

Each parser takes the command's stdout as text and returns ``{job_id: JobStatus}``; none runs a command. The
argv that produces the expected layout is given next to each parser (``SACCT_FIELDS`` ...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hpctrain.submission.schedulers.state import (
    COBALT_REASONS,
    COBALT_STATES,
    PBS_STATES,
    JobState,
    pbs_exit_state,
    slurm_reason,
    slurm_state,
)


@dataclass(frozen=True)
class JobStatus:
    """The state of one scheduler job as hpctrain records it."""

    job_id: str
    state: JobState
    reason_text: str = ""
    exit_code: int | None = None
    restart_count: int = 0
    raw_state: str = ""
    signal: int | None = None  # the signal that ended the job, when the scheduler says
    # The current run has ended and is being cleaned up (Slurm's COMPLETING): accounting may already hold it.
    run_ended: bool = False


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


def pbs_qstat_argv(job_ids: Iterable[str]) -> list[str]:
    """PBS Pro ``qstat`` including finished jobs (-x), full (-f), as JSON."""
    return ["qstat", "-x", "-f", "-F", "json", *job_ids]


def cobalt_qstat_argv(job_ids: Iterable[str]) -> list[str]:
    """Cobalt ``qstat -l -f``: one ``Key: value`` block per live job."""
    return ["qstat", "-l", "-f", *job_ids]


_UNKNOWN_JOB = re.compile(r"Invalid job id specified|Unknown Job Id|Job has finished|does not exist", re.I)


def is_unknown_job_error(stderr: str) -> bool:
    """True when a status command failed only because the scheduler has forgotten the job(s)."""
    return bool(_UNKNOWN_JOB.search(stderr))


# --- Slurm -----------------------------------------------------------------------------------------------


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


# --- PBS Pro ---------------------------------------------------------------------------------------------


def parse_pbs_qstat_json(text: str) -> dict[str, JobStatus]:
    """Parse PBS Pro ``qstat -x -f -F json``: ``{"Jobs": {"123.server": {"job_state": ...}}}``."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"qstat -F json output is not JSON: {exc}") from None
    jobs: Mapping[str, Mapping[str, object]] = doc.get("Jobs", {}) or {}
    out: dict[str, JobStatus] = {}
    for job_id, attrs in jobs.items():
        raw = str(attrs.get("job_state", ""))
        comment = str(attrs.get("comment", ""))
        exit_status = attrs.get("Exit_status")
        exit_code = int(exit_status) if isinstance(exit_status, int | str) and str(exit_status) else None
        restarts = max(int(attrs.get("run_count", 0) or 0) - 1, 0)
        state = PBS_STATES.get(raw)
        if state is None:
            out[job_id] = JobStatus(job_id, JobState.FAILED, f"unknown PBS job_state {raw!r}", exit_code,
                                    restarts, raw)
            continue
        reason = ""
        signal = None
        if raw in ("F", "X"):
            state, reason = pbs_exit_state(exit_code, comment)
            if exit_code is not None and exit_code > 256:
                signal = exit_code - 256
        elif raw == "H":
            reason = "held" + (f": {comment}" if comment else "")
        elif state is JobState.PENDING and comment:
            reason = comment
        out[job_id] = JobStatus(job_id, state, reason, exit_code, restarts, raw, signal)
    return out


# --- Cobalt ----------------------------------------------------------------------------------------------


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


# --- combining ---------------------------------------------------------------------------------------------


def _found(job_id: str, results: Mapping[str, JobStatus]) -> list[JobStatus]:
    if job_id in results:
        return [results[job_id]]
    # An array job queried by its master id answers with its tasks (123_0, 123_[4-9]).
    return [s for k, s in results.items() if k.startswith(job_id + "_")]


def merge_status(
    queried_ids: Iterable[str], *partial_results: Mapping[str, JobStatus]
) -> dict[str, JobStatus]:
    """Combine answers from several sources (earlier ones take precedence); ids found nowhere are MISSING.

    Array tasks answered for a queried master id are kept under their own ids.
    """
    out: dict[str, JobStatus] = {}
    for job_id in queried_ids:
        for results in partial_results:
            hits = _found(job_id, results)
            if hits:
                for s in hits:
                    out.setdefault(s.job_id if s.job_id != job_id else job_id, s)
                break
        else:
            out[job_id] = JobStatus(job_id, JobState.MISSING, "the scheduler no longer knows this job")
    return out
