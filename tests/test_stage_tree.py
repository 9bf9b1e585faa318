"""The staging broadcast of launchers without one (submission/stage_tree.py), run for real: its text as the job
script runs it (``python -c TEXT ...``), one process per stand-in node under the MPICH wheel's mpiexec, each node
with its own node-local directory (an MPMD section per node) and MPI kept off shared memory (``MPIR_CVAR_NOLOCAL``),
as between nodes.

Counted with strace on every process: the shared file is opened and read by one process whatever the node count,
and every node's copy is byte-identical. A node that cannot write ends the run on every node with one line naming
it, a non-zero exit and no copy or partial file left anywhere; without MPI nothing is read and the marker says why.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.submission.stage_tree import NO_TREE

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
TEXT = (ROOT / "hpctrain" / "submission" / "stage_tree.py").read_text(encoding="utf-8")
CHUNK_MB = 1
HOST = socket.gethostname()
pytestmark = pytest.mark.mpi


def mpi_env() -> dict[str, str]:
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "HPCTRAIN_", "PALS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # The stand-in nodes talk over loopback sockets, not shared memory.
    env.update(OMP_NUM_THREADS="1", MPICH_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE="lo",
               MPIR_CVAR_NOLOCAL="1")
    return env


def tree_argv(nodes: int, run_dir: Path, pairs_per_node: list[list[tuple[Path, Path]]]) -> list[str]:
    """mpiexec with one section per stand-in node, each naming its own destinations."""
    argv = [MPIEXEC]
    for i, pairs in enumerate(pairs_per_node):
        argv += [":"] if i else []
        argv += ["-n", "1", PY, "-c", TEXT, str(nodes), str(run_dir), str(CHUNK_MB)]
        for src, dest in pairs:
            argv += ["--", "copy", str(src), str(dest)]
    return argv


def shared_file(tmp: Path, name: str, size: int) -> Path:
    path = tmp / "shared" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def nodes_dirs(tmp: Path, nodes: int) -> list[Path]:
    dirs = [tmp / f"node{i}" for i in range(nodes)]
    for d in dirs:
        d.mkdir()
    return dirs


def run_dir(tmp: Path) -> Path:
    path = tmp / "run"
    path.mkdir()
    return path


def strace(argv: list[str], trace: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (scripts/ci/install.sh installs it)")
    return subprocess.run(["strace", "-f", "-qq", "-y", "-s", "0", "-e", "trace=openat,open,read", "-o", str(trace),
                           *argv], capture_output=True, text=True, timeout=300, env=env)


_RESULT = re.compile(r"= (-?\d+)")


def reads_of(trace: Path, path: Path) -> tuple[set[str], set[str], int]:
    """Processes that opened ``path``, processes that read it, and the bytes they read, from ``strace -f -y``."""
    openers: set[str] = set()
    readers: set[str] = set()
    pending: set[str] = set()
    nbytes = 0
    target = f'"{path}"'
    for line in trace.read_text(errors="replace").splitlines():
        pid, _, call = line.partition(" ")
        call = call.lstrip()
        if call.startswith(("openat(", "open(")) and target in call and not re.search(r"= -\d", call):
            openers.add(pid)
        elif call.startswith("read(") and f"<{path}>" in call.split(",", 1)[0]:
            readers.add(pid)
            if "<unfinished ...>" in call:
                pending.add(pid)
            elif m := _RESULT.search(call):
                nbytes += max(int(m.group(1)), 0)
        elif call.startswith("<... read resumed>") and pid in pending:
            pending.discard(pid)
            if m := _RESULT.search(call):
                nbytes += max(int(m.group(1)), 0)
    return openers, readers, nbytes


@pytest.mark.parametrize("nodes", [2, 4])
def test_one_process_reads_the_shared_file_and_every_node_gets_the_same_bytes(tmp_path: Path, nodes: int) -> None:
    size = 3 * (CHUNK_MB << 20) + 12345  # four chunks, the last one short
    archive = shared_file(tmp_path, "env.tar", size)
    small = shared_file(tmp_path, "coords.npz", 777)
    dirs = nodes_dirs(tmp_path, nodes)
    run = run_dir(tmp_path)
    trace = tmp_path / "trace.txt"
    done = strace(tree_argv(nodes, run, [[(archive, d / "env.tar"), (small, d / "coords.npz")] for d in dirs]),
                  trace, mpi_env())
    assert done.returncode == 0, done.stderr[-3000:]
    for shared in (archive, small):
        openers, readers, nbytes = reads_of(trace, shared)
        assert len(openers) == 1 and readers == openers, (shared.name, openers, readers)
        assert nbytes == shared.stat().st_size, (shared.name, nbytes)
    for d in dirs:
        assert (d / "env.tar").read_bytes() == archive.read_bytes()
        assert (d / "coords.npz").read_bytes() == small.read_bytes()
        assert sorted(p.name for p in d.iterdir()) == ["coords.npz", "env.tar"]  # no partial file left
    assert not (run / NO_TREE).exists() and not (run / "failure.txt").exists()


def test_a_node_that_cannot_write_ends_the_staging_on_every_node_with_one_line(tmp_path: Path) -> None:
    archive = shared_file(tmp_path, "env.tar", 2 * (CHUNK_MB << 20) + 5)
    dirs = nodes_dirs(tmp_path, 4)
    dirs[2].rmdir()
    dirs[2].write_text("a file where node 2's directory should be")
    run = run_dir(tmp_path)
    done = subprocess.run(tree_argv(4, run, [[(archive, d / "env.tar")] for d in dirs]), capture_output=True,
                          text=True, timeout=300, env=mpi_env())
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if "staging failed" in ln]
    expected = f"hpctrain: staging failed on {HOST}: cannot write {dirs[2]}/env.tar: Not a directory"
    assert lines == [expected], done.stderr[-3000:]
    assert (run / "failure.txt").read_text() == expected.removeprefix("hpctrain: ") + "\n"
    for i in (0, 1, 3):
        assert list(dirs[i].iterdir()) == [], f"node {i} kept a copy of a staging that failed"
    assert sorted(p.name for p in run.iterdir()) == ["failure.txt"]


def test_a_missing_shared_file_is_one_line_from_rank_0(tmp_path: Path) -> None:
    dirs = nodes_dirs(tmp_path, 2)
    run = run_dir(tmp_path)
    missing = tmp_path / "shared" / "nothing.tar"
    done = subprocess.run(tree_argv(2, run, [[(missing, d / "env.tar")] for d in dirs]), capture_output=True,
                          text=True, timeout=300, env=mpi_env())
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if "staging failed" in ln]
    assert lines == [f"hpctrain: staging failed on {HOST}: cannot read {missing}: No such file or directory"], \
        done.stderr[-3000:]
    assert all(list(d.iterdir()) == [] for d in dirs)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs: node-local storage that fills up (mounting one needs root)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                           capture_output=True, timeout=30).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=30, check=True)


def test_too_little_space_on_a_node_is_found_before_writing(tmp_path: Path, tiny_tmpfs: Path) -> None:
    archive = shared_file(tmp_path, "env.tar", 2 * (CHUNK_MB << 20) + 5)
    dirs = nodes_dirs(tmp_path, 3)
    run = run_dir(tmp_path)
    dirs[1] = tiny_tmpfs
    done = subprocess.run(tree_argv(3, run, [[(archive, d / "env.tar")] for d in dirs]), capture_output=True,
                          text=True, timeout=300, env=mpi_env())
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if "staging failed" in ln]
    assert lines == [f"hpctrain: staging failed on {HOST}: {tiny_tmpfs} has 1 MB free, env.tar needs 2 MB"], \
        done.stderr[-3000:]
    assert all(list(d.iterdir()) == [] for d in dirs)


def test_a_node_whose_storage_fills_up_while_writing_fails_and_leaves_nothing(tmp_path: Path,
                                                                              tiny_tmpfs: Path) -> None:
    """Two stand-in nodes share the 1 MB tmpfs: each finds room for its copy before writing (the space check
    ends in a collective before the first byte is sent), the two copies together do not fit."""
    archive = shared_file(tmp_path, "env.tar", 700_000)
    dirs = nodes_dirs(tmp_path, 2) + [tiny_tmpfs / "a", tiny_tmpfs / "b"]
    dirs[2].mkdir()
    dirs[3].mkdir()
    run = run_dir(tmp_path)
    done = subprocess.run(tree_argv(4, run, [[(archive, d / "env.tar")] for d in dirs]), capture_output=True,
                          text=True, timeout=300, env=mpi_env())
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if "staging failed" in ln]
    pattern = re.compile(rf"hpctrain: staging failed on {re.escape(HOST)}: cannot write {re.escape(str(tiny_tmpfs))}"
                         r"/[ab]/env.tar: No space left on device")
    assert lines and all(pattern.fullmatch(ln) for ln in lines), done.stderr[-3000:]
    assert all(list(d.iterdir()) == [] for d in dirs)
    assert (run / "failure.txt").read_text().strip() in {ln.removeprefix("hpctrain: ") for ln in lines}


def test_without_mpi_nothing_is_read_and_the_marker_says_why(tmp_path: Path) -> None:
    """Two processes that are not one MPI job (each its own singleton) and an mpi4py without its MPI library."""
    archive = shared_file(tmp_path, "env.tar", 1000)
    dirs = nodes_dirs(tmp_path, 2)
    run = run_dir(tmp_path)
    traces = [tmp_path / f"trace{i}.txt" for i in range(2)]
    procs = [subprocess.Popen(["strace", "-f", "-qq", "-y", "-e", "trace=openat,open,read", "-o", str(trace), PY,
                               "-c", TEXT, "2", str(run), str(CHUNK_MB), "--", "copy", str(archive),
                               str(d / "env.tar")], env=mpi_env(), stderr=subprocess.PIPE, text=True)
             for d, trace in zip(dirs, traces, strict=True)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [3, 3], errors
    assert all(reads_of(trace, archive) == (set(), set(), 0) for trace in traces)
    assert (run / NO_TREE).read_text() == ("MPI sees 1 processes where the launcher started one on each of 2 nodes "
                                           "(mpi4py's MPI is not the launcher's)\n")
    assert all(list(d.iterdir()) == [] for d in dirs)

    (run / NO_TREE).unlink()
    shim = tmp_path / "shim"  # mpi4py found on PYTHONPATH, as a site module puts it, but no libmpi to load
    shim.mkdir()
    import mpi4py

    (shim / "mpi4py").symlink_to(Path(mpi4py.__file__).parent)
    base = getattr(sys, "_base_executable", sys.executable)
    env = {k: v for k, v in mpi_env().items() if k not in ("LD_LIBRARY_PATH", "VIRTUAL_ENV")}
    done = subprocess.run([base, "-s", "-c", TEXT, "1", str(run), str(CHUNK_MB), "--", "copy", str(archive),
                           str(dirs[0] / "env.tar")], capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": str(shim)})
    assert done.returncode == 3, done.stderr[-3000:]
    assert (run / NO_TREE).read_text().startswith("mpi4py cannot start MPI here: cannot load MPI library")
    assert list(dirs[0].iterdir()) == []
