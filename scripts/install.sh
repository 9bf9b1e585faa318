#!/usr/bin/env bash
# Install everything the test suite needs on a Debian bookworm machine: the Slurm/munge/sshd packages
# (apt, skipped when already present) and the project venv at .venv (pip, skipped when up to date).
# Idempotent; run as root. Daemons are NOT started here: see scripts/ci/slurm.sh and scripts/ci/sshd.sh.
# --venv-only: the venv alone, no apt and no root (what `scripts/test.sh --fast` needs).
set -euo pipefail

venv_only=0
if [[ ${1:-} == --venv-only ]]; then
    venv_only=1
elif [[ $# -gt 0 ]]; then
    echo "[install] error: unknown argument '$1' (the only one is --venv-only)" >&2
    exit 2
fi

cd "$(dirname "$0")/.."
REPO_ROOT=$(pwd)

# strace: tests count the ranks' system calls (mkdir/fsync per checkpoint) where they happen;
# slurmdbd + mariadb-server: Slurm accounting, so that tests can create a QOS (scripts/ci/slurm.sh);
# gcc + libc6-dev: the mpich wheel's mpicc builds the MPI message-counting library (runtime/wire) with them;
# chromium + fonts-dejavu-core: the report tests open `hpctrain report`'s page in a real headless browser;
# iproute2 (ip, tc) + util-linux (nsenter, unshare): the cluster of namespace nodes (scripts/ci/cluster.sh)
APT_PACKAGES=(slurmctld slurmd slurm-client munge slurm-wlm-torque slurmdbd mariadb-server openssh-server
              openssh-client strace gcc libc6-dev chromium fonts-dejavu-core iproute2 util-linux)
PIP_EXTRAS="train,local,test,zarr,submitit,mlflow"
TORCH_PIN="torch==2.13.0"

t_all=$(date +%s)
phase() {  # phase NAME START_EPOCH
    echo "[install] $1: $(( $(date +%s) - $2 )) s"
}

# ---- apt --------------------------------------------------------------------------------------------
install_system() {  # the apt packages and a check that the Slurm commands are slurm-client's
    t=$(date +%s)
    missing=()
    for p in "${APT_PACKAGES[@]}"; do
        if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
            missing+=("$p")
        fi
    done
    if (( ${#missing[@]} == 0 )); then
        phase "apt (all ${#APT_PACKAGES[@]} packages already installed)" "$t"
    else
        if [[ $(id -u) -ne 0 ]]; then
            echo "[install] error: apt packages missing (${missing[*]}) and not running as root" >&2
            exit 1
        fi
        # Postinst scripts try to start the services. There is no systemd here, so forbid it outright with a
        # temporary policy-rc.d (exit 101 = "action forbidden"); our scripts start the daemons themselves.
        policy=/usr/sbin/policy-rc.d
        own_policy=0
        if [[ ! -e $policy ]]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy"
            chmod 0755 "$policy"
            own_policy=1
            trap 'if [[ $own_policy == 1 ]]; then rm -f "$policy"; fi' EXIT
        fi
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
        if (( own_policy )); then
            rm -f "$policy"
            own_policy=0
        fi
        phase "apt (installed: ${missing[*]})" "$t"
    fi

    # slurm-wlm-torque must only add the PBS wrappers, never shadow the Slurm commands.
    for cmd in sbatch squeue scontrol sinfo sacct srun sbcast qsub qstat qdel chromium ip tc nsenter unshare; do
        if ! command -v "$cmd" >/dev/null; then
            echo "[install] error: '$cmd' not on PATH after the apt phase" >&2
            exit 1
        fi
    done
    for cmd in sbatch squeue scontrol srun; do
        owner=$(dpkg -S "$(readlink -f "$(command -v "$cmd")")" 2>/dev/null | cut -d: -f1)
        if [[ $owner != slurm-client ]]; then
            echo "[install] error: '$cmd' resolves to $(command -v "$cmd") (package '${owner:-none}'), not slurm-client" >&2
            exit 1
        fi
    done
}
if (( venv_only )); then
    echo "[install] apt: skipped (--venv-only)"
else
    install_system
fi

# ---- venv -------------------------------------------------------------------------------------------
t=$(date +%s)
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
    phase "venv created ($(.venv/bin/python --version))" "$t"
else
    phase "venv present ($(.venv/bin/python --version))" "$t"
fi

# ---- pip --------------------------------------------------------------------------------------------
# Skip pip when the dependency declarations are unchanged since the last successful install and the
# editable install is still in place: a no-op pip run still costs ~10 s of index look-ups.
t=$(date +%s)
stamp=.venv/.hpctrain-install-stamp
want=$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]] && .venv/bin/python -c 'import hpctrain' 2>/dev/null \
        && .venv/bin/pip show hpctrain >/dev/null 2>&1; then
    phase "pip (up to date, stamp $stamp)" "$t"
else
    # torch is pinned (setup.cfg and here) to the CPU wheel on disk: 2.13.0+cpu sorts above PyPI's plain
    # 2.13.0 (a multi-GB CUDA build), and the check below refuses a CUDA build if one ever slips in.
    # (The grep drops pip's one-line-per-package noise about this machine's partial local index.)
    .venv/bin/pip install -q -e ".[$PIP_EXTRAS]" "$TORCH_PIN" 2>&1 \
        | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
    echo "$want" >"$stamp"
    phase "pip (installed -e .[$PIP_EXTRAS])" "$t"
fi
# One interpreter start (importing torch costs seconds): prints the version, fails on a CUDA build.
torch_check='import sys, torch; print(torch.__version__); sys.exit(torch.version.cuda is not None)'
if ! torch_version=$(.venv/bin/python -c "$torch_check") || [[ $torch_version != 2.13.0* ]]; then
    echo "[install] error: expected the CPU build of torch 2.13.0, got '$torch_version'" >&2
    exit 1
fi

echo "[install] done in $(( $(date +%s) - t_all )) s (repo $REPO_ROOT, torch $torch_version)"
