"""Walltimes: parse the forms schedulers accept, compare them, and format them per scheduler.

Accepted: ``MM`` (an integer is minutes, as in Slurm), ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
``D-HH:MM:SS``. Everything is normalised to whole seconds.
"""

from __future__ import annotations

import re

_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_walltime(value: str | int) -> int:
    """Seconds in a walltime; raises ValueError with the accepted forms when it cannot be read."""
    if isinstance(value, bool):
        raise ValueError("a walltime is not a boolean")
    if isinstance(value, int):
        seconds = value * 60
    else:
        text = str(value).strip()
        days_match = _DAYS.match(text)
        clock_match = _CLOCK.match(text)
        if days_match:
            d, h, m, s = (int(g) if g else 0 for g in days_match.groups())
            seconds = ((d * 24 + h) * 60 + m) * 60 + s
        elif clock_match:
            parts = [int(g) for g in clock_match.groups() if g is not None]
            if len(parts) == 1:
                seconds = parts[0] * 60
            elif len(parts) == 2:
                seconds = parts[0] * 60 + parts[1]
            else:
                seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
            if len(parts) >= 2 and parts[-1] >= 60:
                raise ValueError(f"{text!r}: seconds must be below 60")
        else:
            raise ValueError(
                f"{text!r} is not a walltime; use HH:MM:SS, MM:SS, D-HH:MM:SS or a number of minutes"
            )
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
