"""Walltimes: parse the forms schedulers accept, compare them, and format them per scheduler.

Accepted: ``MM`` (an integer is minutes, as in Slurm), ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
``D-HH:MM:SS``. Every field after the first is bounded (``01:99:00`` is refused, not read as 02:39:00), the
total is at most MAX_DAYS, and everything is normalised to whole seconds.
"""

from __future__ import annotations

import re

_DAYS = re.compile(r"([0-9]{1,6})-([0-9]{1,2})(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?")
_CLOCK = re.compile(r"([0-9]{1,9})(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?")
# No batch system runs a job for a year; a bigger number is a typo (and would overflow scripts' arithmetic).
MAX_DAYS = 366
MAX_SECONDS = MAX_DAYS * 86400
_FORMS = "use HH:MM:SS, MM:SS, D-HH:MM:SS or a number of minutes"


def _bounded(text: str, value: int, limit: int, what: str) -> int:
    if value >= limit:
        raise ValueError(f"{text!r}: {what} must be below {limit} ({_FORMS})")
    return value


def parse_walltime(value: str | int) -> int:
    """Seconds in a walltime; raises ValueError with the accepted forms when it cannot be read."""
    if isinstance(value, bool):
        raise ValueError("a walltime is not a boolean")
    if isinstance(value, int):
        if value > MAX_SECONDS // 60:
            raise ValueError(f"{value} minutes is more than {MAX_DAYS} days")
        seconds = value * 60
    else:
        text = str(value).strip()
        days_match = _DAYS.fullmatch(text)
        clock_match = _CLOCK.fullmatch(text)
        if days_match:
            d, h, m, s = (int(g) if g else 0 for g in days_match.groups())
            _bounded(text, h, 24, "hours after the day count")
            _bounded(text, m, 60, "minutes")
            _bounded(text, s, 60, "seconds")
            seconds = ((d * 24 + h) * 60 + m) * 60 + s
        elif clock_match:
            parts = [int(g) for g in clock_match.groups() if g is not None]
            if len(parts) == 1:
                seconds = parts[0] * 60
            elif len(parts) == 2:
                seconds = parts[0] * 60 + _bounded(text, parts[1], 60, "seconds")
            else:
                _bounded(text, parts[1], 60, "minutes")
                _bounded(text, parts[2], 60, "seconds")
                seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
        else:
            raise ValueError(f"{text[:40]!r} is not a walltime; {_FORMS}")
        if seconds > MAX_SECONDS:
            raise ValueError(f"{text!r} is more than {MAX_DAYS} days")
    if seconds <= 0:
        raise ValueError("a walltime must be positive")
    return seconds


def format_hms(seconds: int) -> str:
    """``HH:MM:SS`` with hours allowed past 24 (Slurm, PBS and Cobalt all accept this form)."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def format_minutes(seconds: int) -> int:
    """Whole minutes, rounded up (Cobalt's ``-t`` takes minutes)."""
    return -(-int(seconds) // 60)
