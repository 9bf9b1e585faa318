"""The staging broadcast where the launcher has none (PBS Pro's and Cobalt's): one process per node, rank 0 reads
each file from the shared file system once, MPI_Bcast carries it in fixed-size chunks to every node (MPICH's
broadcast is a tree), and every node writes its copy to node-local storage under a temporary name, then renames it.

The job script carries this text and runs it as ``PYTHON -c TEXT NODES RUN_DIR CHUNK_MB
[-- copy SRC DEST]...`` with the job's own interpreter, before anything is staged: it needs only the standard
library and mpi4py, never hpctrain. Exit status: 0 every node holds every file, its size and CRC-32 checked against
what rank 0 read; 1 a node failed (one line naming the node, and the run's failure note, the first node to fail
wins); 3 no usable MPI here (no mpi4py, or MPI does not see NODES processes): nothing was read or written, and
``RUN_DIR/.staging-no-tree`` says why, so that the script can let every node read the shared copies itself.
"""

from __future__ import annotations

import os
import socket
import sys
import zlib
from typing import Any

NO_TREE = ".staging-no-tree"  # in RUN_DIR: MPI did not come up, nothing was staged
FAILURE_NOTE = "failure.txt"
EXIT_FAILED = 1
EXIT_NO_TREE = 3


def parse(argv: list[str]) -> tuple[int, str, int, list[tuple[str, str]]]:
    """``NODES RUN_DIR CHUNK_MB [-- copy SRC DEST]...`` -> (nodes, run_dir, chunk bytes, [(src, dest)])."""
    nodes, run_dir, chunk_mb, rest = int(argv[0]), argv[1], int(argv[2]), argv[3:]
    pairs: list[tuple[str, str]] = []
    while rest:
        if rest[:2] != ["--", "copy"] or len(rest) < 4:
            raise SystemExit(f"hpctrain-stage-tree: expected '-- copy SRC DEST', got {rest[:4]}")
        pairs.append((rest[2], rest[3]))
        rest = rest[4:]
    return nodes, run_dir, chunk_mb << 20, pairs


def note_failure(run_dir: str, node: str, message: str) -> None:
    """Print the node's line and publish it as the run's failure note unless a node did first."""
    line = f"staging failed on {node}: {message}"
    print(f"hpctrain: {line}", file=sys.stderr, flush=True)
    tmp = os.path.join(run_dir, f".failure.txt.{node}.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(line + "\n")
        os.link(tmp, os.path.join(run_dir, FAILURE_NOTE))
    except OSError:
        pass
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def no_tree(run_dir: str, why: str) -> int:
    """Leave the marker that tells the script to stage node by node; the first process to write it wins."""
    try:
        fd = os.open(os.path.join(run_dir, NO_TREE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(why + "\n")
    except OSError:
        pass
    return EXIT_NO_TREE


def free_bytes(path: str) -> int:
    st = os.statvfs(os.path.dirname(path) or ".")
    return st.f_bavail * st.f_frsize


class Receiver:
    """One node's copy of one file: written to ``DEST.partial``, renamed to DEST once complete and checked."""

    def __init__(self, dest: str, size: int) -> None:
        self.dest, self.partial, self.size = dest, dest + ".partial", size
        self.crc, self.error, self.fd = 0, "", -1
        try:
            if os.path.lexists(self.partial):
                os.unlink(self.partial)
            free = free_bytes(dest)
            if free < size:
                self.error = (f"{os.path.dirname(dest)} has {free >> 20} MB free, {os.path.basename(dest)} needs "
                              f"{size >> 20} MB")
                return
            self.fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            self.error = f"cannot write {dest}: {exc.strerror or exc}"

    def write(self, data: memoryview) -> None:
        if self.error:
            return
        self.crc = zlib.crc32(data, self.crc)
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError as exc:
            self.error = f"cannot write {self.dest}: {exc.strerror or exc}"

    def finish(self, crc: int) -> None:
        """Check size and checksum against rank 0's, then rename into place (the partial file is removed if not)."""
        if not self.error:
            written = os.fstat(self.fd).st_size
            if written != self.size or self.crc != crc:
                self.error = (f"the copy of {self.dest} is wrong: {written} bytes, CRC-32 {self.crc:08x}; "
                              f"rank 0 read {self.size} bytes, CRC-32 {crc:08x}")
        self.close()
        if not self.error:
            try:
                os.replace(self.partial, self.dest)
            except OSError as exc:
                self.error = f"cannot rename {self.partial} to {self.dest}: {exc.strerror or exc}"
        if self.error:
            self.discard()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def discard(self) -> None:
        self.close()
        try:
            os.unlink(self.partial)
        except OSError:
            pass


def read_full(source: Any, view: memoryview) -> int:
    """Fill ``view`` from ``source`` (short only at the end of the file); the number of bytes read."""
    got = 0
    while got < len(view):
        n = source.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def broadcast_file(comm: Any, src: str, dest: str, buffer: bytearray) -> tuple[bool, str]:
    """Send ``src`` from rank 0 to ``dest`` on every rank: (whether any rank failed, this rank's failure or '').

    Every rank takes the same collective steps whatever fails where, so a failure anywhere ends the file on every
    rank at the same chunk: one allreduce per chunk carries rank 0's read of this chunk and every rank's write of
    the previous one.
    """
    from mpi4py import MPI

    rank = comm.Get_rank()
    source = None
    header: tuple[int, str] = (0, "")
    if rank == 0:
        try:
            source = open(src, "rb", buffering=0)
            header = (os.fstat(source.fileno()).st_size, "")
        except OSError as exc:
            header = (-1, f"cannot read {src}: {exc.strerror or exc}")
    try:
        size, error = comm.bcast(header, root=0)
        if size < 0:
            return True, error if rank == 0 else ""
        receiver = Receiver(dest, size)
        view = memoryview(buffer)
        sent, crc = 0, 0
        while True:
            n = min(len(buffer), size - sent)
            if source is not None and n and not receiver.error:
                try:
                    got = read_full(source, view[:n])
                    if got != n:
                        receiver.error = f"{src} ended at {sent + got} bytes, not {size}"
                except OSError as exc:
                    receiver.error = f"cannot read {src}: {exc.strerror or exc}"
                crc = zlib.crc32(view[:n], crc)
            if comm.allreduce(bool(receiver.error), op=MPI.LOR):
                receiver.discard()
                return True, receiver.error
            if n == 0:
                break
            comm.Bcast([view[:n], MPI.BYTE], root=0)
            receiver.write(view[:n])
            sent += n
        receiver.finish(comm.bcast(crc, root=0))
        return comm.allreduce(bool(receiver.error), op=MPI.LOR), receiver.error
    finally:
        if source is not None:
            source.close()


def main(argv: list[str]) -> int:
    nodes, run_dir, chunk, pairs = parse(argv)
    node = socket.gethostname()
    try:
        from mpi4py import MPI
    except Exception as exc:  # ImportError, or mpi4py's RuntimeError when it cannot load an MPI library
        why = (str(exc).splitlines() or [repr(exc)])[0]
        return no_tree(run_dir, f"mpi4py cannot start MPI here: {why}")
    comm = MPI.COMM_WORLD
    if comm.Get_size() != nodes:
        return no_tree(run_dir, f"MPI sees {comm.Get_size()} processes where the launcher started one on each of "
                       f"{nodes} nodes (mpi4py's MPI is not the launcher's)")
    buffer = bytearray(chunk)
    for src, dest in pairs:
        failed, error = broadcast_file(comm, src, dest, buffer)
        if error:
            note_failure(run_dir, node, error)
        if failed:
            return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
