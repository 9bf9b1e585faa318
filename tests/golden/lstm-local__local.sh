#!/bin/bash
#LOCAL --walltime-s=600
#LOCAL --signal=USR2@120
#LOCAL --max-requeues=3
#
# hpctrain job lstm-local for site local (local, launcher local, backend gloo); written by `hpctrain render`
# Char LSTM with LEGW warm-up, 2 ranks on the local machine
# No scheduler: hpctrain's local controller runs this script on this machine (`hpctrain submit --site local`,
# or by hand: python -m hpctrain.submission.schedulers.local_controller submit job.sh, in the run directory),
# reading the #LOCAL lines above. It sends SIGUSR2 before the walltime; the launch section forwards it
# to the ranks so they checkpoint, and the controller runs the script again when they stopped for it.
# ---- hpctrain: prepare the job's shell ------------------------------------------------------------------
# A warning signal may come while the environment is still being set up: remember it (it is passed to the
# ranks once they run) instead of letting it kill this shell.
hpctrain_pending_signal=
trap 'hpctrain_pending_signal=1' USR2
# No `set -u`: `module`, conda and venv activation scripts read unset variables.
set -eo pipefail
cd /RUN_DIR
echo "hpctrain: job ${HPCTRAIN_LOCAL_JOB_ID:-none} starts on $(hostname) at $(date)"
# environment (site, then job, then hpctrain's defaults where neither set one)
export OMP_NUM_THREADS=1
export HPCTRAIN_SITE=local
export HPCTRAIN_COMM_BACKEND=gloo
export HPCTRAIN_STOP_SIGNAL=USR2
# ---- hpctrain: launch ------------------------------------------------------------------------------------
# The launcher runs in the background so that this shell can forward SIGUSR2 to it while it waits.
launcher_pid=
forward_signal() {
    echo "hpctrain: SIGUSR2 received, forwarding it to the launcher" >&2
    if [ -n "${launcher_pid}" ]; then kill -s USR2 "${launcher_pid}" 2>/dev/null || true; fi
}
trap forward_signal USR2
rm -f -- stopped-for-requeue.json  # rank 0 writes it when every rank has stopped at a checkpoint to be requeued
python3 -m hpctrain.submission.launchers.local_launch --nprocs 2 -- python3 -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
echo "hpctrain: launcher exited with status ${status} at $(date)"
printf '{"event": "exit", "job": "%s", "status": %s}\n' "${HPCTRAIN_LOCAL_JOB_ID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
exit "${status}"
