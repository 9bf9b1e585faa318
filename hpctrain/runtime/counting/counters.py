"""Per-rank count of the files a rank opens, on node-local storage versus the shared file system.

A Python audit hook (``sys.addaudithook``) sees every ``open`` Python makes (imports' source and bytecode,
``open()``, ``os.open``, ``np.load``, ``torch.load``) and every directory listing (``os.listdir``/``scandir``,
which the import system uses to fill its caches); an attempt counts even when the file is missing (a bytecode
cache looked for and not found is still a lookup on the file system). Off by default, and then free: no hook is
installed (an audit hook cannot be removed, so it is only added when asked for). API and file format:
docs/scaling.md, "Counters".
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.files import write_atomic
from hpctrain.launch_env import NODE_LOCAL_ENV
from hpctrain.runtime.counting import wire

# HPCTRAIN_COUNTERS=1 in a rank's environment turns counting on at the first ``import hpctrain``.
ENV_FLAG = "HPCTRAIN_COUNTERS"
# More node-local prefixes, os.pathsep-separated (a node image's /usr, a test's temporary directory).
EXTRA_LOCAL_ENV = "HPCTRAIN_COUNTERS_LOCAL"
# Pseudo and node-image file systems: on every node, never on the shared file system.
SYSTEM_PREFIXES = ("/proc/", "/sys/", "/dev/", "/etc/")
# Files the import system reads: on the shared path these are what staging removes.
CODE_SUFFIXES = (".py", ".pyc", ".pth", ".so", ".zip")
RECORD_DIR = "counters"
EXAMPLES = 20  # shared paths kept in a record, to say what was still read from the shared file system

LOCATIONS = ("node_local", "shared", "system")
MARK_PATH = "/.hpctrain-mark"


def record_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its record: ``RUN_DIR/counters/rank-00003.json``."""
    return Path(run_dir) / RECORD_DIR / f"rank-{rank:05d}.json"


@dataclass
class OpenCounter:
    """Running counts of opens and directory listings by location; ``marks`` keeps a copy at each named point."""

    node_local: tuple[str, ...]
    opens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOCATIONS, 0))
    listdirs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOCATIONS, 0))
    shared_code_opens: int = 0
    # Every distinct shared path with its count: a record can then tell run-directory files from the rest.
    shared_paths: dict[str, int] = field(default_factory=dict)
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # name -> {"count": times entered, "wire": MPI calls and socket traffic inside, summed}
    spans: dict[str, dict[str, Any]] = field(default_factory=dict)

    def where(self, path: str) -> str:
        """``node_local``, ``system`` or ``shared`` for an absolute path (no file-system access)."""
        path += os.sep  # a prefix's directory itself is inside it
        if path.startswith(self.node_local):
            return "node_local"
        if path.startswith(SYSTEM_PREFIXES):
            return "system"
        return "shared"

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            table = self.opens
        elif event in ("os.listdir", "os.scandir"):
            table = self.listdirs
        else:
            return
        path = args[0] if args else None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        elif path is not None and not isinstance(path, str):
            path = os.fspath(path) if isinstance(path, os.PathLike) else None  # an int is an open descriptor
            if isinstance(path, bytes):
                path = os.fsdecode(path)
        if event != "open" and path is None:
            path = "."  # os.listdir() with no argument lists the working directory
        if not path:
            return
        full = os.path.abspath(path)
        location = self.where(full)
        table[location] += 1
        if location == "shared" and event == "open":
            self.shared_paths[full] = self.shared_paths.get(full, 0) + 1
            if full.endswith(CODE_SUFFIXES):
                self.shared_code_opens += 1

    def snapshot(self) -> dict[str, Any]:
        """The counts as of now (a copy); with the MPI interposer preloaded (runtime/counting/wire.py) also its
        counts, under ``wire``."""
        snap: dict[str, Any] = {"opens": dict(self.opens), "listdirs": dict(self.listdirs),
                                "shared_code_opens": self.shared_code_opens, "shared_files": len(self.shared_paths)}
        counts = wire.snapshot()
        if counts is not None:
            snap["wire"] = counts
        return snap

    def shared_outside(self, directory: str | os.PathLike[str] | None) -> tuple[int, list[str]]:
        """Opens on the shared path outside ``directory`` (the run directory), and the paths opened most often
        (ties by name), a few of them."""
        root = os.path.abspath(directory) + os.sep if directory is not None else None
        outside = {p: n for p, n in self.shared_paths.items() if root is None or not p.startswith(root)}
        return sum(outside.values()), sorted(outside, key=lambda p: (-outside[p], p))[:EXAMPLES]


