#!/bin/bash
#PBS -N ffn-polaris
#PBS -l select=2:ncpus=64:ngpus=4:mpiprocs=4:ompthreads=8
#PBS -l walltime=01:00:00
#PBS -l place=scatter
#PBS -q debug
#PBS -A connectomics
#PBS -l filesystems=home:eagle
#PBS -o /RUN_DIR/pbs.out
#PBS -j oe
#PBS -k doe
#
# hpctrain job ffn-polaris for site polaris (pbs, launcher mpiexec-pals, backend nccl); written by `hpctrain render`
# FIB-25-sized FFN on 2 Polaris nodes (8 A100)
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
module load conda
# site setup: the site admin's own shell lines, run as written
conda activate base
# collective library: NCCL + AWS OFI NCCL plug-in (libfabric) (site profile polaris, from ALCF Polaris 'NCCL' (docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/, read 2026-11-28)); a job's env overrides any of these
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_CROSS_NIC=1
export NCCL_COLLNET_ENABLE=1
export NCCL_NET='AWS Libfabric'
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_MR_CACHE_MONITOR=userfaultfd
export FI_CXI_DEFAULT_CQ_SIZE=131072
export LD_LIBRARY_PATH="/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
# environment (site, then job, then hpctrain's defaults where neither set one)
export OMP_NUM_THREADS=8
export OMP_PLACES=cores
export OMP_PROC_BIND=close
export HPCTRAIN_SITE=polaris
export HPCTRAIN_COMM_BACKEND=nccl
export HPCTRAIN_STOP_SIGNAL=USR2
export HPCTRAIN_GPU_KIND=nvidia
# Python environment
source "$HOME"/hpctrain-venv/bin/activate
# ---- hpctrain: node check (docs/nodes.md) ----------------------------------------------------------
# Every node of the allocation (2 to train on) checks itself in one step and reports to this node;
# a bad node is left out (the launch starts on the nodes of ./training-nodes) or, with too few healthy ones, the job ends here.
"$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.node_check --run-dir /RUN_DIR --nodes 2 --timeout 120 -- \
    mpiexec -n 2 --ppn 1 --depth 1 --cpu-bind depth --env OMP_NUM_THREADS=1 "$HOME"/hpctrain-venv/bin/python -m hpctrain.nodes.check --timeout 120 --min-memory-gb 51.2 --local-dir /tmp:67108864 --local-dir /local/scratch:67108864 --devices 4 --device-kind nvidia \
    || { status=$?; printf '{"event": "exit", "job": "%s", "status": %s}\n' "${PBS_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true; exit "${status}"; }
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
mpiexec -n 8 --ppn 4 --cpu-bind list:0-7:8-15:16-23:24-31 --env OMP_NUM_THREADS=8 "$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.gpu_affinity --kind nvidia --devices 3:2:1:0 -- "$HOME"/hpctrain-venv/bin/python -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
restarts="${HPCTRAIN_RESTART_COUNT:-0}"
if [ "${status}" -eq 75 ] && [ "${restarts}" -lt 3 ]; then
    echo "hpctrain: stopped at a checkpoint; putting the job back in the queue (restart $((restarts + 1)) of 3)"
    if new_job=$(qsub -W depend=afterany:"${PBS_JOBID}" -v HPCTRAIN_RESTART_COUNT="$((restarts + 1))" /RUN_DIR/job.sh); then
        new_job=$(printf '%s\n' "${new_job}" | tail -n 1)
        printf '{"event": "resubmit", "job": "%s", "new_job": "%s"}\n' "${PBS_JOBID:-none}" "${new_job}" >> job-exit.jsonl 2>/dev/null || true
        echo "hpctrain: resubmitted as job ${new_job}"
        exit 0
    fi
    echo "hpctrain: could not requeue; continue with: hpctrain resume RUN" >&2
elif [ "${status}" -eq 75 ]; then
    echo "hpctrain: stopped at a checkpoint and max_requeues (3) is reached; continue with: hpctrain resume RUN" >&2
fi
exit "${status}"
