#!/bin/bash
#PBS -N ffn-aurora
#PBS -l select=2:ncpus=208:ngpus=6:mpiprocs=12:ompthreads=8
#PBS -l walltime=01:00:00
#PBS -l place=scatter
#PBS -q debug
#PBS -A connectomics
#PBS -l filesystems=home:flare
#PBS -o /RUN_DIR/pbs.out
#PBS -j oe
#PBS -k doe
#
# hpctrain job ffn-aurora for site aurora (pbs, launcher mpiexec-pals, backend xccl); written by `hpctrain render`
# FIB-25-sized FFN on 2 Aurora nodes (24 GPU Max 1550 tiles)
# no requeue: queue 'debug' of site 'aurora' takes one queued job per user, so the job cannot queue its successor (ALCF 'Running Jobs on Aurora', Queues (docs.alcf.anl.gov/aurora/running-jobs-aurora/, stored copy of late 2025, read 2026-11-28)); the job checkpoints at the walltime warning and stops there, resume it with `hpctrain resume RUN`
# PBS Pro sends no warning before the walltime: a timer in this shell raises SIGUSR2 120 s
# before it, and the launch section forwards the signal to the ranks so they checkpoint.
# ---- hpctrain: prepare the job's shell ------------------------------------------------------------------
# A warning signal may come while the environment is still being set up: remember it (it is passed to the
# ranks once they run) instead of letting it kill this shell.
hpctrain_pending_signal=
trap 'hpctrain_pending_signal=1' USR2
# No `set -u`: `module`, conda and venv activation scripts read unset variables.
set -eo pipefail
cd /RUN_DIR
echo "hpctrain: job ${PBS_JOBID:-none} starts on $(hostname) at $(date)"
# modules
module load frameworks
# collective library: oneCCL (torch's xccl back-end) (site profile aurora, from ALCF Aurora 'oneCCL' (docs.alcf.anl.gov/aurora/data-science/frameworks/oneCCL/, read 2026-11-28)); a job's env overrides any of these
export CCL_PROCESS_LAUNCHER=pmix
export CCL_ATL_TRANSPORT=mpi
export CCL_KVS_MODE=mpi
export FI_MR_CACHE_MONITOR=userfaultfd
# environment (site, then job, then hpctrain's defaults where neither set one)
export ZE_FLAT_DEVICE_HIERARCHY=FLAT
export ZE_ENABLE_PCI_ID_DEVICE_ORDER=1
export OMP_NUM_THREADS=8
export OMP_PLACES=cores
export OMP_PROC_BIND=close
export HPCTRAIN_SITE=aurora
export HPCTRAIN_COMM_BACKEND=xccl
export HPCTRAIN_STOP_SIGNAL=USR2
export HPCTRAIN_GPU_KIND=intel
# Python environment
source "$HOME"/hpctrain-venv/bin/activate
# ---- hpctrain: node check (docs/nodes.md) ----------------------------------------------------------
# Every node of the allocation (2 to train on) checks itself in one step and reports to this node;
# a bad node is left out (the launch starts on the nodes of ./training-nodes) or, with too few healthy ones, the job ends here.
"$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.node_check --run-dir /RUN_DIR --nodes 2 --timeout 120 -- \
    mpiexec -n 2 --ppn 1 --depth 1 --cpu-bind depth --env OMP_NUM_THREADS=1 "$HOME"/hpctrain-venv/bin/python -m hpctrain.nodes.check --timeout 120 --min-memory-gb 102 --local-dir /tmp:67108864 --devices 12 --device-kind intel \
    || { status=$?; printf '{"event": "exit", "job": "%s", "status": %s}\n' "${PBS_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true; exit "${status}"; }
# ---- hpctrain: staging to node-local storage (docs/scaling.md, Staging) ------------------------------
# Copied once per node before the ranks start: the container image, 1 input file.
# The ranks then read them there instead of from the shared file system.
# The node-local directory is RAM-backed: what is staged there counts against the node's memory.
export HPCTRAIN_NODE_LOCAL=/tmp/hpctrain-"${PBS_JOBID:-none}"
hpctrain_staging_start=${SECONDS}
hpctrain_staging_failed() {
    status=5
    echo "hpctrain: $1; the job ends before its ranks start" >&2
    { printf '%s\n' "$1" > .failure.txt.staging && ln .failure.txt.staging failure.txt; } 2>/dev/null || true
    rm -f .failure.txt.staging
    printf '{"event": "exit", "job": "%s", "status": %s}\n' "${PBS_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
    exit "${status}"
}
hpctrain_image=/lus/flare/projects/connectomics/ffn.sif
hpctrain_need_kb=$(du -sklL --apparent-size -- "${hpctrain_image}" /lus/flare/projects/connectomics/fib25/training.h5 \
    | awk '{kb += $1} END {print kb + 1024}') \
    || hpctrain_staging_failed "cannot read the size of a file to stage (du says which above)"
