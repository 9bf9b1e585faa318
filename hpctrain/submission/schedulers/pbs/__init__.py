"""PBS Pro back-end (Polaris, Aurora): ``#PBS`` directives with ``-l select=``, ``qsub``, ``qstat -F json``.

PBS sends no warning signal before the walltime, so the script starts its own timer (see the template);
PBS cannot requeue a running job from inside it, so after a checkpoint the script submits itself again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from hpctrain.config.common import DirectiveValue
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
    directive_options,
    directive_value,
    merged_directives,
    queue_submit_name,
    requeue_block,
    resubmit_action,
)
from hpctrain.submission.schedulers.exit_status import PBS_SIGNAL_BASE, death_signal, ended_text
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import directive_word

if TYPE_CHECKING:
    from hpctrain.submission.discovery.facts import Fact, SchedulerFacts
    from hpctrain.submission.discovery.probe import Probe

# PBS Pro allows job names up to 236 characters (qsub(1B), -N).
MAX_NAME = 236
# `qstat -a` prints a queue name in a column of 8 characters.
QSTAT_QUEUE_WIDTH = 8
# Job states of `qstat -a` that a per-user queued limit (max_queued) does not count: finished (F, X; C in Torque).
_ENDED_STATES = frozenset({"F", "X", "C"})


def count_queued(text: str, queue: str) -> int:
    """Jobs in ``queue`` that have not ended, from ``qstat -a -u USER`` (columns: Job ID, Username, Queue, Jobname,
    SessID, NDS, TSK, Memory, Time, S, Time): the queue is the third word, the state the second from the end
    (a job name may hold spaces in Torque's output). A queue name longer than the column matches on its
    first 8 characters."""
    shown = queue[:QSTAT_QUEUE_WIDTH]
    count = 0
    for line in text.splitlines():
        words = line.split()
        if len(words) < 11 or not words[0][:1].isdigit():
            continue
        if words[2] == shown and words[-2] not in _ENDED_STATES:
            count += 1
    return count


# --- status: the state map (codes to JobState) and the parsers of the status commands ----------------
# Sources: the PBS Pro Reference Guide, "Job States" and the JOB_EXEC_* exit statuses.
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
    if exit_status > PBS_SIGNAL_BASE:
        signal = exit_status - PBS_SIGNAL_BASE
        # MoM kills an over-walltime job with SIGTERM then SIGKILL and says so in the comment; a plain
        # SIGTERM/SIGKILL is what qdel sends.
        if "walltime" in comment.lower():
            return JobState.TIMEOUT, f"{ended_text(exit_status)} after exceeding its walltime"
        if signal in (9, 15):
            return JobState.CANCELLED, f"{ended_text(exit_status)} (qdel)"
        return JobState.FAILED, ended_text(exit_status)
    if death_signal(exit_status) is not None:  # the script exited with what its launcher said of a killed rank
        return JobState.FAILED, ended_text(exit_status)
    return JobState.FAILED, f"exited with status {exit_status}"


def pbs_qstat_argv(job_ids: Iterable[str]) -> list[str]:
    """PBS Pro ``qstat`` including finished jobs (-x), full (-f), as JSON."""
    return ["qstat", "-x", "-f", "-F", "json", *job_ids]


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
            if exit_code is not None and exit_code > PBS_SIGNAL_BASE:
                signal = exit_code - PBS_SIGNAL_BASE
        elif raw == "H":
            reason = "held" + (f": {comment}" if comment else "")
        elif state is JobState.PENDING and comment:
            reason = comment
        out[job_id] = JobStatus(job_id, state, reason, exit_code, restarts, raw, signal)
    return out


class PBSPro(Scheduler):
    name = "pbs"
    directive_prefix = "#PBS"
    job_id_variable = "PBS_JOBID"
    job_environment = "hpctrain.job_environment:PBS"
    needs_signal_timer = True
    array_index_variable = "PBS_ARRAY_INDEX"
    mpiexec_launcher = "mpiexec-pals"  # HPE Cray PALS, the mpiexec of PBS Pro machines (Polaris, Aurora)
    # PALS's mpiexec, or ALPS's aprun on Cray XC machines under PBS (srun needs Slurm's step daemons); hpctrain's
    # local launcher starts the ranks of a one-node job on the node the script runs on, under any scheduler.
    launchers = ("mpiexec", "aprun", "local")
    dependency_kinds = ("afterok", "afterany", "afternotok", "after")
    supports_hold = True
    title = "PBS"
    script_note = ("# PBS Pro sends no warning before the walltime: a timer in this shell raises SIG${signal} "
                   "${signal_lead_s} s\n# before it, and the launch section forwards the signal to the ranks so "
                   "they checkpoint.")
    commands = ("qsub", "qstat", "qdel", "qalter", "qrls", "qhold", "pbsnodes")
    detect_programs = ("qstat", "pbsnodes")
    probe_programs = ("qsub",)
    probe_variables = ("PBS_EXEC",)
    detect_order = 30  # after Cobalt, whose qstat -Q table tells it from PBS
    # Options hpctrain writes itself (one-letter options and -l resources alike); the one-letter options a
    # profile or job may set (longer ones are -l resources, any name a site defines, none choosing code); the
    # options that choose the job's shell, interpreter or environment (trusted only).
    reserved_directives = frozenset({
        "N", "q", "A", "o", "e", "j", "J", "l", "W", "select", "walltime", "place", "filesystems", "nodes",
        "ncpus", "mem", "ngpus", "mpiprocs", "ompthreads"})
    allowed_directives = frozenset({"a", "c", "h", "k", "m", "M", "p", "P", "r"})
    trusted_only_directives = frozenset({"S", "v", "V", "u", "C", "I", "X", "T", "G"})

    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        res, node = job.resources, placement.node
        assert isinstance(node.cores, int) and isinstance(node.gpus, int)
        name = directive_word(job.name, what="job name")[:MAX_NAME]
        # The whole node's hardware threads and its GPU packages (Aurora: 6 GPUs, though ranks get 12 tiles).
        chunk = [str(res.allocated_nodes), f"ncpus={node.physical_cores * node.threads_per_core}"]
        if node.gpus > 0:
            chunk.append(f"ngpus={node.gpus // node.devices_per_gpu}")
        if res.memory_mb is not None:  # whole MiB, rounded up: int(GB) wrote mem=0gb below 1 GB
            chunk.append(f"mem={res.memory_mb}mb")
        chunk.append(f"mpiprocs={res.ranks_per_node}")
        chunk.append(f"ompthreads={res.threads_per_rank}")
        place = "scatter:excl" if res.exclusive else "scatter"
        opts = [f"-N {name}", f"-l select={':'.join(chunk)}", f"-l walltime={res.walltime}", f"-l place={place}"]
        # A PBS Pro reservation is a queue of its own (R123456): the job is submitted to it.
        queue = res.reservation or queue_submit_name(placement)
        if queue:
            opts.append(f"-q {directive_word(queue, what='queue')}")
        if placement.account:
            opts.append(f"-A {directive_word(placement.account, what='account')}")
        if site.filesystems:
            opts.append(f"-l filesystems={':'.join(directive_word(f, what='filesystem') for f in site.filesystems)}")
        opts += [f"-o {options.log_path('pbs.out')}", "-j oe"]
        opts += directive_options(merged_directives(site, placement, job),
                                  lambda key, value: f"-l {key}={directive_value(value, key=key)}")
        return check_directive_lines([f"{self.directive_prefix} {o}" for o in opts], self.directive_prefix)

    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, array_dir: str | None = None, hold: bool = False) -> list[str]:
        # Array tasks share the script's -o file (PBS joins sub-job output names with the index itself).
        argv = ["qsub"]
        dep = check_request(self, dependency=dependency, array=array, hold=hold)
        if dep:
            argv += ["-W", f"depend={dep[0]}:{dep[1]}"]
        if array:
            argv += ["-J", directive_word(array, what="array range")]
        if hold:
            argv += ["-h"]
        return [*argv, script_path]

    def requeue_lines(self, script_path: str, max_requeues: int) -> list[str]:
        # PBS cannot requeue from inside a job: submit the same script again, after this job ends.
        return requeue_block("HPCTRAIN_RESTART_COUNT", max_requeues, resubmit_action("PBS_JOBID", (
            f'qsub -W depend=afterany:"${{PBS_JOBID}}" -v HPCTRAIN_RESTART_COUNT="$((restarts + 1))" {script_path}')))

    def parse_job_id(self, stdout: str) -> str:
        # qsub prints the full id, e.g. "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov".
        for line in reversed(stdout.strip().splitlines()):
            word = line.strip()
            if word and word.split(".")[0].rstrip("[]").isdigit():
                return check_job_id(word)
        raise SchedulerError(f"no job id in qsub output {stdout.strip()[:200]!r}")

    def array_task_id(self, master: str, index: int) -> str:
        # "123[].server" -> "123[4].server"
        return master.replace("[]", f"[{index}]", 1) if "[]" in master else f"{master}[{index}]"

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        argv = pbs_qstat_argv([check_job_id(j) for j in jobs])
        return [[StatusProbe("qstat", "live", argv, parse_pbs_qstat_json)]]

    def queued_jobs_probe(self, site: SiteProfile, queue_key: str) -> QueuedJobsProbe | None:
        # qselect would list exactly these jobs, but Torque-style qstat is what every PBS flavour answers; the
        # user is the one the command runs as (here or on the login node), so it is asked on that side.
        name = site.queues[queue_key].submit_as or queue_key
        return QueuedJobsProbe("qstat -a", ["sh", "-c", 'exec qstat -a -u "$(id -un)"'],
                               lambda text: count_queued(text, name))

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["qdel", check_job_id(job_id)]

    def signal_argv(self, job_id: str, run_dir: str, signal_name: str) -> list[str] | None:
        return ["qsig", "-s", signal_name, check_job_id(job_id)]  # to the job's session leader: the batch shell

    def log_names(self, job_id: str) -> list[str]:
        # A server that ignores `#PBS -o` (the torque wrappers over Slurm) writes its default job.sh.o<seq>.
        return ["pbs.out", f"job.sh.o{job_id.split('.')[0]}"]


    def directive_allowed(self, key: str) -> bool:
        return len(key) > 1 or super().directive_allowed(key)

    def directive_value_problem(self, key: str, value: DirectiveValue) -> str | None:
        if len(key) > 1 and isinstance(value, str) and "," in value:
            return f"PBS resource {key!r}: a ',' in the value would add another resource to the -l list"
        return None

    # -- discovery ---------------------------------------------------------------------------------------
    def probe_lines(self) -> list[str]:
        return ["have qstat && run qstat_queues qstat -Q",
                "have qstat && { run pbs_queues_json qstat -Q -f -F json || run pbs_queues qstat -Q -f; }",
                "have qstat && run pbs_server qstat -B -f",
                "have pbsnodes && { run pbs_nodes_json pbsnodes -a -F json || run pbs_nodes pbsnodes -a; }"]

    def read_discovery(self, probe: Probe) -> SchedulerFacts:
        from hpctrain.submission.schedulers.pbs.discovery import read_pbs

        return read_pbs(probe)

    def discovered_launcher(self, probe: Probe, mpi: Fact[str] | None) -> Fact[str] | None:
        from hpctrain.submission.discovery.environment import batch_launcher

        return batch_launcher(probe, mpi, prefer_aprun=False)

    def discovery_notes(self, probe: Probe, launcher: Fact[str], mpi: Fact[str] | None) -> list[str]:
        if launcher.value == "mpiexec" and (mpi is None or mpi.value != "CRAY MPICH"):
            return ["under PBS, launcher mpiexec is rendered with HPE PALS's options (--ppn, --depth, --cpu-bind); "
                    f"check that {probe.programs.get('mpiexec', 'mpiexec')} is PALS's or accepts them"]
        return []


SCHEDULER = PBSPro()
