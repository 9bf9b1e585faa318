"""The check one node runs before training: how long the interpreter takes to import torch, the memory free, the
node-local directories writable with the space the job needs, the devices the profile promises (a tiny kernel on
each), and whether the node reaches the job's first node, where it reports, with its clock's offset from it.

One process per node, started by the launcher in one step (``python -m hpctrain.nodes.check``); the batch script's
gatherer (``hpctrain.submission.launchers.node_check``) listens on the first node at ``HPCTRAIN_NODE_CHECK_ADDR``.
The protocol is two JSON lines each way on one TCP connection: the node sends its clock (``t0``), the gatherer
answers with its own (``t1``), the node sends its report with the offset ``t1 - (t0 + t2) / 2`` and the round
trip ``t2 - t0`` (the NTP estimate), the gatherer answers ``ok``. A node that cannot reach the gatherer prints its
report on its standard output (the job's log). It exits 0 either way: the gatherer judges, and a launcher that ends
a step at its first failed task (srun --kill-on-bad-exit) must not stop the other nodes' reports. Plain standard
library; torch only to time it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ADDRESS_ENV = "HPCTRAIN_NODE_CHECK_ADDR"
RESULTS_FILE = "node-check.json"  # in the run directory: every node's report and the gatherer's choice
PROBE_BYTES = 1 << 20  # written, synced and read back in each node-local directory
MIN_FREE_TMP_BYTES = 64 << 20  # /tmp below this breaks compilers, MPI's shared memory, torch's caches
MAX_LINE = 64 << 10


@dataclass(frozen=True)
class CheckSettings:
    """What one node checks: ``local_dirs`` with the bytes each must have free, the memory, the devices."""

    local_dirs: tuple[tuple[str, int], ...] = (("/tmp", MIN_FREE_TMP_BYTES),)
    min_memory_gb: float = 0.0
    devices: int = 0
    device_kind: str = "none"
    import_module: str = "torch"
    timeout_s: float = 60.0


@dataclass
class NodeReport:
    """One node's answers; ``problems`` empty on a healthy node."""

    node: str
    problems: list[str] = field(default_factory=list)
    import_s: float | None = None
    memory_free_gb: float | None = None
    local_free_gb: dict[str, float] = field(default_factory=dict)
    devices: int | None = None
    offset_s: float | None = None
    round_trip_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def short_name(host: str) -> str:
    """``nid001.cluster`` -> ``nid001``: schedulers list short names, ``gethostname`` may give the long one."""
    return host.split(".", 1)[0]


def free_memory_gb(meminfo: str) -> float | None:
    """MemAvailable of ``/proc/meminfo``'s text, in GB (None where absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return None


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def check_directory(path: str, need_bytes: int) -> tuple[float | None, str | None]:
    """(free GB, problem): the directory (or, where it is not made yet, its nearest existing parent) takes a file
    of PROBE_BYTES written, synced and read back, and has ``need_bytes`` free beside it."""
    directory = Path(path)
    while not directory.exists() and directory.parent != directory:
        directory = directory.parent  # not made yet (staging makes it): its nearest existing directory must do
    if not directory.is_dir():
        return None, f"{directory} is not a directory"
    try:
        stat = os.statvfs(directory)
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    free = stat.f_bavail * stat.f_frsize
    probe = directory / f".hpctrain-node-check.{os.getpid()}"
    data = os.urandom(4096) * (PROBE_BYTES // 4096)
    try:
        with open(probe, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if probe.read_bytes() != data:
            return free / 1e9, f"{path}: a file written there reads back different"
    except OSError as exc:
        return free / 1e9, f"{path}: cannot write a {PROBE_BYTES >> 20} MiB file ({exc.strerror or exc})"
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    if free < need_bytes:
        return free / 1e9, f"{path} has {gb(free)} free, the job needs {gb(need_bytes)}"
    return free / 1e9, None


def check_devices(kind: str, expected: int) -> tuple[int | None, str | None]:
    """(devices seen, problem): ``expected`` devices of ``kind`` visible, each running a tiny kernel."""
    if expected <= 0 or kind == "none":
        return None, None
    import torch

    backend = "xpu" if kind == "intel" else "cuda"  # ROCm's torch answers as cuda
    module = getattr(torch, backend, None)
    if module is None or not module.is_available():
        return 0, f"no {kind} device is visible (the node should have {expected})"
    count = int(module.device_count())
    if count < expected:
        return count, f"{count} {kind} devices visible, the job needs {expected}"
    for index in range(expected):
        device = torch.device(backend, index)
        try:
            value = float(torch.ones(64, device=device).sum().item())
        except Exception as exc:  # a device that fell off the bus raises from its runtime, any class
            return count, f"{kind} device {index} fails a tiny kernel ({type(exc).__name__}: {exc})"
        if value != 64.0:
            return count, f"{kind} device {index} computes a wrong sum ({value} for 64)"
    return count, None


def time_import(module: str) -> tuple[float | None, str | None]:
    """(seconds, problem) of importing ``module`` in this interpreter."""
    if not module:
        return None, None
    start = time.perf_counter()
    try:
        __import__(module)
    except Exception as exc:  # a broken environment raises anything from the module's own code
        return None, f"{sys.executable} cannot import {module} ({type(exc).__name__}: {exc})"
    return time.perf_counter() - start, None


def check_node(settings: CheckSettings, host: str | None = None) -> NodeReport:
    """Everything but the network: this node's report."""
    report = NodeReport(node=short_name(host or socket.gethostname()))
    report.import_s, problem = time_import(settings.import_module)
    report.problems += [problem] if problem else []
    try:
        report.memory_free_gb = free_memory_gb(Path("/proc/meminfo").read_text())
    except OSError:
        report.memory_free_gb = None
    if report.memory_free_gb is not None and report.memory_free_gb < settings.min_memory_gb:
        report.problems.append(f"{report.memory_free_gb:.3g} GB of memory free, the job needs "
                               f"{settings.min_memory_gb:.3g} GB")
    for path, need in settings.local_dirs:
        free, problem = check_directory(path, need)
        if free is not None:
            report.local_free_gb[path] = round(free, 3)
        report.problems += [problem] if problem else []
    try:
        report.devices, problem = check_devices(settings.device_kind, settings.devices)
    except ImportError as exc:
        problem = f"cannot check the {settings.device_kind} devices ({exc})"
    report.problems += [problem] if problem else []
    return report