_counter: OpenCounter | None = None


def node_local_prefixes(environ: dict[str, str] | os._Environ[str] | None = None) -> tuple[str, ...]:
    """The directories counted as node-local: ``$HPCTRAIN_NODE_LOCAL`` and ``$HPCTRAIN_COUNTERS_LOCAL``."""
    env = os.environ if environ is None else environ
    roots = [env.get(NODE_LOCAL_ENV, ""), *env.get(EXTRA_LOCAL_ENV, "").split(os.pathsep)]
    return tuple(os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots if r)


def enable(node_local: tuple[str, ...] | None = None) -> OpenCounter:
    """Start counting in this process (once; later calls return the same counter)."""
    global _counter
    if _counter is None:
        _counter = OpenCounter(node_local if node_local is not None else node_local_prefixes())
        sys.addaudithook(_counter.hook)
    return _counter


def enable_from_env() -> None:
    """``enable()`` when ``HPCTRAIN_COUNTERS`` is set to anything but empty or 0 (``hpctrain/__init__`` calls it)."""
    if os.environ.get(ENV_FLAG, "") not in ("", "0"):
        enable()


def enabled() -> bool:
    return _counter is not None


def current() -> OpenCounter | None:
    """The counter of this process, None when counting is off."""
    return _counter


def mark(name: str) -> None:
    """Keep the counts as of now under ``name`` (the trainer marks ``startup`` before its first step).

    A mark also looks up ``MARK_PATH/name``, which does not exist: a system-call tracer of the rank
    (benchmarks/scale.py runs each rank under strace) sees the mark at its place among the rank's calls."""
    if _counter is not None and name not in _counter.marks:
        _counter.marks[name] = _counter.snapshot()
        try:
            os.stat(f"{MARK_PATH}/{name}")
        except OSError:
            pass


@contextmanager
def span(name: str) -> Iterator[None]:
    """Add what the MPI interposer counts inside the block to the span ``name`` (the trainer wraps each checkpoint
    save in ``span("save")``); nothing when counting is off or the interposer is not loaded."""
    if _counter is None:
        yield
        return
    before = wire.snapshot()
    try:
        yield
    finally:
        entry = _counter.spans.setdefault(name, {"count": 0, "wire": {"calls": {}, "connections": []}})
        entry["count"] += 1
        after = wire.snapshot()
        if before is not None and after is not None:
            wire.add(entry["wire"], wire.difference(after, before))


def write_record(run_dir: str | os.PathLike[str], rank: int, size: int, **sections: Any) -> Path | None:
    """Write this rank's record (``record_path``); None when counting is off. ``sections`` are added as they are
    (other counters' figures, JSON-serialisable)."""
    if _counter is None:
        return None
    outside, examples = _counter.shared_outside(run_dir)
    record = {"rank": rank, "size": size, "host": socket.gethostname(), "pid": os.getpid(),
              "node_local_prefixes": list(_counter.node_local), "interpreter": interpreter(),
              "marks": {**_counter.marks, "exit": _counter.snapshot()}, "spans": _counter.spans,
              "shared_opens_outside_run_dir": outside, "shared_examples": examples, **sections}
    path = record_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def interpreter() -> dict[str, Any]:
    """Where this process's Python and its main packages were loaded from (what staging is meant to change)."""
    modules = {name: getattr(sys.modules[name], "__file__", None)
               for name in ("hpctrain", "torch", "numpy", "mpi4py") if name in sys.modules}
    return {"executable": sys.executable, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
            "modules": modules, "libpython": _mapped_libpython()}


def _mapped_libpython() -> str | None:
    """The libpython this process has mapped (Linux), None for a statically linked interpreter."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "/libpython" in path:
                    return path
    except OSError:
        return None
    return None


def read_records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's record of a run, in rank order."""
    directory = Path(run_dir) / RECORD_DIR
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("rank-*.json"))]
    return sorted(records, key=lambda r: r["rank"])
