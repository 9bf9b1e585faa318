"""Field types shared by site profiles and job specs (walltimes, names, environment variables)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from hpctrain.config.walltime import format_hms, parse_walltime

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Scheduler directive keys and modules are written into scripts; they must be plain words.
_WORD = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_./+:@=,-]*$")


class Strict(BaseModel):
    """Base of every configuration model: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            "names may hold only letters, digits, '_', '.' and '-', start with a letter or digit, "
            "and be at most 64 characters"
        )
    return value


def _normalise_walltime(value: object) -> str:
    if not isinstance(value, (str, int)):
        raise ValueError("a walltime is a string like '01:30:00' or a number of minutes")
    return format_hms(parse_walltime(value))


def _check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
    return env


def _check_word(value: str) -> str:
    if not _WORD.match(value):
        raise ValueError("must be one plain word (letters, digits and _ . / + : @ = -), no spaces or quotes")
    return value


def _stringify_env(value: object) -> object:
    if isinstance(value, dict):
        return {k: ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}
    return value


Name = Annotated[str, AfterValidator(_check_name)]
Walltime = Annotated[str, BeforeValidator(_normalise_walltime)]
EnvVars = Annotated[dict[str, str], BeforeValidator(_stringify_env), AfterValidator(_check_env_names)]
Word = Annotated[str, AfterValidator(_check_word)]
DirectiveValue = str | int | float | bool | None


def walltime_seconds(value: str) -> int:
    """Seconds of a normalised walltime string."""
    return parse_walltime(value)
