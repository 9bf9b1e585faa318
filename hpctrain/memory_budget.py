"""How much memory a command may fill with the volumes it reads: checked against a volume's shape and dtype (its
header) before any voxel is read, so that a file that declares a huge shape ends in one line naming the budget,
never in a MemoryError.

The budget is ``--memory-gb`` where a command takes it, else ``$HPCTRAIN_MEMORY_GB``, else half of the memory
this process may use (the machine's, or its cgroup's limit where that is lower: a Slurm job's allocation).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctrain.errors import ConfigError, DataError

ENV_VAR = "HPCTRAIN_MEMORY_GB"
FLAG = "--memory-gb"
# The other half is the interpreter, torch, the model and the page cache the volumes are read through.
MACHINE_SHARE = 0.5
FALLBACK_BYTES = 4 * 10**9  # where neither the machine's memory nor a cgroup limit can be read
MAX_GB = float(1 << 20)  # a petabyte: larger is a typo
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
RAISE_HINT = f"give a larger budget where this machine has the memory: {FLAG} GB or {ENV_VAR}=GB"


def gb(nbytes: int) -> str:
    """Bytes in decimal gigabytes, three significant digits (``4.9e+03 GB`` for the absurd)."""
    return f"{nbytes / 1e9:.3g} GB"


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes a command may fill with what it reads, and where that number came from (said in refusals)."""

    limit: int
    source: str

    def check(self, need: int, what: str, hint: str = RAISE_HINT) -> None:
        """DataError when ``need`` bytes (for ``what``: "reading X (shape) dtype") are more than the budget."""
        if need > self.limit:
            raise DataError(f"{what} needs {gb(need)} of memory, more than the budget of {gb(self.limit)} "
                            f"({self.source})", hint=hint)

    def __str__(self) -> str:
        return f"{gb(self.limit)} ({self.source})"


def array_bytes(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of an array of ``shape`` and ``itemsize``, in Python integers (a declared shape overflows no int64)."""
    return math.prod(int(n) for n in shape) * int(itemsize)


def parse_gb(text: str, field: str) -> float:
    """A budget in GB as written in a flag or the environment: a finite number above 0, at most MAX_GB."""
    from hpctrain.config.numbers import Bounds, NumberError, parse_float

    value = parse_float(text, field, Bounds(0.0, MAX_GB))
    if value <= 0:
        raise NumberError(f"{field}: {value!r} GB is no memory at all; give a number above 0")
    return value


def gb_flag(text: str) -> float:
    """argparse ``type=`` for ``--memory-gb``."""
    import argparse

    from hpctrain.config.numbers import NumberError

    try:
        return parse_gb(text, "the value")
    except NumberError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cgroup_limit() -> int | None:
    from hpctrain.files import read_regular_bytes

    for path in _CGROUP_LIMITS:
        try:
            text = read_regular_bytes(path, limit=64).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and len(text) <= 20:
            return int(text)
    return None


def _machine_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def usable_memory() -> tuple[int, str]:
    """(bytes this process may use, said in words): the machine's memory, or its cgroup's limit where lower."""
    machine, limit = _machine_memory(), _cgroup_limit()
    if limit is not None and (machine is None or limit < machine):
        return limit, f"this process's cgroup limit of {gb(limit)}"
    if machine is not None and machine > 0:
        return machine, f"this machine's {gb(machine)}"
    return 0, ""


def memory_budget(memory_gb: float | None = None, environ: Mapping[str, str] | None = None) -> MemoryBudget:
    """The budget: ``memory_gb`` (a command's ``--memory-gb``), else ``$HPCTRAIN_MEMORY_GB``, else MACHINE_SHARE
    of ``usable_memory()``; ConfigError naming the variable when it is not a number of GB."""
    if memory_gb is not None:
        return MemoryBudget(int(memory_gb * 1e9), f"{FLAG} {memory_gb:g}")
    env = os.environ if environ is None else environ
    text = env.get(ENV_VAR, "").strip()
    if text:
        from hpctrain.config.numbers import NumberError

        try:
            value = parse_gb(text, ENV_VAR)
        except NumberError as exc:
            raise ConfigError(str(exc), hint=f"set {ENV_VAR} to the GB a command may fill, e.g. 16") from None
        return MemoryBudget(int(value * 1e9), f"{ENV_VAR}={value:g}")
    usable, said = usable_memory()
    if usable <= 0:
        return MemoryBudget(FALLBACK_BYTES, "a default: this machine's memory is unknown")
    return MemoryBudget(int(usable * MACHINE_SHARE), f"{MACHINE_SHARE:.0%} of {said}")
