"""The contract every batch-scheduler back-end fills in (PSI/J style): its facts, directives, submit, status, cancel.

A back-end is one module or package (here: ``slurm/``, ``pbs/``, ``cobalt/``, ``local.py``) holding one
``Scheduler`` subclass as ``SCHEDULER``: its directives, commands, status parsers and state map, directive rules and
discovery (a package keeps its discovery reader in ``discovery.py``, loaded only when discovery asks).
Every back-end's script is ``templates/job.tmpl`` with its ``script_note`` unless it brings its own template folder.
Each names its ``job_environment``: what runs inside the job asks it for job id, nodes, array index and restarts.
Back-ends only build argv lists and directive lines and parse text; nothing here runs a command.
``get_scheduler(name)`` finds a back-end in the registry (config/backends.py): the built-ins, and any package's
entry point in the group ``hpctrain.schedulers``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hpctrain.config.backends import SCHEDULERS
from hpctrain.config.common import DirectiveValue, FieldProblem
from hpctrain.config.fit import Placement, check_fit
from hpctrain.config.job import JobSpec
from hpctrain.config.site import MPIEXEC, SiteProfile, directive_problems
from hpctrain.errors import ConfigError, FitError, SchedulerError
from hpctrain.exit_codes import EXIT_REQUEUE
from hpctrain.submission.launchers import LaunchPlan
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.shell import ShellWord, directive_word, is_home_relative

if TYPE_CHECKING:  # discovery/ imports the registry below: no import of it while this module loads
    from hpctrain.submission.discovery.facts import Fact, QosFacts, QueueFacts, SchedulerFacts
    from hpctrain.submission.discovery.probe import Probe

# The batch script's own record of how it ended, one JSON line per event, in the run directory: read by status
# polling when the scheduler no longer lists a job (Cobalt's qstat, PBS without job history) or did not answer.
EXIT_LOG = "job-exit.jsonl"


def exit_record_line(job_id_variable: str) -> str:
    """Shell line appending ``{"event": "exit", "job": ID, "status": N}`` to EXIT_LOG (``$status`` is set)."""
    return (f"printf '{{\"event\": \"exit\", \"job\": \"%s\", \"status\": %s}}\\n' "
            f'"${{{job_id_variable}:-none}}" "${{status}}" >> {EXIT_LOG} 2>/dev/null || true')


def resubmit_action(job_id_variable: str, qsub_line: str) -> list[str]:
    """Lines that run ``qsub_line`` (submitting this script again) and, when it succeeds, record
    ``{"event": "resubmit", "job": OLD, "new_job": NEW}`` in EXIT_LOG (the new id is qsub's last output line)
    and exit 0. The schedulers that cannot requeue a job in place (PBS, Cobalt) use it."""
    return [
        f"if new_job=$({qsub_line}); then",
        "    new_job=$(printf '%s\\n' \"${new_job}\" | tail -n 1)",
        f"    printf '{{\"event\": \"resubmit\", \"job\": \"%s\", \"new_job\": \"%s\"}}\\n' "
        f'"${{{job_id_variable}:-none}}" "${{new_job}}" >> {EXIT_LOG} 2>/dev/null || true',
        '    echo "hpctrain: resubmitted as job ${new_job}"',
        "    exit 0",
        "fi",
    ]


DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok", "after")
_JOB_ID = re.compile(r"^[A-Za-z0-9_.\[\]-]+$")
_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


@dataclass(frozen=True)
class RenderOptions:
    """What a back-end needs beyond job, site and placement to write its directives."""

    run_dir: str
    spec_path: str
    plan: LaunchPlan
    excluded_nodes: tuple[str, ...] = ()  # nodes the job must not get (blamed in this run, or named by a person)

    def log_path(self, file_name: str) -> str:
        """Where a scheduler log goes, as a directive word.

        Directive lines are not expanded by a shell, so a run directory under ``~``/``$HOME`` is written as
        a bare file name: the scheduler resolves it against the directory ``qsub``/``sbatch`` ran in,
        which is the run directory (the submit step runs there).
        """
        if is_home_relative(self.run_dir):
            return directive_word(file_name, what="log file")
        return directive_word(f"{self.run_dir.rstrip('/')}/{file_name}", what="run directory")


ProbeRole = Literal["accounting", "live"]


@dataclass(frozen=True)
class StatusProbe:
    """One status command for many jobs at once, and the parser of its output.

    ``role``: ``accounting`` knows how jobs ended (exit codes) but may lag or know only ended jobs;
    ``live`` knows queued and running jobs and may forget finished ones. ``ended_runs``: every record the
    probe returns is one run of the job that ended (``sacct -c``), so an active job with a record was requeued.
    """

    name: str  # shown in messages: "sacct -c", "squeue"
    role: ProbeRole
    argv: list[str]
    parse: Callable[[str], dict[str, JobStatus]]
    ended_runs: bool = False


@dataclass(frozen=True)
class QueuedJobsProbe:
    """The command that lists the submitting user's jobs waiting or running in one queue, and how many of those
    its output lists (what a per-user submit limit such as Slurm's MaxSubmitPU or PBS's max_queued counts)."""

    name: str  # shown in messages: "squeue", "qstat -a"
    argv: list[str]
    count: Callable[[str], int]


@dataclass(frozen=True)
class NodeAvailability:
    """One node of a queue as the scheduler lists it: whether a new job can be placed on it (now or once the jobs
    on it end), its state as the scheduler writes it, and the reason an administrator or the scheduler gave."""

    name: str
    usable: bool
    state: str
    reason: str = ""


@dataclass(frozen=True)
class NodesProbe:
    """The command that lists the nodes of one queue with their states, and the parser of its output."""

    name: str  # shown in messages: "sinfo"
    argv: list[str]
    parse: Callable[[str], list[NodeAvailability]]


def count_lines(text: str) -> int:
    """Non-empty lines: one job each (``squeue -h -o %i``)."""
    return sum(1 for line in text.splitlines() if line.strip())


class Scheduler(ABC):
    """One batch scheduler: the facts hpctrain needs about it and the commands that drive it.

    Subclasses set the class attributes below (``name``, ``template``, ``job_id_variable`` are required) and
    implement the abstract methods; everything else has a default that fits a scheduler without the feature.
    """

    name: ClassVar[str]
    template: ClassVar[str] = "job.tmpl"  # file name in template_dir, else schedulers/templates/: the script layout
    template_dir: ClassVar[Path | None] = None  # a plug-in's own templates, looked in before hpctrain's
    # The job-side half: ``module:attribute`` of the JobEnvironment (hpctrain/job_environment.py) naming the
    # variables this scheduler sets in its jobs (job id, node list, array index, restart count). A plug-in's is
    # exported by its scripts and imported by each rank; it should import nothing heavy.
    job_environment: ClassVar[str] = ""
    job_id_variable: ClassVar[str]  # set in the batch shell, for the log line and the exit record
    directive_prefix: ClassVar[str] = ""
    needs_signal_timer: ClassVar[bool] = False  # True when the scheduler sends no warning before the walltime
    array_index_variable: ClassVar[str | None] = None  # set in each array task to its index; None: no arrays
    dependency_kinds: ClassVar[tuple[str, ...]] = ()  # what ``--after RUN:KIND`` may ask for; (): none
    supports_hold: ClassVar[bool] = False
    submits_over_ssh: ClassVar[bool] = True  # False: the scheduler is this machine (no --remote)
    max_nodes: ClassVar[int | None] = None  # None: the queue's limits decide
    launchers: ClassVar[tuple[str, ...] | None] = None  # launchers that can start ranks here; None: any
    # Per-job options of ``resources`` this scheduler can honour (the rest are refused by check_job).
    job_options: ClassVar[frozenset[str]] = frozenset({"exclusive", "reservation", "directives"})
    mpiexec_launcher: ClassVar[str] = "mpiexec-hydra"  # the registered launcher a site's `mpiexec` means here
    # Pending reasons (as JobStatus.reason_text) that only mean "held briefly after a requeue".
    requeue_hold_reasons: ClassVar[frozenset[str]] = frozenset()
    # The scheduler's own words (JobStatus.raw_state) for "a node of the job stopped answering": the job ended
    # with it (and, where the job may requeue, is run again without it).
    node_failure_states: ClassVar[frozenset[str]] = frozenset()
    title: ClassVar[str] = ""  # in messages ("Slurm"); the name where empty
    script_note: ClassVar[str] = ""  # comment lines of the script on how the walltime warning comes (template)
    runs_here: ClassVar[bool] = False  # no scheduler: jobs run on the machine they are submitted from
    has_qos: ClassVar[bool] = False  # a queue may name a QOS beside its partition
    queue_options: ClassVar[tuple[str, ...]] = ()  # a profile's queue_option values, the default first; (): none
    # What the launcher writes in the job's log when the scheduler loses a node under a step (a regular expression,
    # the node's name its first group; "": nothing), read by the next attempt's node check in job_log_word().
    lost_node_pattern: ClassVar[str] = ""
    # Whether ``exclude_directive`` can keep named nodes out of a job (Slurm --exclude); where not, a job's
    # excluded nodes are left out at its start, from its spare nodes (nodes/select.py).
    excludes_nodes: ClassVar[bool] = False
    # Directive rules (config/scheduler_rules.py asks them): options hpctrain writes from the job, the allow-list
    # (None: any option), options only the site's trusted environment.directives may set, and options that
    # are keys of a job's resources.
    reserved_directives: ClassVar[frozenset[str]] = frozenset()
    allowed_directives: ClassVar[frozenset[str] | None] = None
    trusted_only_directives: ClassVar[frozenset[str]] = frozenset()
    job_key_directives: ClassVar[frozenset[str]] = frozenset()
    # Discovery (discovery/detect.py): the programs whose presence on a login node tells this scheduler is there,
    # more programs whose path the probe reports, its own launcher programs (looked for in a login shell too),
    # and the order in which back-ends are asked (lowest first).
    detect_programs: ClassVar[tuple[str, ...]] = ()
    probe_programs: ClassVar[tuple[str, ...]] = ()
    launch_programs: ClassVar[tuple[str, ...]] = ()
    probe_variables: ClassVar[tuple[str, ...]] = ()  # environment variables the probe records (SLURM_CONF)
    detect_order: ClassVar[int] = 100
    # Its command names: a missing one is reported as "load the <title> module" (transport.py).
    commands: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [a for a in ("name", "job_id_variable") if not getattr(cls, a, "")]
        if missing:
            raise TypeError(f"scheduler back-end {cls.__name__} does not set {', '.join(missing)}")
        if not cls.title:
            cls.title = cls.name

    # -- rendering --------------------------------------------------------------------------------------
    @abstractmethod
    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        """The directive lines (``#SBATCH ...``) of the script, in a fixed order."""

    # -- submission ------------------------------------------------------------------------------------
    @abstractmethod
    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, array_dir: str | None = None, hold: bool = False) -> list[str]:
        """The command that submits ``script_path``; it runs in the run directory (``env -C``).

        ``array`` is a range ("0-2"); each task's output should go to ``{array_dir}_{index}/`` where the
        scheduler can be told so. A back-end refuses (SchedulerError) what it cannot do.
        """

    @abstractmethod
    def parse_job_id(self, stdout: str) -> str:
        """The job id in the submit command's output."""

    def array_task_id(self, master: str, index: int) -> str:
        """The id of task ``index`` of the array job ``master``."""
        raise SchedulerError(f"{self.name} has no job arrays", hint="submit one run per value with --set instead")

    def test_only_argv(self, script_path: str) -> list[str] | None:
        """A command that checks a script without submitting it, when the scheduler has one."""
        return None

    # -- status and control ----------------------------------------------------------------------------
    @abstractmethod
    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        """Status commands for ``jobs`` (job id -> run directory) as fallback chains.

        Each chain holds probes of one role, best first: polling runs a chain's probes until one answers;
        the answers of the chains are combined (the live view while a job is active, else its accounting).
        """

    def queued_jobs_probe(self, site: SiteProfile, queue_key: str) -> QueuedJobsProbe | None:
        """How to count the user's jobs in queue ``queue_key`` of ``site`` now; None where the scheduler cannot
        say (the check is then left to the scheduler)."""
        return None

    def lost_nodes_argv(self, run_dir: str, job_id: str) -> list[str] | None:
        """A command printing what the job's output says about nodes lost under it (``parse_lost_nodes`` reads it);
        None where the scheduler's output never names them."""
        return None

    def parse_lost_nodes(self, text: str) -> list[str]:
        """The nodes named lost in ``lost_nodes_argv``'s output, first seen first."""
        return []

    def nodes_probe(self, site: SiteProfile, queue_key: str) -> NodesProbe | None:
        """How to list the nodes of queue ``queue_key`` of ``site`` with their states now; None where the scheduler
        cannot say (a job too large for the usable nodes is then left to wait in the queue)."""
        return None

    @abstractmethod
    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        """The command that cancels one job."""

    def signal_argv(self, job_id: str, run_dir: str, signal_name: str) -> list[str] | None:
        """The command that sends ``SIG<signal_name>`` to a running job's batch shell, which forwards it to the
        ranks as it forwards the warning before the walltime; None where the scheduler has no such command."""
        return None

    @abstractmethod
    def log_names(self, job_id: str) -> list[str]:
        """File names, in the run directory, of the job's scheduler output: the most likely first."""

    def job_log_word(self) -> ShellWord | None:
        """The job's output file as a word of its own script (relative to the run directory); None: unknown."""
        return None

    def requeue_lines(self, script_path: str, max_requeues: int) -> list[str]:
        """Shell lines run when the ranks stopped at a checkpoint (exit 75): put the job back in line.

        ``script_path`` is the quoted path of this script in the run directory. Default: none (the
        job ends with status 75 and ``hpctrain resume`` continues it).
        """
        return []

    # -- directive rules (config/scheduler_rules.py) ---------------------------------------------------------
    def directive_allowed(self, key: str) -> bool:
        """Whether a profile, a queue or a job may set option ``key`` (the site's trusted directives may set more)."""
        return self.allowed_directives is None or key in self.allowed_directives

    def directive_value_problem(self, key: str, value: DirectiveValue) -> str | None:
        """What is wrong with ``value`` for option ``key`` beyond the common checks, or None."""
        return None

    # -- discovery (discovery/detect.py) --------------------------------------------------------------------
    def detects(self, probe: Probe) -> bool:
        """Whether the probed login node runs this scheduler (default: one of ``detect_programs`` is there)."""
        return any(program in probe.programs for program in self.detect_programs)

    def probe_lines(self) -> list[str]:
        """Shell lines of the discovery probe, run when one of ``detect_programs`` exists (``run NAME CMD...``
        records a command's output as section NAME; ``have CMD`` tests for a program)."""
        return []

    def read_discovery(self, probe: Probe) -> SchedulerFacts:
        """What the probe's answers say about this scheduler's queues and nodes."""
        from hpctrain.submission.discovery.facts import SchedulerFacts

        return SchedulerFacts(name=self.name, answered=True)

    def discovered_launcher(self, probe: Probe, mpi: Fact[str] | None) -> Fact[str] | None:
        """The profile's launcher under this scheduler; None: the choice for a machine without scheduler."""
        return None

    def discovered_launcher_args(self, facts: SchedulerFacts, mpi: Fact[str] | None) -> Fact[list[str]] | None:
        """Extra launcher options the discovered MPI needs under this scheduler; None: none."""
        return None

    def discovery_notes(self, probe: Probe, launcher: Fact[str], mpi: Fact[str] | None) -> list[str]:
        """What the person reading a discovered profile should check by hand."""
        return []

    def with_qos(self, queue: QueueFacts, qos: QosFacts) -> QueueFacts:
        """A discovered queue's limits as a job submitted under ``qos`` meets them (``has_qos`` back-ends)."""
        return queue

    def is_qos_limit(self, fact: Fact[Any]) -> bool:
        """Whether a discovered queue limit was set by a QOS (the profile cites that QOS beside the queue)."""
        return False

    def queue_option(self, site: SiteProfile) -> str | None:
        """The option carrying the queue name on ``site``: its queue_option, else this back-end's default."""
        return site.queue_option or (self.queue_options[0] if self.queue_options else None)

    # -- what fits ---------------------------------------------------------------------------------------
    def launcher_for(self, site: SiteProfile) -> str:
        """The registered launcher (launchers/) that starts the ranks of ``site``."""
        return self.mpiexec_launcher if site.launcher == MPIEXEC else site.launcher

    def check_site(self, site: SiteProfile) -> None:
        """Refuse a site profile this scheduler cannot run (its launcher)."""
        if self.launchers is not None and site.launcher not in self.launchers:
            *others, last = self.launchers
            names = f"{', '.join(others)} or {last}" if others else last
            raise ConfigError(f"site {site.name!r}: scheduler {self.name} starts ranks with {names}, not "
                              f"{site.launcher!r}", key="launcher", hint=f"set launcher: {self.launchers[0]}")

    def check_job(self, job: JobSpec, site: SiteProfile) -> None:
        """Refuse a job this scheduler cannot place (more nodes than it has, per-job options it has not)."""
        res = job.resources
        if self.max_nodes is not None and res.allocated_nodes > self.max_nodes:
            raise FitError(f"{res.allocated_nodes} nodes requested but site {site.name!r} ({self.name}) runs on "
                           f"at most {self.max_nodes}", key="resources.nodes",
                           hint=f"set resources.nodes: {self.max_nodes} or choose a cluster site")
        asked = {"exclusive": res.exclusive, "reservation": res.reservation is not None,
                 "directives": bool(res.directives)}
        for option, wanted in asked.items():
            if wanted and option not in self.job_options:
                raise FitError(f"site {site.name!r} ({self.name}) has no per-job {option}", key=f"resources.{option}",
                               hint=f"remove resources.{option} for this site")
        try:
            directive_problems(self.name, res.directives, ("resources", "directives"), job=True)
        except FieldProblem as exc:
            raise FitError(str(exc), key=".".join(str(k) for k in exc.loc)) from None


# ---------------------------------------------------------------------------------------------------------
# Shared helpers for back-ends


def merged_directives(site: SiteProfile, placement: Placement, job: JobSpec) -> dict[str, DirectiveValue]:
    """Site directives, the queue's on top, the job's on top of both, the site's trusted ones last (the last
    value for a key wins).

    A job's ``exclusive`` or ``reservation`` replaces a site's or queue's directive of that name: the back-end
    writes the job's own.
    """
    merged = dict(site.directives)
    if placement.queue is not None:
        merged.update(placement.queue.directives)
    merged.update(job.resources.directives)
    merged.update(site.environment.directives)  # trusted: the site's admin chose the job's shell or environment
    if job.resources.exclusive:
        merged.pop("exclusive", None)
    if job.resources.reservation:
        merged.pop("reservation", None)
    return merged


def directive_value(value: DirectiveValue, *, key: str) -> str:
    """A directive's value as text, checked to be one plain word."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return directive_word(text, what=f"directive {key!r}:")


def directive_options(directives: Mapping[str, DirectiveValue],
                      long_option: Callable[[str, DirectiveValue], str]) -> list[str]:
    """The merged extra directives as options, set ones only (None and False are left out): a one-letter key as
    ``-k`` or ``-k VALUE``, a longer one as the back-end writes it (``long_option(key, value)``)."""
    opts = []
    for key, value in directives.items():
        if value is None or value is False:
            continue
        if len(key) == 1:
            opts.append(f"-{key}" if value is True else f"-{key} {directive_value(value, key=key)}")
        else:
            opts.append(long_option(key, value))
    return opts


def double_dash_option(separator: str) -> Callable[[str, DirectiveValue], str]:
    """``directive_options``' long form ``--key`` (True) or ``--key<separator>VALUE``."""
    return lambda key, value: f"--{key}" if value is True else f"--{key}{separator}{directive_value(value, key=key)}"


def check_directive_lines(lines: list[str], prefix: str) -> list[str]:
    """Every line starts with the prefix and holds no line break (a last guard against injection)."""
    for line in lines:
        if not line.startswith(prefix + " ") or _LINE_BREAKS.search(line):
            raise ConfigError(f"refusing to write directive line {line!r}: it is not one plain {prefix} line")
    return lines


def check_job_id(job_id: str) -> str:
    """A job id that is safe to pass as an argument (digits, names, array brackets)."""
    if not _JOB_ID.fullmatch(job_id):  # match() would pass "123\n"
        raise SchedulerError(f"{job_id!r} does not look like a job id")
    return job_id


def check_request(scheduler: Scheduler, *, dependency: tuple[str, str] | None, array: str | None,
                  hold: bool) -> tuple[str, str] | None:
    """Refuse what ``scheduler`` cannot do (arrays, this dependency kind, holds); the checked dependency."""
    if array and scheduler.array_index_variable is None:
        raise SchedulerError(f"{scheduler.name} has no job arrays", hint="submit one run per value with --set instead")
    if hold and not scheduler.supports_hold:
        raise SchedulerError(f"{scheduler.name} cannot submit a job on hold")
    if dependency is None:
        return None
    kind, job_id = dependency
    if kind not in DEPENDENCY_KINDS:
        raise SchedulerError(f"unknown dependency kind {kind!r}", hint="use one of " + ", ".join(DEPENDENCY_KINDS))
    if kind not in scheduler.dependency_kinds:
        can = ", ".join(scheduler.dependency_kinds) or "none"
        raise SchedulerError(f"{scheduler.name} cannot start a job {kind} another (it supports: {can})")
    return kind, check_job_id(job_id)


def queue_submit_name(placement: Placement) -> str | None:
    """The queue name the scheduler knows (``submit_as`` when the profile key differs)."""
    if placement.queue is not None and placement.queue.submit_as:
        return placement.queue.submit_as
    return placement.queue_name


def requeue_block(restart_variable: str, max_requeues: int, action: list[str]) -> list[str]:
    """``if status is 75 and restarts < max: action`` — shared by the back-ends that requeue themselves."""
    lines = [
        f'restarts="${{{restart_variable}:-0}}"',
        f'if [ "${{status}}" -eq {EXIT_REQUEUE} ] && [ "${{restarts}}" -lt {max_requeues} ]; then',
        f'    echo "hpctrain: stopped at a checkpoint; putting the job back in the queue '
        f'(restart $((restarts + 1)) of {max_requeues})"',
    ]
    lines += [f"    {line}" for line in action]
    lines += [
        '    echo "hpctrain: could not requeue; continue with: hpctrain resume RUN" >&2',
        f'elif [ "${{status}}" -eq {EXIT_REQUEUE} ]; then',
        f'    echo "hpctrain: stopped at a checkpoint and max_requeues ({max_requeues}) is reached; '
        'continue with: hpctrain resume RUN" >&2',
        "fi",
    ]
    return lines


# ---------------------------------------------------------------------------------------------------------
# Finding a back-end


def get_scheduler(name: str) -> Scheduler:
    """The back-end for a site's ``scheduler:`` value, from the registry (config/backends.py)."""
    scheduler = SCHEDULERS.load(name)
    if not isinstance(scheduler, Scheduler):
        raise ConfigError(f"scheduler back-end {name!r} ({SCHEDULERS.targets().get(name)}) is not a Scheduler",
                          key="scheduler", hint="an entry point in hpctrain.schedulers names a Scheduler instance")
    return scheduler


def known_schedulers() -> list[str]:
    """The names of the registered back-ends (built-in and installed)."""
    return SCHEDULERS.names()


def all_schedulers() -> list[Scheduler]:
    """Every registered back-end, in the order discovery asks them."""
    return sorted((get_scheduler(name) for name in known_schedulers()), key=lambda s: (s.detect_order, s.name))


def place(job: JobSpec, site: SiteProfile) -> Placement:
    """Where ``job`` runs on ``site``: the profile's limits (``check_fit``) and the scheduler's own."""
    scheduler = get_scheduler(site.scheduler)
    scheduler.check_site(site)
    placement = check_fit(job, site)
    scheduler.check_job(job, site)
    return placement
