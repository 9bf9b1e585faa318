"""The one reader of numbers from text: YAML scalars, ``--set`` values, flags, scheduler output, parameters.

A number is ASCII digits (``²`` and ``١`` pass ``str.isdigit`` and ``int`` but are not numbers here), at most
``MAX_DIGITS`` of them (Python refuses to convert more than 4,300 and bigger values reach no scheduler),
finite when it is a float, and inside the bounds the field states. Errors are one line naming the field.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

# Digits of the largest count a scheduler, bash arithmetic or int64 can hold; more is a mistake or an attack.
MAX_DIGITS = 20
# A float's text: digits of mantissa and exponent are bounded too (``1e99999`` is not a number of anything).
MAX_FLOAT_CHARS = 64

_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


class NumberError(ValueError):
    """A value that is not a number of the field, with the one-line reason."""


@dataclass(frozen=True)
class Bounds:
    """Inclusive bounds of a field (None: unbounded on that side)."""

    low: float | None = None
    high: float | None = None

    def check(self, value: float, field: str) -> None:
        if self.low is not None and value < self.low:
            raise NumberError(f"{field}: {value!r} is below the least allowed value {self.low!r}")
        if self.high is not None and value > self.high:
            raise NumberError(f"{field}: {value!r} is above the largest allowed value {self.high!r}")


def _digits(text: str) -> int:
    return sum(ch.isdigit() for ch in text)


def parse_int(text: str, field: str, bounds: Bounds = Bounds()) -> int:
    """An integer written in ASCII digits (optional sign), at most MAX_DIGITS of them, inside ``bounds``."""
    stripped = text.strip()
    if len(stripped) > MAX_DIGITS + 1 or not _INT.fullmatch(stripped):
        if _INT.fullmatch(stripped):
            raise NumberError(f"{field}: an integer of {_digits(stripped)} digits is more than the "
                              f"{MAX_DIGITS} allowed")
        raise NumberError(f"{field}: {shown(stripped)} is not an integer (ASCII digits 0-9)")
    value = int(stripped)
    bounds.check(value, field)
    return value


def parse_float(text: str, field: str, bounds: Bounds = Bounds()) -> float:
    """A finite decimal number (``1.5``, ``2e-3``) of at most MAX_FLOAT_CHARS characters, inside ``bounds``."""
    stripped = text.strip()
    if len(stripped) > MAX_FLOAT_CHARS:
        raise NumberError(f"{field}: a number of {len(stripped)} characters is longer than the "
                          f"{MAX_FLOAT_CHARS} allowed")
    if not _FLOAT.fullmatch(stripped):
        raise NumberError(f"{field}: {shown(stripped)} is not a number")
    value = float(stripped)
    if not math.isfinite(value):
        raise NumberError(f"{field}: {shown(stripped)} is too large to be a number of anything")
    bounds.check(value, field)
    return value


def check_number(value: object, field: str, bounds: Bounds = Bounds(), *, integer: bool = False) -> float:
    """A number given as a Python value (a parameter): int or finite float (int only with ``integer``), in
    ``bounds``; bool, None and anything else refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise NumberError(f"{field}: expected {kind}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(f"{field}: {value!r} is not a finite number")
    if isinstance(value, int) and value.bit_length() > 66:
        raise NumberError(f"{field}: an integer of more than {MAX_DIGITS} digits is not allowed")
    bounds.check(value, field)
    return value


def max_threads() -> int:
    """The most threads one process may ask for: this machine's CPUs (more only take turns on the same cores)."""
    return os.cpu_count() or 1


def _threads_problem(value: object) -> str | None:
    """Why ``value`` is no thread count this machine can run (1 to ``max_threads()``); None when it is one."""
    most = max_threads()
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return f"{value!r} threads; give 1 to {most} (the CPUs of this machine)"
    return None


def check_threads(value: int, field: str = "--threads") -> int:
    """``value`` when it is a thread count this machine can run, 1 to ``max_threads()``; NumberError otherwise."""
    problem = _threads_problem(value)
    if problem is not None:
        raise NumberError(f"{field}: {problem}")
    return value


def flag_threads(text: str) -> int:
    """argparse ``type=`` for ``--threads``: an integer from 1 to this machine's CPUs (argparse names the flag)."""
    import argparse

    try:
        value = parse_int(text, "the value")
    except NumberError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    problem = _threads_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def plain_count(text: str | None, high: int = 10 ** 15) -> int | None:
    """A non-negative count read from a program's output, or None when the text is not one (words, ``²``,
    a value of more than MAX_DIGITS digits, or above ``high``): such output names no count."""
    if text is None:
        return None
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_DIGITS or not stripped.isascii() or not stripped.isdigit():
        return None
    value = int(stripped)
    return value if value <= high else None


def shown(text: str, limit: int = 40) -> str:
    """A value as an error repeats it: escaped, and cut to ``limit`` characters."""
    from hpctrain.text import printable

    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(printable(cut))


def flag_int(text: str) -> int:
    """argparse ``type=`` for an integer flag: the same rules as every other number (argparse names the flag)."""
    import argparse

    try:
        return parse_int(text, "the value")
    except NumberError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
