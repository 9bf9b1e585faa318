"""The cluster of namespace nodes (scripts/ci/cluster.sh) as the tests use it: its nodes and partition, a
directory on its shared file system per test, commands run on one node, and the controls that cut or slow a
node's link, fill its /tmp, or kill and boot a node, each undone when the test ends (fixtures in tests/conftest.py).
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SH = REPO / "scripts" / "ci" / "cluster.sh"
SITE = REPO / "site_configs" / "ci-cluster.yaml"
_UP = ("idle", "mix", "alloc", "comp")


def cluster_sh(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def cluster_env() -> dict[str, str]:
    out = cluster_sh("env", timeout=30).stdout
    return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines() if line.startswith("export "))


def node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True, timeout=15)
    return out.stdout.strip().split("\n")[0]


@dataclass
class Cluster:
    """The running cluster. ``nodes`` in order (node01 ...), ``shared`` a directory every node sees."""

    nodes: tuple[str, ...]
    partition: str
    directory: Path
    shared: Path
    scratch: str
    site: Path = SITE
    _touched: set[str] = field(default_factory=set)
    _drained: set[str] = field(default_factory=set)
    _cut: set[str] = field(default_factory=set)
    _full: set[str] = field(default_factory=set)

    def run(self, node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``argv`` on ``node`` (its network, hostname and mounts), as root."""
        return cluster_sh("exec", node, *argv, timeout=timeout)

    def address(self, node: str) -> str:
        """The node's address on the bridge (cluster.sh's nodes file: NAME ADDRESS CPUS MEMORY_MB)."""
        for line in (self.directory / "nodes").read_text().splitlines():
            name, address, *_ = line.split()
            if name == node:
                return address
        raise KeyError(f"{node} is not in {self.directory / 'nodes'}")

    def local_path(self, node: str, path: str | Path) -> Path:
        """Where a file of ``node``'s /tmp or scratch lies on this machine's disk (to look without entering it)."""
        path = Path(path)
        for mount, backing in (("/tmp", "tmp"), (self.scratch, "scratch")):
            if path == Path(mount) or Path(mount) in path.parents:
                return self.directory / node / backing / path.relative_to(mount)
        raise ValueError(f"{path} is not node-local (not under /tmp or {self.scratch})")

    def link(self, node: str, *args: str) -> None:
        """``cluster.sh link NODE ARGS`` (rate RATE | cut | restore); undone after the test."""
        self._touched.add(node)
        if args[:1] == ("cut",):
            self._cut.add(node)
        out = cluster_sh("link", node, *args)
        assert out.returncode == 0, out.stderr

    def fill_tmp(self, node: str) -> None:
        """``cluster.sh tmp NODE full``: the node's /tmp has no space left; its own /tmp again after the test."""
        self._full.add(node)
        out = cluster_sh("tmp", node, "full")
        assert out.returncode == 0, out.stderr

    def kill(self, node: str) -> None:
        self._touched.add(node)
        out = cluster_sh("node", node, "kill")
        assert out.returncode == 0, out.stderr

    def boot(self, node: str) -> None:
        out = cluster_sh("node", node, "start")
        assert out.returncode == 0, out.stderr

    def drain(self, node: str, reason: str, state: str = "DRAIN") -> None:
        """Take the node out as an administrator would (DRAIN: no new jobs; DOWN: none at all); undone after."""
        self._drained.add(node)
        subprocess.run(["scontrol", "update", f"NodeName={node}", f"State={state}", f"Reason={reason}"], check=True,
                       timeout=15)

    def wait_for_node(self, node: str, prefixes: Iterable[str], timeout: float) -> str:
        """Poll Slurm until the node's state starts with one of ``prefixes`` (a hang guard, not a speed check)."""
        wanted = tuple(prefixes)
        deadline = time.monotonic() + timeout
        while True:
            state = node_state(node)
            if state.startswith(wanted):
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"{node} still '{state}' after {timeout:.0f} s, wanted {wanted}")
            time.sleep(0.5)

    def restore(self) -> None:
        """Every link restored and every node this test touched booted and idle again."""
        for node in sorted(self._full):
            cluster_sh("tmp", node, "restore")
        for node in sorted(self._touched):
            cluster_sh("link", node, "restore")
        for node in sorted(self._cut):  # what ran there behind the cut link is orphaned: the node is rebooted
            cluster_sh("node", node, "kill")
        for node in sorted(self._touched | self._drained):
            out = cluster_sh("node", node, "start")  # boots a killed node; resumes a down or drained one
            assert out.returncode == 0, out.stderr
        self._touched.clear()
        self._drained.clear()
        self._cut.clear()
        self._full.clear()


