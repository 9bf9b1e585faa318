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
# ---- hpctrain: staging to node-local storage (docs/scaling.md, Staging) ------------------------------
# Copied once per node before the ranks start: the Python environment (packed by `hpctrain submit`), 1 input file.
# The ranks then read them there instead of from the shared file system.
export HPCTRAIN_NODE_LOCAL=/local/scratch/hpctrain-"${PBS_JOBID:-none}"
hpctrain_staging_start=${SECONDS}
hpctrain_staging_failed() {
    status=5
    echo "hpctrain: $1; the job ends before its ranks start" >&2
    { printf '%s\n' "$1" > .failure.txt.staging && ln .failure.txt.staging failure.txt; } 2>/dev/null || true
    rm -f .failure.txt.staging
    printf '{"event": "exit", "job": "%s", "status": %s}\n' "${PBS_JOBID:-none}" "${status}" >> job-exit.jsonl 2>/dev/null || true
    exit "${status}"
}
hpctrain_archive_link="$HOME"/.cache/hpctrain/envs/env-d9060fc4bce5.tar
hpctrain_archive=$(readlink -f -- "${hpctrain_archive_link}") && [ -f "${hpctrain_archive}" ] \
    || hpctrain_staging_failed "no packed environment at ${hpctrain_archive_link} (hpctrain submit packs it: python -m hpctrain.submission.envpack)"
hpctrain_need_kb=$(du -sklL --apparent-size -- "${hpctrain_archive}" /eagle/connectomics/fib25/training.h5 \
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
mpiexec -n 2 --ppn 1 --depth 1 --cpu-bind depth --env OMP_NUM_THREADS=1 bash -c "${hpctrain_stage_node}" hpctrain-stage check "${HPCTRAIN_NODE_LOCAL}" "${hpctrain_need_kb}" "${PWD}" -- unpack "${HPCTRAIN_NODE_LOCAL}" "${hpctrain_archive}" -- copy /eagle/connectomics/fib25/training.h5 "${HPCTRAIN_NODE_LOCAL}"/data/0-training.h5 \
    || hpctrain_staging_failed "staging failed (the node's message is above)"
export HPCTRAIN_STAGED_DATA='{"/eagle/connectomics/fib25/training.h5": "data/0-training.h5"}'
export VIRTUAL_ENV="${HPCTRAIN_NODE_LOCAL}"/env/venv
export PATH="${VIRTUAL_ENV}/bin:${PATH}"
export LD_LIBRARY_PATH="${HPCTRAIN_NODE_LOCAL}/env/libpython${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
export PYTHONNOUSERSITE=1
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
mpiexec -n 8 --ppn 4 --cpu-bind list:0-7:8-15:16-23:24-31 --env OMP_NUM_THREADS=8 "${HPCTRAIN_NODE_LOCAL}"/env/venv/bin/python -m hpctrain.submission.launchers.gpu_affinity --kind nvidia --devices 3:2:1:0 -- "${HPCTRAIN_NODE_LOCAL}"/env/venv/bin/python -m hpctrain run /RUN_DIR/job.yaml --run-dir /RUN_DIR &
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
