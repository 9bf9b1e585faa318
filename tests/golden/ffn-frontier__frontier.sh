#!/bin/bash
#SBATCH --job-name=ffn-frontier
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=7
#SBATCH --gpus-per-task=1
#SBATCH --time=02:00:00
#SBATCH --partition=batch
#SBATCH --account=CSC000
#SBATCH --output=/RUN_DIR/slurm-%j.out
#SBATCH --error=/RUN_DIR/slurm-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH -S 8
#SBATCH --network=disable_rdzv_get
#
# hpctrain job ffn-frontier for site frontier (slurm, launcher srun, backend nccl); written by `hpctrain render`
# FIB-25-sized FFN on 16 Frontier nodes (128 MI250X GCDs)
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
# modules
module load PrgEnv-gnu/8.7.0
module load cpe/26.03
module load rocm/7.1.1
module load craype-accel-amd-gfx90a
# site setup: the site admin's own shell lines, run as written
export LD_LIBRARY_PATH="${CRAY_LD_LIBRARY_PATH}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
export MIOPEN_USER_DB_PATH="/tmp/${USER}-miopen-cache-${SLURM_JOB_ID}"
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"
rm -rf -- "${MIOPEN_USER_DB_PATH}" && mkdir -p -- "${MIOPEN_USER_DB_PATH}"
# collective library: RCCL + libfabric network plug-in (rccl-net-plugin) (site profile frontier, from OLCF 'PyTorch on Frontier', RCCL Network Plugin (docs.olcf.ornl.gov/software/analytics/pytorch_frontier.html, read 2026-11-28)); a job's env overrides any of these
module load rccl-net-plugin
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
export NCCL_CROSS_NIC=1
export NCCL_NET_GDR_LEVEL=PHB
export HSA_FORCE_FINE_GRAIN_PCIE=1
export FI_MR_CACHE_MONITOR=kdreg2
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_RDZV_PROTO=alt_read
export FI_CXI_RDZV_EAGER_SIZE=0
export FI_CXI_RDZV_THRESHOLD=0
export FI_CXI_RDZV_GET_MIN=0
export FI_CXI_DEFAULT_TX_SIZE=2048
export FI_CXI_RX_MATCH_MODE=hybrid
# environment (site, then job, then hpctrain's defaults where neither set one)
export OMP_NUM_THREADS=7
export OMP_PLACES=cores
export OMP_PROC_BIND=close
export HPCTRAIN_SITE=frontier
export HPCTRAIN_COMM_BACKEND=nccl
export HPCTRAIN_STOP_SIGNAL=USR2
export HPCTRAIN_GPU_KIND=amd
# Python environment
source "$HOME"/hpctrain-venv/bin/activate
# ---- hpctrain: node check (docs/nodes.md) ----------------------------------------------------------
# Every node of the allocation (16 to train on) checks itself in one step and reports to this node;
# a bad node is left out (the launch starts on the nodes of ./training-nodes) or, with too few healthy ones, the job ends here.
"$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.node_check --run-dir /RUN_DIR --nodes 16 --timeout 120 --lost-nodes-log slurm-"${SLURM_JOB_ID}".out --lost-nodes-pattern 'Node failure on (\S+)' -- \
    srun --nodes=16 --ntasks=16 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 "$HOME"/hpctrain-venv/bin/python -m hpctrain.nodes.check --timeout 120 --min-memory-gb 51.2 --local-dir /tmp:67108864 --devices 8 --device-kind amd \
    || { status=$?; printf '{"event": "exit", "job": "%s", "status": %s}\n' "${SLURM_JOB_ID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true; exit "${status}"; }
# ---- hpctrain: launch ------------------------------------------------------------------------------------
# The launcher runs in the background so that this shell can forward SIGUSR2 to it while it waits.
launcher_pid=
forward_signal() {
    echo "hpctrain: SIGUSR2 received, forwarding it to the launcher" >&2
    if [ -n "${launcher_pid}" ]; then kill -s USR2 "${launcher_pid}" 2>/dev/null || true; fi
}
trap forward_signal USR2
rm -f -- stopped-for-requeue.json  # rank 0 writes it when every rank has stopped at a checkpoint to be requeued
srun --nodes=16 --ntasks=128 --ntasks-per-node=8 --cpus-per-task=7 --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=closest --cpu-bind=threads "$HOME"/hpctrain-venv/bin/python -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
if [ "${status}" -ne 0 ] && [ "${status}" -ne 75 ]; then "$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.exit_note --run-dir /RUN_DIR --slurm-job "${SLURM_JOB_ID}" || true; fi
echo "hpctrain: launcher exited with status ${status} at $(date)"
printf '{"event": "exit", "job": "%s", "status": %s}\n' "${SLURM_JOB_ID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
hpctrain_excluded_nodes=$("$HOME"/hpctrain-venv/bin/python -m hpctrain.nodes.blame --run-dir . 2>/dev/null) || hpctrain_excluded_nodes=
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
