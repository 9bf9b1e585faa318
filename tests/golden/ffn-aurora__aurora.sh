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
mpiexec -n 24 --ppn 12 --cpu-bind list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100 --env OMP_NUM_THREADS=8 "$HOME"/hpctrain-venv/bin/python -m hpctrain.submission.launchers.gpu_affinity --kind intel --devices 0:1:2:3:4:5:6:7:8:9:10:11 -- "$HOME"/hpctrain-venv/bin/python -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
