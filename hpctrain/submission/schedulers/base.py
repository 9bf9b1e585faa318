"""The contract every batch-scheduler back-end fills in (PSI/J style): directives, submit, status, cancel.

Back-ends (``slurm.py``, ``pbs.py``, ``cobalt.py``, ``local.py``) only build argv lists and directive
lines and parse text; nothing here runs a command. ``get_scheduler(name)`` returns one by name.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpctrain.config.common import DirectiveValue
from hpctrain.config.fit import Placement
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.errors import ConfigError, SchedulerError
from hpctrain.exit_codes import EXIT_REQUEUE
from hpctrain.submission.launchers import LaunchPlan
from hpctrain.submission.shell import directive_word, is_home_relative

if TYPE_CHECKING:
    from hpctrain.submission.schedulers.status_parsers import JobStatus

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

    def log_path(self, file_name: str) -> str:
        """Where a scheduler log goes, as a directive word.

        Directive lines are not expanded by a shell, so a run directory under ``~``/``$HOME`` is written as
        a bare file name: the scheduler resolves it against the directory ``qsub``/``sbatch`` ran in,
        which is the run directory (the submit step runs there).
        """
        if is_home_relative(self.run_dir):
            return directive_word(file_name, what="log file")
        return directive_word(f"{self.run_dir.rstrip('/')}/{file_name}", what="run directory")


class Scheduler:
    """One batch scheduler. Subclasses set the class attributes and fill in the methods."""

    name: str = ""
    directive_prefix: str = ""
    template: str = ""  # file name in schedulers/templates/
    job_id_variable: str = ""  # set in the batch shell, for the log line
    needs_signal_timer: bool = False  # True when the scheduler sends no warning before the walltime

    # -- rendering --------------------------------------------------------------------------------------
    def render_directives(self, job: JobSpec, site: SiteProfile, placement: Placement,
                          options: RenderOptions) -> list[str]:
        """The directive lines (``#SBATCH ...``) of the script, in a fixed order."""
        raise NotImplementedError

    # -- submission ------------------------------------------------------------------------------------
    def submit_argv(self, script_path: str, *, dependency: tuple[str, str] | None = None,
                    array: str | None = None, hold: bool = False) -> list[str]:
        """The command that submits ``script_path``."""
        raise NotImplementedError

    def parse_job_id(self, stdout: str) -> str:
        """The job id in the submit command's output."""
        raise NotImplementedError

    def test_only_argv(self, script_path: str) -> list[str] | None:
        """A command that checks a script without submitting it, when the scheduler has one."""
        return None

    # -- status and control ----------------------------------------------------------------------------
    def status_argv(self, job_ids: list[str]) -> list[list[str]]:
        """Status commands for many jobs at once, best first; callers fall back along the list."""
        raise NotImplementedError

    def parse_status(self, argv_index: int, stdout: str) -> dict[str, JobStatus]:
        """Parse the output of ``status_argv(...)[argv_index]``."""
        raise NotImplementedError

    def cancel_argv(self, job_id: str) -> list[str]:
        raise NotImplementedError

    def requeue_argv(self, job_id: str) -> list[str] | None:
        """The command that puts a job back in the queue, or None when the scheduler cannot."""
        return None

    def requeue_lines(self, script_path: str, max_requeues: int) -> list[str]:
        """Shell lines run when the ranks stopped at a checkpoint (exit 75): put the job back in line.

        ``script_path`` is the quoted path of this script in the run directory. Default: none (the
        job ends with status 75 and ``hpctrain resume`` continues it).
        """
        return []


# ---------------------------------------------------------------------------------------------------------
# Shared helpers for back-ends


def merged_directives(site: SiteProfile, placement: Placement) -> dict[str, DirectiveValue]:
    """Site directives with the queue's on top (a queue's value for the same key wins)."""
    merged = dict(site.directives)
    if placement.queue is not None:
        merged.update(placement.queue.directives)
    return merged


def directive_value(value: DirectiveValue, *, key: str) -> str:
    """A directive's value as text, checked to be one plain word."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return directive_word(text, what=f"directive {key!r}:")


def check_directive_lines(lines: list[str], prefix: str) -> list[str]:
    """Every line starts with the prefix and holds no line break (a last guard against injection)."""
    for line in lines:
        if not line.startswith(prefix + " ") or _LINE_BREAKS.search(line):
            raise ConfigError(f"refusing to write directive line {line!r}: it is not one plain {prefix} line")
    return lines


def check_job_id(job_id: str) -> str:
    """A job id that is safe to pass as an argument (digits, names, array brackets)."""
    if not _JOB_ID.match(job_id):
        raise SchedulerError(f"{job_id!r} does not look like a job id")
    return job_id


def check_dependency(dependency: tuple[str, str] | None) -> tuple[str, str] | None:
    if dependency is None:
        return None
    kind, job_id = dependency
    if kind not in DEPENDENCY_KINDS:
        raise SchedulerError(f"unknown dependency kind {kind!r}", hint="use one of " + ", ".join(DEPENDENCY_KINDS))
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


_BACKENDS = {"slurm": "hpctrain.submission.schedulers.slurm", "pbs": "hpctrain.submission.schedulers.pbs",
             "cobalt": "hpctrain.submission.schedulers.cobalt", "local": "hpctrain.submission.schedulers.local"}


def get_scheduler(name: str) -> Scheduler:
    """The back-end for a site's ``scheduler:`` value."""
    try:
        module = importlib.import_module(_BACKENDS[name])
    except KeyError:
        raise ConfigError(f"no scheduler back-end named {name!r}", key="scheduler",
                          hint="known: " + ", ".join(sorted(_BACKENDS))) from None
    return module.SCHEDULER
