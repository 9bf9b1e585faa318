#!/usr/bin/env bash
# The one test command (CI runs it through .ci/run): install, start the real Slurm with its cluster of namespace
# nodes (scripts/ci/cluster.sh) and the loopback sshd, run pytest over tests/ (extra arguments are passed to
# pytest), then ruff.  Exit status is non-zero when
# pytest or ruff fails.  Daemons this script started are stopped on exit; ones already running are left
# alone (other work on a dev machine uses them) unless HPCTRAIN_STOP_DAEMONS=1.
# --fast (anywhere among the arguments) is the lane for editing: only the venv is installed (no apt, no root), no
# daemon is started or stopped, and `pytest --fast` leaves out every test that needs Slurm, sshd, the cluster or
# mpiexec, and the slow ones (tests/conftest.py, docs/testing.md); ruff runs as always.
set -uo pipefail

cd "$(dirname "$0")/.."
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

fast=0
passed_on=()
for a in "$@"; do
    if [[ $a == --fast ]]; then fast=1; else passed_on+=("$a"); fi
done
set -- ${passed_on[@]+"${passed_on[@]}"}

run_pytest() {  # run_pytest [PYTEST ARGS...]: sets pytest_rc
    local t_py
    t_py=$(date +%s)
    # Two workers: tests of one module stay on one worker, and every module that uses the real Slurm shares one
    # worker (tests/conftest.py, pytest_collection_modifyitems). HPCTRAIN_TEST_WORKERS=0 runs in one process.
    .venv/bin/python -m pytest -q -ra --durations=30 -n "${HPCTRAIN_TEST_WORKERS:-2}" --dist loadgroup "$@"
    pytest_rc=$?
    echo "[test] pytest exit $pytest_rc in $(( $(date +%s) - t_py )) s"
}

run_ruff() {  # sets ruff_rc
    local lint_paths=() p
    for p in hpctrain hpctrain_bench tests benchmarks; do
        [[ -e $p ]] && lint_paths+=("$p")
    done
    .venv/bin/ruff check "${lint_paths[@]}"
    ruff_rc=$?
    echo "[test] ruff exit $ruff_rc"
}

if [[ $# -eq 0 ]]; then
    set -- tests
fi

if (( fast )); then
    bash scripts/install.sh --venv-only || { echo "[test] install failed after $(elapsed)" >&2; exit 1; }
    run_pytest --fast "$@"
    run_ruff
    echo "[test] fast lane: total $(elapsed) (pytest $pytest_rc, ruff $ruff_rc)"
    (( pytest_rc == 0 && ruff_rc == 0 ))
    exit
fi

bash scripts/install.sh || { echo "[test] install failed after $(elapsed)" >&2; exit 1; }

started=()
for d in cluster slurm sshd; do
    if [[ ${HPCTRAIN_STOP_DAEMONS:-0} == 1 ]] || ! bash "scripts/ci/$d.sh" status >/dev/null 2>&1; then
        started+=("$d")
    fi
done
cleanup() {
    local d
    for d in "${started[@]}"; do
        bash "scripts/ci/$d.sh" stop || true
    done
}
trap cleanup EXIT

# The cluster's start starts the head's Slurm too; HPCTRAIN_CLUSTER_NODES sets its size (tests/cluster_support.py).
bash scripts/ci/cluster.sh start --nodes "${HPCTRAIN_CLUSTER_NODES:-5}" \
    || { echo "[test] the cluster did not start after $(elapsed)" >&2; exit 1; }
bash scripts/ci/sshd.sh start || { echo "[test] sshd did not start after $(elapsed)" >&2; exit 1; }
eval "$(bash scripts/ci/slurm.sh env)"
eval "$(bash scripts/ci/cluster.sh env)"
eval "$(bash scripts/ci/sshd.sh env)"
echo "[test] daemons up after $(elapsed)"

run_pytest "$@"
run_ruff

echo "[test] total $(elapsed) (pytest $pytest_rc, ruff $ruff_rc)"
(( pytest_rc == 0 && ruff_rc == 0 ))