def start_cluster() -> Cluster:
    """The running cluster, started (with the head's Slurm) when it is not up; fails, never skips."""
    status = cluster_sh("status", timeout=60)
    if status.returncode != 0:
        started = cluster_sh("start", timeout=300)
        if started.returncode != 0:
            pytest.fail("the cluster of namespace nodes could not be started. Run `bash scripts/install.sh` (as root)"
                        " and then `bash scripts/ci/cluster.sh start` to see the error.\n"
                        + (started.stdout + started.stderr)[-3000:], pytrace=False)
    env = cluster_env()
    return Cluster(nodes=tuple(env["HPCTRAIN_CLUSTER_NODE_NAMES"].strip("'").split()),
                   partition=env["HPCTRAIN_CLUSTER_PARTITION"], directory=Path(env["HPCTRAIN_CLUSTER_DIR"]),
                   shared=Path(env["HPCTRAIN_CLUSTER_SHARED"]), scratch=env["HPCTRAIN_CLUSTER_SCRATCH"])


def srun(cluster: Cluster, argv: Sequence[str], *, nodes: int, per_node: int = 1, cwd: Path,
         timeout: float = 300, options: Sequence[str] = (), env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    """``srun`` of ``argv`` on ``nodes`` x ``per_node`` tasks of the cluster's partition (a job of its own)."""
    cmd = ["srun", "-p", cluster.partition, "-N", str(nodes), f"--ntasks-per-node={per_node}", "--time=10",
           "--kill-on-bad-exit=1", *options, *argv]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


class OpenCounter:
    """Counts the opens of some files by any process on this machine, the namespace nodes' included (fanotify:
    the kernel reports each open of a marked inode with the opener's pid; two processes' opens never merge into
    one event, as inotify's do). A test instrument: root only, Linux only.

    with OpenCounter([path, ...]) as opens: ...;  opens.counts -> {path: opens}
    """

    _FAN_CLOEXEC, _FAN_NONBLOCK, _FAN_UNLIMITED_QUEUE = 0x1, 0x2, 0x10
    _FAN_MARK_ADD, _FAN_OPEN, _AT_FDCWD = 0x1, 0x20, -100
    _EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = [Path(p).resolve() for p in paths]
        self.counts: dict[Path, int] = dict.fromkeys(self.paths, 0)
        self.pids: dict[Path, set[int]] = {p: set() for p in self.paths}
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
        libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        self._fd = libc.fanotify_init(self._FAN_CLOEXEC | self._FAN_NONBLOCK | self._FAN_UNLIMITED_QUEUE,
                                      os.O_RDONLY | os.O_LARGEFILE)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")
        for path in self.paths:
            if libc.fanotify_mark(self._fd, self._FAN_MARK_ADD, self._FAN_OPEN, self._AT_FDCWD, bytes(path)) != 0:
                raise OSError(ctypes.get_errno(), f"fanotify_mark {path}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> OpenCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()
        os.close(self._fd)

    def _read(self) -> None:
        while not self._stop.wait(0.05):
            self._drain()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            offset = 0
            while offset + self._EVENT.size <= len(data):
                event_len, _, _, _, _, fd, pid = self._EVENT.unpack_from(data, offset)
                offset += event_len
                if fd < 0:
                    continue
                try:
                    path = Path(os.readlink(f"/proc/self/fd/{fd}"))
                finally:
                    os.close(fd)
                if path in self.counts:
                    self.counts[path] += 1
                    self.pids[path].add(pid)