hpctrain_stage_node=$(cat <<'HPCTRAIN_STAGE_NODE'
# hpctrain-stage: run once on every node of the job by the site's launcher, before the ranks start. Its text is
# fixed (no value of the job is in it): every path comes as an argument. Steps, separated by --:
#   check DIR NEED_KB RUN_DIR   create DIR and DIR/data; fail unless DIR's file system has NEED_KB free
#   unpack DIR ARCHIVE          unpack the environment archive into DIR/env (an ARCHIVE inside DIR is removed)
#   copy SRC DEST               copy an input file or directory to DEST
# A failure prints one line naming this node, writes the run's failure note (the first node to fail wins) and
# exits 1, so the launcher ends the step and the job script stops before training.
node=$(hostname)
run_dir=
fail() {
    msg="staging failed on ${node}: $*"
    echo "hpctrain: ${msg}" >&2
    if [ -n "${run_dir}" ]; then
        tmp="${run_dir}/.failure.txt.${node}.$$"
        printf '%s\n' "${msg}" > "${tmp}" && ln "${tmp}" "${run_dir}/failure.txt" 2>/dev/null
        rm -f "${tmp}"
    fi
    exit 1
}
while [ "$#" -gt 0 ]; do
    step=$1
    shift
    case "${step}" in
    check)
        dir=$1 need_kb=$2 run_dir=$3
        shift 3
        mkdir -p -- "${dir}/data" || fail "cannot create ${dir}"
        avail_kb=$(df -Pk -- "${dir}" | awk 'NR == 2 {print $4}')
        case "${avail_kb}" in ''|*[!0-9]*) fail "cannot read the free space of ${dir}" ;; esac
        if [ "${avail_kb}" -lt "${need_kb}" ]; then
            fail "${dir} has $((avail_kb / 1024)) MB free, staging needs $((need_kb / 1024)) MB"
        fi
        ;;
    unpack)
        dir=$1 archive=$2
        shift 2
        rm -rf -- "${dir}/env.partial" && mkdir -p -- "${dir}/env.partial" || fail "cannot create ${dir}/env.partial"
        tar -xf "${archive}" -C "${dir}/env.partial" || fail "cannot unpack ${archive} into ${dir}"
        # The archive leaves pyvenv.cfg's home out: only here is it known where the interpreter now lies.
        cfg="${dir}/env.partial/venv/pyvenv.cfg"
        { printf 'home = %s\n' "${dir}/env/base/bin"; grep -v '^home *=' "${cfg}"; } > "${cfg}.new" \
            && mv -f -- "${cfg}.new" "${cfg}" || fail "cannot write ${cfg}"
        rm -rf -- "${dir}/env" && mv -- "${dir}/env.partial" "${dir}/env" \
            || fail "cannot move the environment into ${dir}/env"
        case "${archive}" in "${dir}"/*) rm -f -- "${archive}" ;; esac
        ;;
    copy)
        src=$1 dest=$2
        shift 2
        rm -rf -- "${dest}.partial"
        cp -R -- "${src}" "${dest}.partial" && rm -rf -- "${dest}" && mv -- "${dest}.partial" "${dest}" \
            || fail "cannot copy ${src} to ${dest}"
        ;;
    --) ;;
    *) fail "unknown staging step ${step}" ;;
    esac
done
HPCTRAIN_STAGE_NODE
)
echo "hpctrain: staging to ${HPCTRAIN_NODE_LOCAL} on 2 nodes"
mpiexec -n 2 --ppn 1 --depth 1 --cpu-bind depth --env OMP_NUM_THREADS=1 bash -c "${hpctrain_stage_node}" hpctrain-stage check "${HPCTRAIN_NODE_LOCAL}" "${hpctrain_need_kb}" "${PWD}" \
    || hpctrain_staging_failed "staging failed (the node's message is above)"
hpctrain_tree=()
hpctrain_copies=()
hpctrain_tree+=(-- copy "${hpctrain_image}" "${HPCTRAIN_NODE_LOCAL}"/image.sif)
if [ -f /lus/flare/projects/connectomics/fib25/training.h5 ]; then hpctrain_tree+=(-- copy /lus/flare/projects/connectomics/fib25/training.h5 "${HPCTRAIN_NODE_LOCAL}"/data/0-training.h5); else hpctrain_copies+=(-- copy /lus/flare/projects/connectomics/fib25/training.h5 "${HPCTRAIN_NODE_LOCAL}"/data/0-training.h5); fi
hpctrain_stage_tree=$(cat <<'HPCTRAIN_STAGE_TREE'
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
HPCTRAIN_STAGE_TREE
)
rm -f -- .staging-no-tree
if ! "$HOME"/hpctrain-venv/bin/python -c 'import mpi4py' 2>/dev/null; then
    echo "hpctrain: warning: the job's Python" "$HOME"/hpctrain-venv/bin/python "has no mpi4py: every node reads the shared copies itself (no broadcast)" >&2
    hpctrain_copies=("${hpctrain_tree[@]}" "${hpctrain_copies[@]}")
elif ! mpiexec -n 2 --ppn 1 --depth 1 --cpu-bind depth --env OMP_NUM_THREADS=1 "$HOME"/hpctrain-venv/bin/python -c "${hpctrain_stage_tree}" 2 "${PWD}" 64 "${hpctrain_tree[@]}"; then
    [ -f .staging-no-tree ] || hpctrain_staging_failed "staging failed (the node's message is above)"
    echo "hpctrain: warning: no broadcast ($(cat .staging-no-tree)): every node reads the shared copies itself" >&2
    hpctrain_copies=("${hpctrain_tree[@]}" "${hpctrain_copies[@]}")
fi
[ "${#hpctrain_copies[@]}" -eq 0 ] || mpiexec -n 2 --ppn 1 --depth 1 --cpu-bind depth --env OMP_NUM_THREADS=1 bash -c "${hpctrain_stage_node}" hpctrain-stage "${hpctrain_copies[@]}" \
    || hpctrain_staging_failed "staging failed (the node's message is above)"
export HPCTRAIN_STAGED_DATA='{"/lus/flare/projects/connectomics/fib25/training.h5": "data/0-training.h5"}'
echo "hpctrain: staged on every node in $((SECONDS - hpctrain_staging_start)) s"
# ---- hpctrain: launch ------------------------------------------------------------------------------------
# The launcher runs in the background so that this shell can forward SIGUSR2 to it while it waits.
launcher_pid=
forward_signal() {
    echo "hpctrain: SIGUSR2 received, forwarding it to the launcher" >&2
    if [ -n "${launcher_pid}" ]; then kill -s USR2 "${launcher_pid}" 2>/dev/null || true; fi
}
trap forward_signal USR2
rm -f -- stopped-for-requeue.json  # rank 0 writes it when every rank has stopped at a checkpoint to be requeued
( trap 'kill $! 2>/dev/null; exit 0' TERM; sleep $((3480 > SECONDS ? 3480 - SECONDS : 1)) & wait $!; kill -s USR2 $$ ) &
timer_pid=$!
mpiexec -n 24 --ppn 12 --cpu-bind list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100 --env OMP_NUM_THREADS=8 "$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.gpu_affinity --kind intel --devices 0:1:2:3:4:5:6:7:8:9:10:11 -- apptainer exec --bind "${HPCTRAIN_NODE_LOCAL}" "${HPCTRAIN_NODE_LOCAL}"/image.sif python3 -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
launcher_pid=$!
if [ -n "${hpctrain_pending_signal}" ]; then
    sleep 5  # let the ranks install their handlers (an early signal is also caught by `hpctrain run` itself)
    forward_signal
fi
status=0
while :; do
    wait "${launcher_pid}" && status=0 || status=$?
    kill -0 "${launcher_pid}" 2>/dev/null || break
done
# A launcher ends the ranks still exiting once the first leaves with 75 (srun --kill-on-bad-exit,
# hydra, aprun) and then reports their signal: the marker says the stop was a requeue all the same.
if [ "${status}" -ne 0 ] && [ "${status}" -ne 75 ] && [ -f stopped-for-requeue.json ]; then
    echo "hpctrain: the ranks stopped at a checkpoint; the launcher's status ${status} is that of ranks it ended while they exited: treated as 75" >&2
    status=75
fi
kill "${timer_pid}" 2>/dev/null || true
echo "hpctrain: launcher exited with status ${status} at $(date)"
printf '{"event": "exit", "job": "%s", "status": %s}\n' "${PBS_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
if [ "${status}" -eq 75 ]; then
    echo 'hpctrain: stopped at its checkpoint; no requeue: queue '"'"'debug'"'"' of site '"'"'aurora'"'"' takes one queued job per user, so the job cannot queue its successor (ALCF '"'"'Running Jobs on Aurora'"'"', Queues (docs.alcf.anl.gov/aurora/running-jobs-aurora/, stored copy of late 2025, read 2026-11-28)); resume with: hpctrain resume RUN' >&2
fi
exit "${status}"
