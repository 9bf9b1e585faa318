"""hpctrain_bench/wire_counts.py and hpctrain_bench/syscall_trace.py: what ranks send and what they look up, measured.

Real ranks started by the MPICH wheel's mpiexec with the interposer preloaded: the messages each rank sends and
receives over its sockets are those a known sequence of collectives with a fixed algorithm must send, and every
MPI call that communicates is counted, those the Python counter does not see included. And each rank of a real
``hpctrain run`` under strace: what a rank opens, stats and lists at start-up does not grow with the rank count.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain_bench import syscall_trace, wire_counts

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
WORKER = str(ROOT / "tests" / "mp_helpers" / "wire_worker.py")
K = 5  # all-reduces, then exchanges, per rank
PAYLOAD = 64  # bytes of each


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wire_counts.build(tmp_path_factory.mktemp("wire"))


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC",
            "HPCTRAIN_", "MPIR_CVAR_", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.mark.processes
def test_every_mpi_function_mpi4py_calls_is_wrapped(library: Path) -> None:
    """No MPI call can pass the interposer: each MPI_ function mpi4py's extension imports has a wrapper in the
    library (the ABI queries mpi4py makes before any MPI library is loaded aside)."""
    import mpi4py

    if shutil.which("nm") is None:
        pytest.fail("nm (binutils) is needed to list the MPI functions mpi4py imports")
    (extension,) = Path(mpi4py.__file__).parent.glob("MPI.mpich.*.so")
    imported = {line.split()[-1] for line in subprocess.run(["nm", "-D", "--undefined-only", str(extension)],
                                                            capture_output=True, text=True, check=True).stdout
                .splitlines() if line.split()[-1].startswith("MPI_")}
    defined = {line.split()[-1] for line in subprocess.run(["nm", "-D", "--defined-only", str(library)],
                                                           capture_output=True, text=True, check=True).stdout
               .splitlines()}
    constants = {name for name in imported if name[4:].isupper()}  # MPI_UNWEIGHTED, MPI_WEIGHTS_EMPTY: data
    missing = sorted(name for name in imported - defined - constants if not name.startswith(wire_counts.SKIPPED))
    assert len(imported) > 300 and missing == []


def test_nothing_is_loaded_or_counted_without_the_switch() -> None:
    code = ("from hpctrain.runtime.counting import counters, wire; counters.enable(); counters.mark('x');"
            "print(wire.snapshot(), 'wire' in counters.current().marks['x'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(),
                         check=True, cwd=ROOT)
    assert out.stdout.split() == ["None", "False"]


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 4])
def test_messages_at_the_socket_are_what_the_algorithm_sends(tmp_path: Path, library: Path, n: int) -> None:
    # Recursive doubling for the all-reduce, dissemination (k = 2) for the barrier: log2 N messages each per rank.
    env = _clean_env(HPCTRAIN_COUNTERS="1", MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM="recursive_doubling",
                     MPIR_CVAR_BARRIER_INTRA_ALGORITHM="k_dissemination", MPIR_CVAR_BARRIER_DISSEM_KVAL="2",
                     **wire_counts.environment(library, environ={}))
    out = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, WORKER, str(K), str(tmp_path)],
                         capture_output=True, text=True, timeout=200, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(n)]
    rounds = int(math.log2(n))
    headers = set()
    for window, messages in (("allreduce", K * rounds + rounds), ("sendrecv", K + rounds)):
        received = wire_counts.received_messages([r[window] for r in ranks])
        for r, rank in enumerate(ranks):
            t = wire_counts.totals(rank[window])
            assert t["sent_messages"] == messages and received[r] == messages, (window, r, t, received)
            # every message carries the same header; the payloads are K * rounds (or K) times 64 bytes
            payload = PAYLOAD * (K * rounds if window == "allreduce" else K)
            header, rest = divmod(t["sent_bytes"] - payload, messages)
            assert rest == 0 and 0 < header <= 64, t
            headers.add(header)
    assert len(headers) == 1
    for rank in ranks:
        calls = {name: c for name, c in rank["whole"]["calls"].items()
                 if wire_counts.COMMUNICATING.match(name.removesuffix("_c"))}
        # the Python counter's 2 K + 3 barriers, and five calls it does not see: the communicator's two
        # duplicates, the barrier of its close and the two frees
        assert calls == {"MPI_Allreduce_c": K, "MPI_Sendrecv_c": K, "MPI_Barrier": 4, "MPI_Comm_dup": 2,
                         "MPI_Comm_free": 2}, calls
        assert rank["python_calls"] == 2 * K + 3
        assert wire_counts.communication_calls(rank["whole"]) - rank["python_calls"] == 5


def _scale_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("scale_benchmark", ROOT / "benchmarks" / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_what_a_rank_opens_and_stats_at_start_up_does_not_grow_with_the_ranks(tmp_path: Path,
                                                                              library: Path) -> None:
    """benchmarks/scale.py's run of ``hpctrain run`` on 2 and on 4 ranks, every rank under strace: no rank's
    opens, stat-family calls or directory reads before its first step grow from N = 2 to N = 4 (a path that
    looks up one file per rank would add at least 2), while the run itself is what the benchmark measures."""
    if shutil.which("strace") is None:
        pytest.fail("strace is needed (scripts/install.sh installs it)")
    scale = _scale_module()
    runs = {n: scale.run_once(n, tmp_path, sys.executable, wire_library=library) for n in (2, 4)}
    for kind in ("opens", "stats", "readdirs"):
        per_n = {}
        for n, run in runs.items():
            assert len(run.traces) == n
            per_n[n] = [sum(syscall_trace.between(w, None, "startup")[kind].values()) for w in run.traces]
        assert min(per_n[2]) > 0
        assert max(per_n[4]) <= max(per_n[2]) + 1 and min(per_n[4]) <= min(per_n[2]) + 1, (kind, per_n)
    # the interposer's counts came back in every rank's record, for every window the benchmark reads
    for run in runs.values():
        assert set(run.wire) == {"startup", "steps", "saves", "close"}
        assert all(wire_counts.totals(c)["sent_messages"] > 0 for c in run.wire["steps"])


def test_a_strace_log_is_split_at_the_marks_and_by_location(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.strace"
    log.write_text("\n".join([
        '7 openat(AT_FDCWD</run>, "/lus/venv/x.py", O_RDONLY|O_CLOEXEC) = 3</lus/venv/x.py>',
        '7 newfstatat(AT_FDCWD</run>, "data/a.npy", {st_mode=S_IFREG|0644, ...}, 0) = 0',
        '7 read(3</lus/venv/x.py>, "x = \\") = 5\\"", 4096) = 11',
        '8 openat(AT_FDCWD</run>, "/proc/self/maps", O_RDONLY <unfinished ...>',
        '8 <... openat resumed>) = 4</proc/self/maps>',
        '7 getdents64(5</nvme/env/lib>, 0x55d0 /* 12 entries */, 32768) = 400',
        '7 newfstatat(AT_FDCWD</run>, "/.hpctrain-mark/startup", 0x7ffd, 0) = -1 ENOENT (No such file or directory)',
        '7 openat(5</lus/run>, "ckpt/x.pt", O_WRONLY|O_CREAT, 0644) = 6</lus/run/ckpt/x.pt>',
        '7 pread64(6</lus/run/ckpt/x.pt>, "abc", 3, 0) = 3',
        '7 read(9<socket:[123]>, "abc", 3) = 3',
    ]) + "\n")
    windows = syscall_trace.count(log, "/run", node_local=("/nvme/",))
    assert list(windows) == ["startup", "end"]
    before, after = windows["startup"], windows["end"]
    assert before["opens"] == {"node_local": 0, "shared": 1, "system": 1}
    assert before["stats"]["shared"] == 1 and before["readdirs"]["node_local"] == 1
    assert before["read_bytes"]["shared"] == 11
    assert after["opens"]["shared"] == 1 and after["read_bytes"] == {"node_local": 0, "shared": 3, "system": 0}
    assert syscall_trace.between(windows, None, "end")["opens"]["shared"] == 2


def test_a_directory_listing_counts_once_whatever_the_directory_size(tmp_path: Path) -> None:
    """A listing is the getdents64 calls on one descriptor up to the one that returns 0: a directory that holds
    more entries (more calls) is still one listing, so a shared /tmp filling up cannot change a rank's count."""
    log = tmp_path / "rank-0.strace"
    chunk = '7 getdents64(5</lus/big>, 0x55d0 /* 900 entries */, 32768) = 32760'
    log.write_text("\n".join([
        chunk, chunk, chunk,
        '7 getdents64(5</lus/big>, 0x55d0 /* 0 entries */, 32768) = 0',
        '7 getdents64(5</lus/big>, 0x55d0 /* 3 entries */, 32768) = 80',  # listed again on the same descriptor
        '7 getdents64(5</lus/big>, 0x55d0 /* 0 entries */, 32768) = 0',
        '8 getdents64(5</lus/other>, 0x55d0 /* 3 entries */, 32768) = 80',  # another thread's descriptor 5
        '7 getdents64(6</nvme/env>, 0x55d0 /* 3 entries */, 32768) = 80 <unfinished ...>',
    ]) + "\n")
    counts = syscall_trace.count(log, "/run", node_local=("/nvme/",))["end"]["readdirs"]
    assert counts == {"node_local": 1, "shared": 3, "system": 0}


def test_mkdir_and_fsync_of_one_directory_are_counted_apart_from_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.strace"
    log.write_text("\n".join([
        '7 mkdir("/lus/run/ckpt/step-3", 0777) = 0',
        '7 mkdirat(AT_FDCWD</lus/run>, "ckpt/step-3", 0777) = -1 EEXIST (File exists)',
        '7 mkdir("/lus/run/ckpt/step-3/sub", 0777) = 0',
        '8 fsync(5</lus/run/ckpt/step-3>) = 0',
        '8 fdatasync(6</lus/run/ckpt/step-3/node-0.pt>) = 0',
        '8 fsync(7</lus/run/ckpt>) = 0',
    ]) + "\n")
    assert syscall_trace.directory_ops(log, "/lus/run/ckpt/step-3", cwd="/lus/run") == {"mkdir": 2, "fsync": 1}
    windows = syscall_trace.count(log, "/lus/run")
    assert sum(windows["end"]["stats"].values()) == 0 and sum(windows["end"]["opens"].values()) == 0