def _send(sock: socket.socket, data: dict[str, Any]) -> None:
    sock.sendall(json.dumps(data).encode() + b"\n")


def _receive(reader: Any) -> dict[str, Any]:
    line = reader.readline(MAX_LINE)
    if not line.endswith(b"\n"):
        raise ConnectionError("the gatherer closed the connection")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ConnectionError("the gatherer's answer is not a JSON object")
    return value


def report_to(address: str, report: NodeReport, deadline: float) -> str | None:
    """Send ``report`` to the gatherer at ``host:port``, retrying until ``deadline`` (monotonic); None when it was
    received, else why not."""
    host, _, port = address.rpartition(":")
    last = "no attempt"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"cannot reach the first node {address}: {last}"
        try:
            with socket.create_connection((host, int(port)), timeout=min(left, 10.0)) as sock:
                sock.settimeout(max(deadline - time.monotonic(), 0.1))
                reader = sock.makefile("rb")
                t0 = time.time()
                _send(sock, {"node": report.node, "t0": t0})
                t1 = float(_receive(reader)["t1"])
                t2 = time.time()
                report.offset_s, report.round_trip_s = t1 - (t0 + t2) / 2, t2 - t0
                _send(sock, report.as_dict())
                if _receive(reader).get("ok"):
                    return None
                last = "the gatherer did not take the report"
        except (OSError, ValueError, KeyError, ConnectionError) as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.nodes.check", description=__doc__)
    parser.add_argument("--local-dir", action="append", default=[], metavar="PATH[:BYTES]",
                        help="a node-local directory that must be writable, with BYTES free (repeatable)")
    parser.add_argument("--min-memory-gb", type=float, default=0.0)
    parser.add_argument("--devices", type=int, default=0, help="devices this node must show")
    parser.add_argument("--device-kind", default="none")
    parser.add_argument("--import", dest="import_module", default="torch")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole check")
    parser.add_argument("--node-name", default=None,
                        help="this node's name as the scheduler lists it (default: its host name, short)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    dirs = [(d.rsplit(":", 1)[0], int(d.rsplit(":", 1)[1])) if ":" in d else (d, MIN_FREE_TMP_BYTES)
            for d in args.local_dir]
    settings = CheckSettings(local_dirs=tuple(dirs) or CheckSettings.local_dirs, min_memory_gb=args.min_memory_gb,
                             devices=args.devices, device_kind=args.device_kind, import_module=args.import_module,
                             timeout_s=args.timeout)
    report = check_node(settings, args.node_name)
    address = os.environ.get(ADDRESS_ENV, "")
    problem = report_to(address, report, deadline) if address else f"{ADDRESS_ENV} is not set"
    if problem is None:
        return 0
    report.problems.append(problem)
    print("hpctrain: node check: " + json.dumps(report.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
