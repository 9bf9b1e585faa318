#!/bin/bash
#SBATCH --job-name=ffn-perlmutter
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --gpus-per-task=1
#SBATCH --time=04:00:00
#SBATCH --qos=regular
#SBATCH --account=m0000_g
#SBATCH --output=/RUN_DIR/slurm-%j.out
#SBATCH --error=/RUN_DIR/slurm-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --constraint=gpu
#
# hpctrain job ffn-perlmutter for site perlmutter (slurm, launcher srun, backend nccl); written by `hpctrain render`
# FIB-25-sized FFN on 4 Perlmutter GPU nodes (16 A100) with Adasum
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
module load pytorch/2.3.1
# collective library: NCCL (site profile perlmutter); a job's env overrides any of these
export NCCL_NET_GDR_LEVEL=PHB
# environment (site, then job, then hpctrain's defaults where neither set one)
export OMP_NUM_THREADS=16
export OMP_PLACES=cores
export OMP_PROC_BIND=close
export HPCTRAIN_SITE=perlmutter
export HPCTRAIN_COMM_BACKEND=nccl
export HPCTRAIN_STOP_SIGNAL=USR2
export HPCTRAIN_GPU_KIND=nvidia
# Python environment
source "$HOME"/hpctrain-venv/bin/activate
# ---- hpctrain: node check (docs/nodes.md) ----------------------------------------------------------
# Every node of the allocation (4 to train on) checks itself in one step and reports to this node;
# a bad node is left out (the launch starts on the nodes of ./training-nodes) or, with too few healthy ones, the job ends here.
"$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.node_check --run-dir /RUN_DIR --nodes 4 --timeout 120 --lost-nodes-log slurm-"${SLURM_JOB_ID}".out --lost-nodes-pattern 'Node failure on (\S+)' -- \
    srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 "$HOME"/hpctrain-venv/bin/python -m hpctrain.nodes.check --timeout 120 --min-memory-gb 25.6 --local-dir /tmp:67108864 --devices 4 --device-kind nvidia \
    || { status=$?; printf '{"event": "exit", "job": "%s", "status": %s}\n' "${SLURM_JOB_ID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true; exit "${status}"; }
# ---- hpctrain: staging to node-local storage (docs/scaling.md, Staging) ------------------------------
# The ranks run in shifter's image docker:nersc/ffn:1.0, which the site's image
# gateway serves to the nodes: nothing is copied.
# ---- hpctrain: launch ------------------------------------------------------------------------------------
# The launcher runs in the background so that this shell can forward SIGUSR2 to it while it waits.
launcher_pid=
forward_signal() {
    echo "hpctrain: SIGUSR2 received, forwarding it to the launcher" >&2
    if [ -n "${launcher_pid}" ]; then kill -s USR2 "${launcher_pid}" 2>/dev/null || true; fi
}
trap forward_signal USR2
rm -f -- stopped-for-requeue.json  # rank 0 writes it when every rank has stopped at a checkpoint to be requeued
srun --nodes=4 --ntasks=16 --ntasks-per-node=4 --cpus-per-task=32 --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=closest --cpu-bind=cores shifter --image=docker:nersc/ffn:1.0 --module=gpu python3 -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
