"""What MPI must be told before ``MPI_Init``: the PyPI mpich wheel starts over TCP (loopback on one node).

The wheel's MPICH (ch4, built with the UCX and libfabric netmods) starts UCX by default, and UCX exchanges the
address of every transport at ``MPI_Init`` even when all ranks share one node. That exchange failed once here
under ``srun --mpi=pmi2`` ("UCX ERROR failed to unpack address, invalid bandwidth 0.00", also reported as
pmodels/mpich#7417). On one node the libfabric netmod is used instead, with its ``tcp`` provider on the loopback
interface. Not libfabric's shared-memory provider (``shm``): its address is the string ``fi_shm://<pid>:<uid>:<n>``,
whose length follows the number of digits in the rank's PID, and MPICH's address exchange at ``MPI_Init`` assumes
every rank's address has the length of its own. A job whose ranks' PIDs straddle a power of ten (9999 and 10000,
or a PID counter wrapping from 32767 to 300) aborted in ``MPI_Init`` with "Message truncated"
(tests/test_comm.py sets the PIDs to show it). A TCP address is a fixed-size ``sockaddr_in``. Messages between the
ranks go through MPICH's own shared memory either way (ch4's posix module), not through the netmod.

On several nodes the wheel uses the same tcp provider, on the interface libfabric picks (a site sets
``FI_TCP_IFACE`` in its environment to choose). UCX's address is about 4.5 KiB per node; MPICH puts it into the
process manager's key-value space in segments of up to 1,022 hex digits, each a PMI-1 request line of up to
~1,080 bytes, and Slurm's ``mpi/pmi2`` plugin reads a PMI-1 request with ONE ``read`` of at most 1,024 bytes
(src/plugins/mpi/pmi2/pmi1.c, ``MAX_READLINE``; the wheel's MPICH speaks no PMI-2 wire protocol). A segment whose
bytes do not compress (MPICH run-length encodes repeated bytes) overflows that read, the rest of the line is read
as a request of its own, and every rank waits in ``MPI_Init`` for ever: seen in CI under ``srun --mpi=pmi2``
across two namespace nodes. The tcp provider's address is one request of under 100 bytes.
A site's own MPI (mpi4py built against it) is left as it is, and so is a transport the user chose.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType

from hpctrain.launch_env import detect_launch_env

# MPICH reads MPICH_CH4_NETMOD (MPIR_CVAR_CH4_NETMOD), libfabric reads FI_PROVIDER and FI_TCP_IFACE during MPI_Init.
SEVERAL_NODES_WHEEL = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
ONE_NODE_WHEEL = {**SEVERAL_NODES_WHEEL, "FI_TCP_IFACE": "lo"}
# Where MPICH keeps a node's shared-memory segments (POSIX shared memory on Linux).
SHM_DIR = Path("/dev/shm")
# Any of these set by the user or the site means they chose the transport: hpctrain then sets nothing.
USER_CHOICES = ("MPICH_CH4_NETMOD", "MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE", "UCX_TLS",
                "MPI4PY_LIBMPI")


def mpich_wheel_in_use(prefix: str = sys.exec_prefix) -> bool:
    """Whether mpi4py will load the mpich wheel's ``libmpi``: mpi4py looks in this environment's ``lib/`` first."""
    try:
        dist = metadata.distribution("mpich")
    except metadata.PackageNotFoundError:
        return False
    wanted = (Path(prefix) / "lib" / "libmpi.so.12").resolve()
    return any(str(f).endswith("libmpi.so.12") and Path(str(dist.locate_file(f))).resolve() == wanted
               for f in dist.files or ())


def wheel_settings(environ: Mapping[str, str], wheel: bool) -> dict[str, str]:
    """The variables to set before ``MPI_Init``: libfabric's tcp provider, on loopback when every rank is on this
    node; empty when the wheel is not used or the user chose a transport."""
    if not wheel or any(name in environ for name in USER_CHOICES):
        return {}
    env = detect_launch_env(environ)
    if env.local_size < env.size:  # ranks on other nodes: libfabric picks the interface that reaches them
        return dict(SEVERAL_NODES_WHEEL)
    return dict(ONE_NODE_WHEEL)


def mpich_world_id(environ: Mapping[str, str]) -> int | None:
    """The id MPICH gives the job when Slurm serves PMI-2 (``srun --mpi=pmi2``): the 32-bit FNV-1a hash of the PMI
    job id, which Slurm makes ``JOBID.STEPID``; None outside such a step. The same job and step ids give the
    same id: a requeued job's first step, or a job id that a Slurm started afresh hands out again."""
    job, step = environ.get("SLURM_JOB_ID"), environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if not job or not step or "PMI_FD" not in environ:
        return None
    value = 0x811C9DC5
    for byte in f"{job}.{step}".encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def remove_stale_segments(environ: Mapping[str, str], shm_dir: Path = SHM_DIR, min_age_s: float = 5.0) -> list[Path]:
    """Unlink the shared-memory segments an earlier run of this job step left behind; returns those removed.

    MPICH names a job's segment on a node ``mpich_shm_<world id>_<node>`` and lets the rank that creates it
    set it up; the others wait, spinning, until it is ready. A run whose ranks were killed (walltime,
    ``srun --kill-on-bad-exit``, ``kill -9``) leaves its segment behind, and a later step with the same world
    id (``mpich_world_id``) opens that one instead: no rank creates it, and every rank of the node waits in
    ``MPI_Init`` for ever. A segment is stale when it is older than ``min_age_s`` (a rank of this step may have
    created it a moment ago) and no process has it open or mapped (a rank of this step that started earlier).
    """
    world = mpich_world_id(environ)
    if world is None:
        return []
    candidates = [*shm_dir.glob(f"mpich_shm_{world:x}_*"), *shm_dir.glob(f"mpich_vci_{world:x}_*")]
    removed: list[Path] = []
    for path in candidates:
        try:
            if time.time() - path.stat().st_mtime < min_age_s or _in_use(path):
                continue
            path.unlink()
        except OSError:  # gone meanwhile, or another user's
            continue
        removed.append(path)
    return removed


