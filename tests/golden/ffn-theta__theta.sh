#!/bin/bash
#COBALT -n 128
#COBALT -t 180
#COBALT -q default
#COBALT -A connectomics
#COBALT -O /RUN_DIR/cobalt
#COBALT --jobname ffn-theta
#COBALT --attrs mcdram=cache:numa=quad:filesystems=home,theta-fs0
#
# hpctrain job ffn-theta for site theta (cobalt, launcher aprun, backend mpi); written by `hpctrain render`
# FIB-25-sized FFN (depth 12, FOV 33^3, deltas 8^3) on 128 Theta nodes
# Cobalt sends no warning before the walltime: a timer in this shell raises SIGUSR2 300 s
# before it, and the launch section forwards the signal to the ranks so they checkpoint.
# ---- hpctrain: prepare the job's shell ------------------------------------------------------------------
# A warning signal may come while the environment is still being set up: remember it (it is passed to the
# ranks once they run) instead of letting it kill this shell.
hpctrain_pending_signal=
trap 'hpctrain_pending_signal=1' USR2
# No `set -u`: `module`, conda and venv activation scripts read unset variables.
set -eo pipefail
cd /RUN_DIR
echo "hpctrain: job ${COBALT_JOBID:-none} starts on $(hostname) at $(date)"
# modules
module load datascience/pytorch-1.7
module load cray-mpich
# site setup: the site admin's own shell lines, run as written
module swap PrgEnv-intel PrgEnv-gnu
# environment (site, then job, then hpctrain's defaults where neither set one)
export KMP_BLOCKTIME=0
export KMP_AFFINITY=granularity=fine,compact,1,0
export OMP_PROC_BIND=spread
export OMP_NUM_THREADS=128
export OMP_PLACES=threads
export HPCTRAIN_SITE=theta
export HPCTRAIN_COMM_BACKEND=mpi
export HPCTRAIN_STOP_SIGNAL=USR2
# Python environment
source "$HOME"/hpctrain-venv/bin/activate
# which MPI library mpi4py uses (MPI is not initialised here)
mpi_library=$("$HOME"/hpctrain-venv/bin/python -c 'import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())' 2>&1) || mpi_library="mpi4py failed: ${mpi_library}"
echo "hpctrain: MPI library: ${mpi_library}"
expected_mpi='CRAY MPICH'
case "${mpi_library}" in *"${expected_mpi}"*) ;; *)
    echo "hpctrain: WARNING: expected the site's MPI (${expected_mpi}) but mpi4py uses ${mpi_library}; rebuild mpi4py against it (see docs)" >&2 ;;
esac
# ---- hpctrain: node check (docs/nodes.md) ----------------------------------------------------------
# Every node of the allocation (128 to train on) checks itself in one step and reports to this node;
# a bad node is left out (the launch starts on the nodes of ./training-nodes) or, with too few healthy ones, the job ends here.
"$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.node_check --run-dir /RUN_DIR --nodes 128 --timeout 120 -- \
    aprun -n 128 -N 1 -d 1 -j 1 -cc depth -e OMP_NUM_THREADS=1 "$HOME"/hpctrain-venv/bin/python -m hpctrain.nodes.check --timeout 120 --min-memory-gb 19.2 --local-dir /tmp:67108864 --local-dir /local/scratch:67108864 \
    || { status=$?; printf '{"event": "exit", "job": "%s", "status": %s}\n' "${COBALT_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true; exit "${status}"; }
# ---- hpctrain: launch ------------------------------------------------------------------------------------
# The launcher runs in the background so that this shell can forward SIGUSR2 to it while it waits.
launcher_pid=
forward_signal() {
    echo "hpctrain: SIGUSR2 received, forwarding it to the launcher" >&2
    if [ -n "${launcher_pid}" ]; then kill -s USR2 "${launcher_pid}" 2>/dev/null || true; fi
}
trap forward_signal USR2
rm -f -- stopped-for-requeue.json  # rank 0 writes it when every rank has stopped at a checkpoint to be requeued
( trap 'kill $! 2>/dev/null; exit 0' TERM; sleep $((10500 > SECONDS ? 10500 - SECONDS : 1)) & wait $!; kill -s USR2 $$ ) &
timer_pid=$!
aprun -n 128 -N 1 -d 128 -j 2 -cc depth -e OMP_NUM_THREADS=128 "$HOME"/hpctrain-venv/bin/python -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
printf '{"event": "exit", "job": "%s", "status": %s}\n' "${COBALT_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
restarts="${HPCTRAIN_RESTART_COUNT:-0}"
if [ "${status}" -eq 75 ] && [ "${restarts}" -lt 3 ]; then
    echo "hpctrain: stopped at a checkpoint; putting the job back in the queue (restart $((restarts + 1)) of 3)"
    if new_job=$(qsub --dependencies "${COBALT_JOBID}" --env HPCTRAIN_RESTART_COUNT="$((restarts + 1))" /RUN_DIR/job.sh); then
        new_job=$(printf '%s\n' "${new_job}" | tail -n 1)
        printf '{"event": "resubmit", "job": "%s", "new_job": "%s"}\n' "${COBALT_JOBID:-none}" "${new_job}" >> job-exit.jsonl 2>/dev/null || true
        echo "hpctrain: resubmitted as job ${new_job}"
        exit 0
    fi
    echo "hpctrain: could not requeue; continue with: hpctrain resume RUN" >&2
elif [ "${status}" -eq 75 ]; then
    echo "hpctrain: stopped at a checkpoint and max_requeues (3) is reached; continue with: hpctrain resume RUN" >&2
fi
exit "${status}"
