"""Opens, metadata calls and bytes read by one process, counted from its ``strace`` log.

A tracer sees what a Python audit hook cannot: the dynamic loader's opens and path searches, and the files C
libraries open, stat and list themselves. ``command(log)`` is the prefix that runs a process under strace
(``-f``: its threads too; ``-y``: descriptors printed with their paths); ``count(log, ...)`` reads the log back,
split into windows at the marks ``runtime/counters.mark`` leaves (a lookup of ``/.hpctrain-mark/NAME``).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.runtime.counting.counters import LOCATIONS, MARK_PATH, SYSTEM_PREFIXES

OPENS = ("open", "openat", "openat2", "creat")
STATS = ("stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink", "readlinkat")
READDIRS = ("getdents64", "getdents")
READS = ("read", "pread64")
DIRECTORY_OPS = ("mkdir", "mkdirat", "fsync", "fdatasync")  # counted on one directory (``directory_ops``)
TRACED = OPENS + STATS + READDIRS + READS + DIRECTORY_OPS
KINDS = ("opens", "stats", "readdirs", "read_bytes")

_CALL = re.compile(r"^(?:\[pid\s+)?(\d+)\]?\s+(\w+)\((.*)$")
_RESULT = re.compile(r"\)\s+=\s+(-?\d+)[^=]*$")  # the last "= N": a read's data may hold ") = " itself
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD = re.compile(r"^(-?\d+)<([^>]*)>")


def command(log: str | os.PathLike[str]) -> list[str]:
    """``strace`` and its options, to put before a command: writes every traced call to ``log``."""
    return ["strace", "-f", "-qq", "--seccomp-bpf", "-y", "-s", "256", "-e", f"trace={','.join(TRACED)}",
            "-o", str(log)]


def per_rank_command(directory: str | os.PathLike[str]) -> list[str]:
    """A prefix for a launcher's rank command: each rank under strace, its log ``DIRECTORY/rank-R.strace`` named
    by the rank number the launcher gives it (``PMI_RANK``, MPICH's Hydra; ``SLURM_PROCID`` under srun)."""
    options = shlex.join(command("LOG")[:-2])
    return ["sh", "-c", f'exec {options} -o "$0/rank-${{PMI_RANK:-$SLURM_PROCID}}.strace" "$@"', str(directory)]


@dataclass
class Window:
    """Counts by kind and location between two marks."""

    counts: dict[str, dict[str, int]] = field(
        default_factory=lambda: {k: dict.fromkeys(LOCATIONS, 0) for k in KINDS})

    def add(self, kind: str, location: str, n: int = 1) -> None:
        self.counts[kind][location] += n


def location(path: str, node_local: tuple[str, ...]) -> str:
    """``node_local``, ``system`` or ``shared``, as runtime/counting/counters.py tells them apart."""
    path += os.sep
    if path.startswith(node_local):
        return "node_local"
    if path.startswith(SYSTEM_PREFIXES):
        return "system"
    return "shared"


def _path(name: str, args: str, cwd: str) -> str | None:
    """The path a call names, made absolute (a directory descriptor's path or ``cwd`` for a relative one)."""
    quoted = _QUOTED.search(args)
    if quoted is None:
        return None
    path = quoted.group(1)
    if path.startswith("/"):
        return path
    base = cwd
    if name.endswith("at") or name in ("openat2", "statx"):
        fd = _FD.match(args)
        if fd:
            base = fd.group(2)
    return os.path.normpath(os.path.join(base, path))


def count(log: str | os.PathLike[str], cwd: str, node_local: tuple[str, ...] = ()) -> dict[str, Any]:
    """Windows of the log, ``{"before MARK": Window, ..., "end": Window}`` as dicts: each window holds what the
    process did after the previous mark up to this one."""
    windows: dict[str, Window] = {}
    current = Window()
    listing: dict[tuple[str, str], str] = {}  # (pid, descriptor) -> the directory being listed on it
    for line in Path(log).read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if m is None:
            continue  # a "<... resumed>" line: the call was counted where it started
        name, args = m.group(2), m.group(3)
        if name in DIRECTORY_OPS:
            continue
        if name in READS:
            fd, result = _FD.match(args), _RESULT.search(args)
            if fd and fd.group(2).startswith("/") and result and int(result.group(1)) > 0:
                current.add("read_bytes", location(fd.group(2), node_local), int(result.group(1)))
            continue
        if name in READDIRS:
            fd = _FD.match(args)
            if fd and fd.group(2).startswith("/"):
                key = (m.group(1), fd.group(1))
                if listing.get(key) != fd.group(2):
                    current.add("readdirs", location(fd.group(2), node_local))
                    listing[key] = fd.group(2)
                result = _RESULT.search(args)
                if result and int(result.group(1)) <= 0:
                    listing.pop(key, None)  # the end of this listing: the descriptor's next call starts another
            continue
        path = _path(name, args, cwd)
        if path is None:
            continue
        if path.startswith(MARK_PATH + "/"):
            windows[path[len(MARK_PATH) + 1:]] = current
            current = Window()
            continue
        current.add("opens" if name in OPENS else "stats", location(path, node_local))
    windows["end"] = current
    return {name: asdict(w)["counts"] for name, w in windows.items()}


def between(windows: dict[str, Any], start: str | None, end: str) -> dict[str, dict[str, int]]:
    """Counts from mark ``start`` (None: the process's start) up to mark ``end``: the sum of the windows
    between them, in the order the marks were left."""
    names = list(windows)
    first = 0 if start is None else names.index(start) + 1
    total = {k: dict.fromkeys(LOCATIONS, 0) for k in KINDS}
    for name in names[first:names.index(end) + 1]:
        for kind, by_location in windows[name].items():
            for where, n in by_location.items():
                total[kind][where] += n
    return total


def directory_ops(log: str | os.PathLike[str], directory: str | os.PathLike[str], cwd: str = "/",
                  ) -> dict[str, int]:
    """mkdir and fsync (fdatasync) calls on ``directory`` itself in the log (``-y`` names a descriptor's path;
    a relative mkdir is taken from ``cwd``)."""
    target = os.path.abspath(directory)
    ops = {"mkdir": 0, "fsync": 0}
    for line in Path(log).read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if m is None or m.group(2) not in DIRECTORY_OPS:
            continue
        if m.group(2).startswith("mkdir"):
            path = _path(m.group(2), m.group(3), cwd)
            ops["mkdir"] += path is not None and os.path.normpath(path) == target
        else:
            fd = _FD.match(m.group(3))
            ops["fsync"] += fd is not None and fd.group(2) == target
    return ops
