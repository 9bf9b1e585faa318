"""Flux and LSF back-ends shipped outside hpctrain (examples/backends/): each package is pip-installed into a
directory the test puts on PYTHONPATH, as a site would install it, and then renders its centre's script
(``#FLUX:`` + ``flux run``, ``#BSUB`` + ``jsrun``), submits it to a stand-in ``flux``/``bsub`` on PATH that answers
as the documented command does, and runs a job of 2 ranks: the stand-in ``flux run``/``jsrun`` starts 2 processes
with the variables the launcher documents, and each rank reads where it sits from the plug-in's job environment,
which its script names (HPCTRAIN_JOB_ENVIRONMENT) and which it imports without pydantic.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TinyJob

from hpctrain.config.site import load_site_file
from hpctrain.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "backends"
PACKAGES = ("hpctrain_flux", "hpctrain_lsf")

# flux-batch(1): "its jobid is printed on standard output"; F58 ids start with U+0192 (flux-docs FAQ).
FLUX = r'''#!/bin/bash
# Stand-in for flux: batch prints the job id and returns; run starts the tasks with flux-environment(7)'s variables.
case "$1" in
    batch) shift; printf '%s\n' "$*" >> "$STANDIN_RECORD"; echo "ƒM7Zq9AKHno" ;;
    run) shift; n=1; nodes=1
        while [ $# -gt 0 ]; do
            case "$1" in --ntasks=*) n=${1#*=} ;; --nodes=*) nodes=${1#*=} ;; -o) shift ;; --*) ;; *) break ;; esac
            shift
        done
        pids=()
        for ((r = 0; r < n; r++)); do
            FLUX_TASK_RANK=$r FLUX_TASK_LOCAL_ID=$((r % (n / nodes))) FLUX_JOB_SIZE=$n FLUX_JOB_NNODES=$nodes \
                FLUX_JOB_ID=fStep1 "$@" & pids+=($!)
        done
        rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc ;;
    *) echo "flux stand-in: $1 is not stood in for" >&2; exit 2 ;;
esac
'''
# OLCF Summit guide: bsub prints "Job <779469> is submitted to default queue <batch>."
BSUB = r'''#!/bin/bash
printf '%s\n' "$*" >> "$STANDIN_RECORD"
echo "Job <779469> is submitted to default queue <batch>."
'''
# jsrun -n RESOURCE_SETS -r PER_HOST ...: one task per resource set (-a1), JSM_NAMESPACE_* in each.
JSRUN = r'''#!/bin/bash
n=1; per=1
while [ $# -gt 0 ]; do
    case "$1" in -n*) n=${1#-n} ;; -r*) per=${1#-r} ;; -*) ;; *) break ;; esac
    shift
done
pids=()
for ((r = 0; r < n; r++)); do
    JSM_NAMESPACE_RANK=$r JSM_NAMESPACE_SIZE=$n JSM_NAMESPACE_LOCAL_RANK=$((r % per)) "$@" & pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
'''
# Each rank: where it sits, from the plug-in's job environment, and whether anything heavy came with it.
RANK = ("import json, os, sys; from hpctrain.launch_env import detect_launch_env, scheduler_job_id, scheduler_nodes; "
        "e = detect_launch_env(os.environ); "
        "heavy = [m for m in ('pydantic', 'hpctrain.config', 'importlib.metadata') if m in sys.modules]; "
        "open(f'rank-{e.rank}.json', 'w').write(json.dumps({'rank': e.rank, 'size': e.size, 'local_rank': "
        "e.local_rank, 'local_size': e.local_size, 'node': e.node_rank, 'nodes': e.nodes, 'launcher': e.launcher, "
        "'job': scheduler_job_id(os.environ), 'hosts': scheduler_nodes(os.environ), 'heavy': heavy}))")
# Renders the script of SPEC on SITE with RANK as the rank command, in a process that sees the installed packages.
RENDER = ("import sys; from hpctrain.config.job import load_job; from hpctrain.config.site import load_site; "
          "from hpctrain.submission.render import render_script; "
          "job, site, run_dir, rank = load_job(sys.argv[1]), load_site(sys.argv[2]), sys.argv[3], sys.argv[4]; "
          "print(render_script(job, site, run_dir=run_dir, spec_path=sys.argv[1], python=sys.executable, "
          "command=[sys.executable, '-c', rank]).text, end='')")


@pytest.fixture(scope="module")
def site_packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both example packages installed by pip (offline, no build isolation: the venv's setuptools builds them)
    from copies, so the build leaves nothing in the checkout."""
    root = tmp_path_factory.mktemp("backends")
    copies = [shutil.copytree(EXAMPLES / name, root / "src" / name) for name in PACKAGES]
    target = root / "site-packages"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), *map(str, copies)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _stand_ins(bin_dir: Path) -> Path:
    bin_dir.mkdir()
    for name, text in (("flux", FLUX), ("bsub", BSUB), ("jsrun", JSRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _env(tmp_path: Path, site_packages: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "COBALT_", "HPCTRAIN_"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), *([str(site_packages)] if site_packages else [])]),
               HPCTRAIN_HOME=str(home), HPCTRAIN_RUNS=str(tmp_path / "runs"), STANDIN_RECORD=str(tmp_path / "record"),
               PATH=os.pathsep.join([str(tmp_path / "bin"), env["PATH"]]))
    return env


