"""What the site and job checks ask of a scheduler back-end: which directives it lets a profile or a job set, and
the few facts that change a check. config/ owns the question; every back-end answers it (schedulers/base.py), and
``scheduler_rules`` finds the back-end through the registry, so no check here names a scheduler.
"""

from __future__ import annotations

from typing import Protocol

from hpctrain.config.backends import SCHEDULERS
from hpctrain.config.common import DirectiveValue


class SchedulerRules(Protocol):
    """A scheduler back-end as the profile checks see it."""

    name: str
    title: str  # in messages: "Slurm", "PBS"
    runs_here: bool  # no scheduler: jobs run on the machine they are submitted from
    has_qos: bool  # a queue may name a QOS beside its partition
    # The values a profile's queue_option may take, the default first (Slurm: partition, qos); (): no choice.
    queue_options: tuple[str, ...]
    # Options hpctrain writes itself from the checked job (nodes, walltime, queue, names, logs, arrays).
    reserved_directives: frozenset[str]
    # Options that choose the job's shell, interpreter, container or environment: only the trusted
    # environment.directives of a site profile may set them.
    trusted_only_directives: frozenset[str]
    # Options a job sets through its own resources keys (exclusive, reservation), never as a directive.
    job_key_directives: frozenset[str]

    def directive_allowed(self, key: str) -> bool:
        """Whether a profile, a queue or a job may set option ``key``."""
        ...

    def directive_value_problem(self, key: str, value: DirectiveValue) -> str | None:
        """What is wrong with ``value`` for option ``key`` beyond the common checks, or None."""
        ...


def scheduler_rules(name: str) -> SchedulerRules:
    """The back-end called ``name`` (a ConfigError listing the known ones when there is none)."""
    rules: SchedulerRules = SCHEDULERS.load(name)
    return rules