def _in_use(path: Path) -> bool:
    """Whether any process of this machine has ``path`` open or mapped (as far as /proc lets us see)."""
    target = str(path)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                return True
            if target in (proc / "maps").read_text(errors="replace"):
                return True
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return False


def import_mpi(environ: Mapping[str, str] | None = None, timeout_s: float | None = None) -> ModuleType:
    """``mpi4py.MPI`` (importing it calls ``MPI_Init``), after putting what ``wheel_settings`` asks for
    into this process's environment; ``environ`` (default ``os.environ``) is where the launcher's variables
    are read. ``MPI_Init`` waits for every rank of the job: with ``timeout_s`` a rank still waiting after that
    long says so and is ended by its watcher process (its launcher then ends the others) instead of waiting for
    ever."""
    if "mpi4py.MPI" not in sys.modules:
        wheel = mpich_wheel_in_use()
        os.environ.update(wheel_settings(os.environ if environ is None else environ, wheel))
        if wheel:
            for path in remove_stale_segments(os.environ if environ is None else environ):
                print(f"hpctrain: removed {path}, a shared-memory segment an earlier run of this Slurm job step "
                      "left behind when its ranks were killed: MPI_Init would have waited on it for ever",
                      file=sys.stderr, flush=True)
        if timeout_s is not None:
            watcher = _start_init_watcher(timeout_s)
            try:
                from mpi4py import MPI
            finally:
                _stop_init_watcher(watcher)
            return MPI
    from mpi4py import MPI

    return MPI


def _start_init_watcher(timeout_s: float) -> int:
    """A child process that, unless stopped first, says after ``timeout_s`` that this rank's ``MPI_Init`` has not
    completed and ends the rank (SIGKILL: its launcher then ends the others). Not a thread: mpi4py calls
    ``MPI_Init_thread`` holding the GIL, so no Python thread of this process runs until ``MPI_Init`` returns —
    a timer thread fired only once the late rank had arrived, and lost the race to a cancel now and then
    (docs/runtime.md). The message says what the rank was doing (``init_wait_state``)."""
    from hpctrain.launch_env import rank_label

    head = f"hpctrain: error: rank {rank_label(os.environ)}: MPI_Init did not complete within {timeout_s:g} s"
    tail = ("a rank of this job has not started (slow start-up from the shared file system?); raise "
            "train.collective_timeout_s or stage the environment to node-local storage (docs/scaling.md)\n")
    rank_pid = os.getpid()
    child = os.fork()
    if child == 0:  # only sleep, read /proc, write and kill here: nothing of the parent's state is used
        try:
            time.sleep(timeout_s)
            os.write(2, f"{head} ({init_wait_state(rank_pid)}): {tail}".encode())
            os.kill(rank_pid, signal.SIGKILL)
        finally:
            os._exit(0)
    return child


def init_wait_state(pid: int, sample_s: float = 1.0) -> str:
    """What process ``pid`` is doing, from /proc: busy (MPICH waits for the node's other ranks by spinning) or
    blocked in the kernel (a read from the process manager, say), with its CPU seconds per second over
    ``sample_s`` and the kernel's wait channel."""

    def sample() -> tuple[str, float]:
        fields = _read_proc(pid, "stat").rsplit(")", 1)[-1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return fields[0], (int(fields[11]) + int(fields[12])) / ticks  # state, utime + stime

    try:
        first, before = sample()
        time.sleep(sample_s)
        state, after = sample()
    except (OSError, IndexError, ValueError):
        return "its state could not be read"
    cpu = (after - before) / sample_s
    if "R" in (first, state) or cpu >= 0.05:  # a spinning rank shares the cores with the load: any CPU at all
        return f"busy: {cpu:.2f} s of CPU per second, waiting for the node's other ranks"
    wchan = _read_proc(pid, "wchan").strip()
    where = f", kernel wait {wchan}" if wchan and wchan != "0" else ""
    return f"blocked: state {state}, {cpu:.2f} s of CPU per second{where}"


def _read_proc(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _stop_init_watcher(child: int) -> None:
    try:
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(child, 0)