def _run(env: dict[str, str], *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=240, env=env,
                          cwd=cwd or env["HPCTRAIN_HOME"])


def _site(tmp_path: Path, scheduler: str, launcher: str) -> Path:
    path = tmp_path / f"{scheduler}-standin.yaml"
    path.write_text(f"name: {scheduler}-standin\nscheduler: {scheduler}\nlauncher: {launcher}\ncomm_backend: gloo\n"
                    f"remote_root: {tmp_path / 'runs'}\n"
                    "node: {cores: 2, threads_per_core: 1, gpus: 0, memory_gb: 1}\n"
                    f"environment: {{python: {sys.executable}}}\n")
    return path


def _two_ranks(tmp_path: Path, env: dict[str, str], spec: Path, site: Path, job_env: dict[str, str]) -> list[dict]:
    """The script rendered with RANK as the rank command, run as the scheduler would run it (its job variables
    set, no rank variables): one record per rank."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rendered = _run(env, sys.executable, "-c", RENDER, str(spec), str(site), str(run_dir), RANK)
    assert rendered.returncode == 0, rendered.stderr
    script = run_dir / "job.sh"
    script.write_text(rendered.stdout)
    ran = _run({**env, **job_env}, "bash", str(script), cwd=run_dir)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return [json.loads((run_dir / f"rank-{r}.json").read_text()) for r in range(2)]


def test_the_packages_live_outside_hpctrain_which_names_neither() -> None:
    for name in PACKAGES:
        assert (EXAMPLES / name / "pyproject.toml").is_file()
        assert not (REPO / "hpctrain" / name).exists()
    named = [str(p.relative_to(REPO)) for p in (REPO / "hpctrain").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts
             and re.search(r"flux|\blsf\b|jsrun|bsub", p.read_text(encoding="utf-8", errors="replace"), re.I)]
    assert named == []


def test_flux_renders_its_script_submits_to_flux_batch_and_runs_two_ranks(
        tmp_path: Path, site_packages: Path, tiny_job: TinyJob) -> None:
    _stand_ins(tmp_path / "bin")
    env = _env(tmp_path, site_packages)
    spec = tiny_job("tiny-flux", ranks_per_node=2, walltime="00:30:00", checkpoint="{signal_lead_s: 120}")
    site = _site(tmp_path, "flux", "flux-run")

    rendered = _run(env, sys.executable, "-m", "hpctrain", "render", str(spec), "--site", str(site))
    assert rendered.returncode == 0, rendered.stderr
    lines = rendered.stdout.splitlines()
    assert lines[1:6] == ["#FLUX: --nodes=1", "#FLUX: --exclusive", "#FLUX: --time-limit=30m",
                          "#FLUX: --job-name=tiny-flux", "#FLUX: --signal=USR2@120s"], lines[:8]
    assert "export HPCTRAIN_JOB_ENVIRONMENT=hpctrain_flux.job_environment:FLUX" in lines
    launch = next(line for line in lines if "flux run" in line)
    assert "flux run --nodes=1 --ntasks=2 --tasks-per-node=2 --cores-per-task=1 -o cpu-affinity=per-task" in launch

    submitted = _run(env, sys.executable, "-m", "hpctrain", "submit", str(spec), "--site", str(site))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "fM7Zq9AKHno" in submitted.stdout + submitted.stderr
    (script,) = (tmp_path / "record").read_text().splitlines()
    assert Path(script).read_text().startswith("#!/bin/bash\n#FLUX: --nodes=1\n")

    # flux-environment(7): the batch script sees FLUX_ENCLOSING_ID (its job) and FLUX_URI, no task variables.
    ranks = _two_ranks(tmp_path, env, spec, site, {"FLUX_ENCLOSING_ID": "fM7Zq9AKHno", "FLUX_URI": "local:///x"})
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["node"], r["nodes"]) for r in ranks] == [
        (0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]
    assert {r["launcher"] for r in ranks} == {"flux-run"} and {r["job"] for r in ranks} == {"fM7Zq9AKHno"}
    assert [r["heavy"] for r in ranks] == [[], []]


def test_lsf_renders_its_script_submits_to_bsub_and_runs_two_ranks(
        tmp_path: Path, site_packages: Path, tiny_job: TinyJob) -> None:
    _stand_ins(tmp_path / "bin")
    env = _env(tmp_path, site_packages)
    spec = tiny_job("tiny-lsf", ranks_per_node=2, walltime="01:30:00", checkpoint="{signal_lead_s: 120}")
    site = _site(tmp_path, "lsf", "jsrun")

    rendered = _run(env, sys.executable, "-m", "hpctrain", "render", str(spec), "--site", str(site))
    assert rendered.returncode == 0, rendered.stderr
    lines = rendered.stdout.splitlines()
    assert lines[1:4] == ["#BSUB -nnodes 1", "#BSUB -W 1:30", "#BSUB -J tiny-lsf"], lines[:8]
    assert "#BSUB -wa USR2" in lines and "#BSUB -wt 2" in lines
    assert "export HPCTRAIN_JOB_ENVIRONMENT=hpctrain_lsf.job_environment:LSF" in lines
    assert any(line.startswith("jsrun -n2 -r2 -a1 -c1 -g0 -brs -EOMP_NUM_THREADS=1 ") for line in lines), lines

    submitted = _run(env, sys.executable, "-m", "hpctrain", "submit", str(spec), "--site", str(site))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "779469" in submitted.stdout + submitted.stderr
    (script,) = (tmp_path / "record").read_text().splitlines()
    assert Path(script).read_text().startswith("#!/bin/bash\n#BSUB -nnodes 1\n")

    # LSB_MCPU_HOSTS lists the launch node first, then the compute hosts with their slots.
    ranks = _two_ranks(tmp_path, env, spec, site, {"LSB_JOBID": "779469", "LSB_MCPU_HOSTS": "batch1 1 h41n01 42"})
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["node"], r["nodes"]) for r in ranks] == [
        (0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]
    assert {r["launcher"] for r in ranks} == {"jsrun"} and {r["job"] for r in ranks} == {"779469"}
    assert ranks[0]["hosts"] == ["h41n01"] and [r["heavy"] for r in ranks] == [[], []]


def test_the_el_capitan_profile_loads_with_the_flux_package_and_says_what_to_install_without(
        tmp_path: Path, site_packages: Path) -> None:
    env = _env(tmp_path, site_packages)
    code = ("from hpctrain.config.site import load_site; s = load_site('el-capitan'); "
            "print(s.scheduler, s.launcher, s.node.gpus, s.network.nodes)")
    found = _run(env, sys.executable, "-c", code)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["flux", "flux-run", "4", "11136"]

    # This process has no Flux package: the profile names what is missing.
    profile = EXAMPLES / "hpctrain_flux" / "hpctrain_flux" / "site_configs" / "el-capitan.yaml"
    with pytest.raises(ConfigError) as info:
        load_site_file(profile)
    assert "scheduler 'flux' is not installed: pip install the package that provides it" in str(info.value)
