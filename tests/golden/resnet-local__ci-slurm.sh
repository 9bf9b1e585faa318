#!/bin/bash
#SBATCH --job-name=resnet-local
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --output=/RUN_DIR/slurm-%j.out
#SBATCH --error=/RUN_DIR/slurm-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --open-mode=append
#
# hpctrain job resnet-local for site ci-slurm (slurm, launcher srun, backend mpi); written by `hpctrain render`
# Digits CNN, 2 ranks on the local machine (learns in seconds)
# Slurm sends SIGUSR2 to this batch shell 120 s before the walltime (--signal=B:...); the
# launch section below forwards it to the ranks so they checkpoint; the script's end requeues the job
# (--requeue) where the queue allows it.
# ---- hpctrain: prepare the job's shell ------------------------------------------------------------------
# A warning signal may come while the environment is still being set up: remember it (it is passed to the
# ranks once they run) instead of letting it kill this shell.
hpctrain_pending_signal=
trap 'hpctrain_pending_signal=1' USR2
# No `set -u`: `module`, conda and venv activation scripts read unset variables.
set -eo pipefail
cd /RUN_DIR
echo "hpctrain: job ${SLURM_JOB_ID:-none} starts on $(hostname) at $(date)"
# environment (site, then job, then hpctrain's defaults where neither set one)
export OMP_NUM_THREADS=1
export HPCTRAIN_SITE=ci-slurm
export HPCTRAIN_COMM_BACKEND=mpi
export HPCTRAIN_STOP_SIGNAL=USR2
# which MPI library mpi4py uses (MPI is not initialised here)
mpi_library=$(python3 -c 'import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())' 2>&1) || mpi_library="mpi4py failed: ${mpi_library}"
echo "hpctrain: MPI library: ${mpi_library}"
# ---- hpctrain: launch ------------------------------------------------------------------------------------
# The launcher runs in the background so that this shell can forward SIGUSR2 to it while it waits.
launcher_pid=
forward_signal() {
    echo "hpctrain: SIGUSR2 received, forwarding it to the launcher" >&2
    if [ -n "${launcher_pid}" ]; then kill -s USR2 "${launcher_pid}" 2>/dev/null || true; fi
}
trap forward_signal USR2
rm -f -- stopped-for-requeue.json  # rank 0 writes it when every rank has stopped at a checkpoint to be requeued
srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1 --mpi=pmi2 python3 -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
if [ "${status}" -ne 0 ] && [ "${status}" -ne 75 ]; then python3 -m hpctrain.submission.launchers.exit_note --run-dir /RUN_DIR --slurm-job "${SLURM_JOB_ID}" || true; fi
echo "hpctrain: launcher exited with status ${status} at $(date)"
printf '{"event": "exit", "job": "%s", "status": %s}\n' "${SLURM_JOB_ID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
restarts="${SLURM_RESTART_COUNT:-0}"
if [ "${status}" -eq 75 ] && [ "${restarts}" -lt 3 ]; then
    echo "hpctrain: stopped at a checkpoint; putting the job back in the queue (restart $((restarts + 1)) of 3)"
    if [ -n "${hpctrain_excluded_nodes:-}" ]; then
        printf 'requeue %s\nupdate JobId=%s ExcNodeList=%s\n' "${SLURM_JOB_ID}" "${SLURM_JOB_ID}" "${hpctrain_excluded_nodes}" | scontrol && exit 0
    else
        scontrol requeue "${SLURM_JOB_ID}" && exit 0
    fi
    echo "hpctrain: could not requeue; continue with: hpctrain resume RUN" >&2
elif [ "${status}" -eq 75 ]; then
    echo "hpctrain: stopped at a checkpoint and max_requeues (3) is reached; continue with: hpctrain resume RUN" >&2
fi
exit "${status}"
