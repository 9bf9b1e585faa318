"""Launchers: the argv each builds from a plan, and those argvs run by real srun and hydra mpiexec.

aprun (Cray ALPS) and PBS's PALS mpiexec do not exist here: they are tested against recording stand-ins
(fake executables that parse the real option grammar, record argv and run the command once per rank).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config.node_shape import NodeShape
from hpctrain.config.site import SiteProfile
from hpctrain.errors import ConfigError, FitError
from hpctrain.submission.launchers import (
    LAUNCHERS,
    LaunchPlan,
    cpus_per_rank_for,
    get_launcher,
    hyperthreads_for,
    slurm_threads_per_core,
)
from hpctrain.submission.launchers.binding import (
    device_map,
    pals_cpu_list,
    parse_id_sets,
    rank_cores,
    rank_cpus,
    rank_devices,
)
from hpctrain.submission.launchers.gpu_affinity import local_rank, mapped_devices, visible_devices
from hpctrain.submission.schedulers.base import get_scheduler

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = ROOT / ".venv" / "bin" / "mpiexec"
CMD = ["python3", "-m", "hpctrain", "run", "spec.yaml"]


def test_registry_has_every_launcher_and_rejects_unknown_names() -> None:
    assert {"srun", "aprun", "mpiexec-pals", "mpiexec-hydra", "local"} <= set(LAUNCHERS)
    with pytest.raises(ConfigError, match="no launcher named"):
        get_launcher("mpirun-typo")


def test_srun_argv_with_gpus_binding_and_extra_args() -> None:
    plan = LaunchPlan(nodes=4, ranks_per_node=4, threads_per_rank=16, gpus_per_rank=1, cpu_bind="cores",
                      extra_args=("--mpi=pmi2",), cpus_per_rank=32)
    assert get_launcher("srun")(CMD, plan) == [
        "srun", "--nodes=4", "--ntasks=16", "--ntasks-per-node=4", "--cpus-per-task=32",
        "--kill-on-bad-exit=1", "--gpus-per-task=1", "--gpu-bind=closest", "--cpu-bind=cores", "--mpi=pmi2", *CMD]


def test_srun_argv_cpu_only_has_no_gpu_or_bind_options() -> None:
    argv = get_launcher("srun")(CMD, LaunchPlan(nodes=1, ranks_per_node=2))
    assert argv == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
                    "--kill-on-bad-exit=1", *CMD]


def test_aprun_theta_one_rank_of_128_threads_uses_two_hardware_threads_per_core() -> None:
    knl = NodeShape(cores=64, threads_per_core=4, memory_gb=192)
    ht = hyperthreads_for(knl, ranks_per_node=1, threads_per_rank=128)
    assert ht == 2
    plan = LaunchPlan(nodes=128, ranks_per_node=1, threads_per_rank=128, hyperthreads=ht)
    assert get_launcher("aprun")(CMD, plan) == [
        "aprun", "-n", "128", "-N", "1", "-d", "128", "-j", "2", "-cc", "depth",
        "-e", "OMP_NUM_THREADS=128", *CMD]


@pytest.mark.parametrize(("rpn", "threads", "ht", "cpus"), [(64, 1, 1, 4), (64, 4, 4, 4), (4, 16, 1, 64),
                                                            (2, 64, 2, 128)])
def test_hyperthreads_and_cpus_per_rank_on_knl(rpn: int, threads: int, ht: int, cpus: int) -> None:
    knl = NodeShape(cores=64, threads_per_core=4, memory_gb=192)
    assert hyperthreads_for(knl, rpn, threads) == ht
    assert cpus_per_rank_for(knl, threads, ht) == cpus


def test_pals_mpiexec_wraps_gpu_ranks_in_the_affinity_helper() -> None:
    plan = LaunchPlan(nodes=2, ranks_per_node=4, threads_per_rank=8, gpus_per_rank=1, cpu_bind="depth",
                      gpu_kind="nvidia", python="/venv/bin/python")
    assert get_launcher("mpiexec-pals")(CMD, plan) == [
        "mpiexec", "-n", "8", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth", "--env", "OMP_NUM_THREADS=8",
        "/venv/bin/python", "-m", "hpctrain.submission.launchers.gpu_affinity", "--kind", "nvidia",
        "--gpus-per-rank", "1", "--", *CMD]


def test_hydra_mpiexec_and_local_argv() -> None:
    plan = LaunchPlan(nodes=1, ranks_per_node=3, python="/usr/bin/python3")
    assert get_launcher("mpiexec-hydra")(CMD, plan) == ["mpiexec", "-n", "3", "-ppn", "3", *CMD]
    assert get_launcher("local")(CMD, plan) == [
        "/usr/bin/python3", "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", "3", "--", *CMD]
    with pytest.raises(ConfigError, match="one machine"):
        get_launcher("local")(CMD, LaunchPlan(nodes=2, ranks_per_node=1))


def test_launcher_for_picks_pals_under_pbs_and_hydra_elsewhere() -> None:
    node = NodeShape(cores=4, memory_gb=8)
    pbs = SiteProfile(name="p", scheduler="pbs", launcher="mpiexec", node=node)
    local = SiteProfile(name="l", scheduler="local", launcher="mpiexec", node=node)
    assert get_scheduler("pbs").launcher_for(pbs) == "mpiexec-pals"
    assert get_scheduler("local").launcher_for(local) == "mpiexec-hydra"


def test_gpu_affinity_reads_the_first_local_rank_variable() -> None:
    assert local_rank({"PALS_LOCAL_RANKID": "3", "SLURM_LOCALID": "1"}) == 3
    assert local_rank({"MPI_LOCALRANKID": "2"}) == 2
    assert local_rank({}) == 0
    assert visible_devices("nvidia", 1, 2) == ("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_devices("amd", 3, 1) == ("ROCR_VISIBLE_DEVICES", "3")
    assert visible_devices("intel", 5, 1) == ("ZE_AFFINITY_MASK", "5")


def test_cpus_per_task_counts_what_the_site_lays_a_task_out_on() -> None:
    """Perlmutter: Slurm CPUs are hardware threads (16 cores -> -c 32). Frontier: --threads-per-core defaults to 1,
    so -c counts cores (7 cores -> -c 7) until a job needs both threads, which it must then ask for."""
    perlmutter = NodeShape(cores=64, threads_per_core=2, memory_gb=256)
    frontier = NodeShape(cores=56, threads_per_core=2, task_threads_per_core=1, memory_gb=512)
    assert cpus_per_rank_for(perlmutter, 16, hyperthreads_for(perlmutter, 4, 16)) == 32
    assert slurm_threads_per_core(perlmutter, 2) is None
    ht = hyperthreads_for(frontier, 8, 7)
    assert (ht, cpus_per_rank_for(frontier, 7, ht), slurm_threads_per_core(frontier, ht)) == (1, 7, None)
    ht = hyperthreads_for(frontier, 8, 14)
    assert (ht, cpus_per_rank_for(frontier, 14, ht), slurm_threads_per_core(frontier, ht)) == (2, 14, 2)


def test_srun_writes_threads_per_core_only_when_the_plan_needs_it() -> None:
    plan = LaunchPlan(nodes=1, ranks_per_node=8, threads_per_rank=14, gpus_per_rank=1, cpus_per_rank=14,
                      threads_per_core=2)
    argv = get_launcher("srun")(CMD, plan)
    assert "--threads-per-core=2" in argv and "--cpus-per-task=14" in argv
    assert not any(w.startswith("--threads-per-core") for w in get_launcher("srun")(CMD, LaunchPlan(1, 2)))


def test_binding_splits_ranks_over_sockets_skipping_reserved_cores() -> None:
    aurora = NodeShape(cores=102, threads_per_core=2, sockets=2, reserved_cores=[0, 52], gpus=12, gpu_kind="intel",
                       devices_per_gpu=2, memory_gb=1024)
    cores = rank_cores(aurora, 12, 8, 1)
    assert cores[0] == tuple(range(1, 9)) and cores[5] == tuple(range(41, 49)) and cores[6] == tuple(range(53, 61))
    assert pals_cpu_list(rank_cpus(aurora, 12, 8, 1)) == (
        "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100")
    assert rank_cpus(aurora, 2, 2, 2) == ((1, 105), (53, 157))  # threads i and i+104 share core i
    assert rank_devices(aurora, 12, 1) == tuple((d,) for d in range(12))
    assert rank_devices(aurora, 4, 1) == ((0,), (3,), (6,), (9,))
    with pytest.raises(FitError, match="usable cores"):
        rank_cores(aurora, 4, 52, 1)


def test_binding_deals_devices_in_core_order() -> None:
    polaris = NodeShape(cores=32, threads_per_core=2, gpus=4, gpu_kind="nvidia", gpu_order=[3, 2, 1, 0],
                        memory_gb=512)
    assert rank_devices(polaris, 4, 1) == ((3,), (2,), (1,), (0,))
    assert rank_devices(polaris, 2, 2) == ((3, 2), (1, 0))
    assert rank_devices(polaris, 2, 0) == ()
    assert rank_cores(polaris, 2, 1, 1) == ((0,), (16,))  # spread: rank 1 sits by GPU 1, its device


@pytest.mark.parametrize("text", ["1-8:9-16", "3:2:1:0", "0,1:2,3", "5"])
def test_id_set_text_round_trips(text: str) -> None:
    sets = parse_id_sets(text)
    assert device_map(sets) == ",".join(str(i) for i in sets[0]) + "".join(
        ":" + ",".join(str(i) for i in r) for r in sets[1:])
    assert parse_id_sets(pals_cpu_list(sets)[len("list:"):]) == sets
    with pytest.raises(ValueError):
        parse_id_sets(text + ":x")


def test_site_topology_is_checked_when_the_profile_loads() -> None:
    with pytest.raises(ValueError, match="gpu_order"):
        NodeShape(cores=4, gpus=2, gpu_kind="nvidia", gpu_order=[0, 0], memory_gb=1)
    with pytest.raises(ValueError, match="reserved_cores"):
        NodeShape(cores=4, reserved_cores=[4, 9], memory_gb=1)
    with pytest.raises(ValueError, match="sockets"):
        NodeShape(cores=5, sockets=2, memory_gb=1)


def test_gpu_affinity_map_gives_each_local_rank_its_entry_and_refuses_extra_ranks() -> None:
    assert mapped_devices("nvidia", 0, "3:2:1:0") == ("CUDA_VISIBLE_DEVICES", "3")
    assert mapped_devices("intel", 1, "0,1:2,3") == ("ZE_AFFINITY_MASK", "2,3")
    with pytest.raises(ValueError, match="more ranks per node"):
        mapped_devices("amd", 4, "3:2:1:0")
    env = {**os.environ, "PALS_LOCAL_RANKID": "4", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "hpctrain.submission.launchers.gpu_affinity", "--kind", "nvidia",
                          "--devices", "3:2:1:0", "--", "true"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "local rank 4 has no devices" in out.stderr


def test_list_binding_goes_to_pals_only() -> None:
    plan = LaunchPlan(nodes=1, ranks_per_node=2, threads_per_rank=1, cpu_bind="list", cpu_list=((1,), (53,)))
    assert get_launcher("mpiexec-pals")(CMD, plan)[:7] == ["mpiexec", "-n", "2", "--ppn", "2", "--cpu-bind",
                                                           "list:1:53"]
    for name in ("srun", "aprun", "mpiexec-hydra"):
        with pytest.raises(ConfigError, match="cpu_bind: list"):
            get_launcher(name)(CMD, plan)


def test_gpu_affinity_module_sets_the_variable_and_execs() -> None:
    env = {**os.environ, "PALS_LOCAL_RANKID": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "hpctrain.submission.launchers.gpu_affinity", "--kind", "amd",
                          "--gpus-per-rank", "2",
                          "--", "printenv", "ROCR_VISIBLE_DEVICES"], env=env, capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip() == "2,3"


# ---------------------------------------------------------------------------------------------------------
# Real launchers


@pytest.mark.slurm
def test_srun_line_starts_the_requested_ranks_inside_salloc(slurm: object) -> None:
    argv = get_launcher("srun")(["printenv", "SLURM_PROCID"], LaunchPlan(nodes=1, ranks_per_node=2))
    out = subprocess.run(["salloc", "--nodes=1", "--ntasks=2", "--time=2", "--job-name=hpctrain-test-srun",
                          *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["0", "1"]


@pytest.mark.mpi
def test_hydra_line_runs_with_the_mpich_wheel_and_binds_gpus_per_local_rank() -> None:
    assert MPIEXEC.exists(), "the MPICH wheel's mpiexec is missing from .venv: run bash scripts/install.sh"
    plan = LaunchPlan(nodes=1, ranks_per_node=2, gpus_per_rank=1, gpu_kind="nvidia", python=sys.executable)
    argv = get_launcher("mpiexec-hydra")(["sh", "-c", 'echo "$PMI_RANK:$CUDA_VISIBLE_DEVICES"'], plan)
    assert argv[0] == "mpiexec"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(MPIEXEC), *argv[1:]], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["0:0", "1:1"]


# Stand-in launcher: parses the options the real one takes (each takes one value), records argv and the
# environment, then runs the command once per rank with that launcher's rank variables set.
_STAND_IN = r'''#!{python}
import json, os, subprocess, sys
argv = sys.argv[1:]
valued = set({valued!r})
i = 0
opts = {{}}
while i < len(argv) and argv[i] in valued:
    opts[argv[i]] = argv[i + 1]
    i += 2
command = argv[i:]
with open({record!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv, "opts": opts, "command": command}}) + "\n")
total = int(opts["-n"])
per_node = int(opts.get({ppn!r}, total))
rc = 0
for rank in range(total):
    env = dict(os.environ)
    env.update({{k: str(v) for k, v in {rank_vars}.items()}})
    rc |= subprocess.call(command, env=env)
sys.exit(rc)
'''


def _stand_in(tmp_path: Path, name: str, valued: list[str], ppn: str, rank_vars: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / f"{name}.jsonl"
    exe = bin_dir / name
    exe.write_text(_STAND_IN.format(python=sys.executable, valued=valued, record=str(record), ppn=ppn,
                                    rank_vars=rank_vars))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return record


def test_aprun_line_against_a_recording_stand_in(tmp_path: Path) -> None:
    """Stand-in for Cray aprun: every option before the command must be one aprun takes with a value."""
    record = _stand_in(tmp_path, "aprun", ["-n", "-N", "-d", "-j", "-cc", "-e"], "-N",
                       '{"ALPS_APP_PE": rank}')
    plan = LaunchPlan(nodes=2, ranks_per_node=1, threads_per_rank=4, hyperthreads=2)
    argv = get_launcher("aprun")(["sh", "-c", 'echo "pe=$ALPS_APP_PE"'], plan)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=True)
    assert sorted(out.stdout.split()) == ["pe=0", "pe=1"]
    rec = json.loads(record.read_text().splitlines()[0])
    assert rec["opts"] == {"-n": "2", "-N": "1", "-d": "4", "-j": "2", "-cc": "depth", "-e": "OMP_NUM_THREADS=4"}
    assert rec["command"][:2] == ["sh", "-c"]


def test_pals_line_against_a_recording_stand_in_gives_each_local_rank_its_gpu(tmp_path: Path) -> None:
    """Stand-in for HPE PALS mpiexec (PBS Pro): sets PALS_RANKID/PALS_LOCAL_RANKID like the real one."""
    record = _stand_in(tmp_path, "mpiexec", ["-n", "--ppn", "--depth", "--cpu-bind", "--env"], "--ppn",
                       '{"PALS_RANKID": rank, "PALS_LOCAL_RANKID": rank % per_node}')
    plan = LaunchPlan(nodes=2, ranks_per_node=2, threads_per_rank=2, gpus_per_rank=1, gpu_kind="intel",
                      cpu_bind="depth", python=sys.executable)
    argv = get_launcher("mpiexec-pals")(["sh", "-c", 'echo "$PALS_RANKID:$ZE_AFFINITY_MASK"'], plan)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=True)
    assert sorted(out.stdout.split()) == ["0:0", "1:1", "2:0", "3:1"]
    rec = json.loads(record.read_text().splitlines()[0])
    assert rec["opts"]["--ppn"] == "2" and rec["opts"]["--cpu-bind"] == "depth"
    assert rec["command"][1:3] == ["-m", "hpctrain.submission.launchers.gpu_affinity"]
