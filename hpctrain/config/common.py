"""Field types shared by site profiles and job specs (walltimes, names, words, environment variables).

Every pattern is checked with ``fullmatch``: ``re.match(r"...$")`` also accepts a value ending in a newline,
which then splits a script line in two.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from hpctrain.config.walltime import format_hms, parse_walltime

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Scheduler directive keys and modules are written into scripts; they must be plain words.
_WORD = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_./+:@=,-]*")
# One element of a list the scheduler splits itself (PBS ``filesystems=a:b``, Cobalt ``filesystems=a,b``):
# no separator of any of those grammars, so an element can never add a resource of its own.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Integers that reach a script (counts of nodes, ranks, threads, GPUs, requeues) stay far below what
# schedulers and bash arithmetic can hold.
MAX_COUNT = 1_000_000


class Strict(BaseModel):
    """Base of every configuration model: unknown keys are errors, values are checked on assignment.

    Strict types: ``nodes: true`` or ``nodes: "4"`` are errors, not 1 and 4; floats must be finite
    (``memory_gb: .inf`` or ``.nan`` would disable the checks that compare against them).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


class FieldProblem(ValueError):
    """Raised by a model validator about one key (``loc``) so the error names that key and its line."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            "names may hold only letters, digits, '_', '.' and '-', start with a letter or digit, "
            "and be at most 64 characters"
        )
    return value


def _normalise_walltime(value: object) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError("a walltime is a string like '01:30:00' or a number of minutes")
    return format_hms(parse_walltime(value))


def _check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
    return env


def _check_word(value: str) -> str:
    if not _WORD.fullmatch(value):
        raise ValueError("must be one plain word (letters, digits and _ . / + : @ = -), no spaces or quotes")
    return value


def _check_queue_name(value: str) -> str:
    _check_word(value)
    if "," in value:
        raise ValueError("a queue, partition or QOS name holds no ',': the scheduler would read a list and may pick "
                         "any of its names, while the fit check used one queue's limits")
    return value


def _check_plain_name(value: str) -> str:
    if not _PLAIN_NAME.fullmatch(value):
        raise ValueError("must be a plain name (letters, digits, '_', '.' and '-'; no ':', ',' or '=')")
    return value


def _stringify_env(value: object) -> object:
    if isinstance(value, dict):
        return {k: ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}
    return value


Name = Annotated[str, AfterValidator(_check_name)]
Walltime = Annotated[str, BeforeValidator(_normalise_walltime)]
EnvVars = Annotated[dict[str, str], BeforeValidator(_stringify_env), AfterValidator(_check_env_names)]
Word = Annotated[str, AfterValidator(_check_word)]
PlainName = Annotated[str, AfterValidator(_check_plain_name)]
QueueName = Annotated[str, AfterValidator(_check_queue_name)]
DirectiveValue = str | int | float | bool | None


def walltime_seconds(value: str) -> int:
    """Seconds of a normalised walltime string."""
    return parse_walltime(value)
