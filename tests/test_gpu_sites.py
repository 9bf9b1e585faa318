"""GPU sites as their centres document them: which cores and which device each local rank gets (issue 14).

Each test renders a job, reads the binding out of the launch line the way the centre's documentation explains
it, and checks it against the node layout that documentation gives (the tables below are copied from it, not
from the site profiles):

- Frontier (OLCF Frontier User Guide): 8 L3 regions of 8 cores (hardware threads +64), the first core of each
  kept by the system (-S 8), region i next to GCD 4,5,2,3,6,7,0,1; srun's -c counts cores at the default
  --threads-per-core=1, a task's cores fill one L3 region first, and --gpu-bind=closest gives the GCD of it.
- Aurora (ALCF "Running Jobs on Aurora"): socket 0 = cores 0-51 + GPUs 0-2, socket 1 = cores 52-103 + GPUs 3-5,
  threads i and i+104 share a core, cores 0 and 52 reserved; in FLAT mode tile t of GPU g is device 2g+t.
- Polaris (ALCF "Machine Overview", device affinity): NUMA domain d = cores 8d..8d+7 (threads +32), next to
  GPU 3-d.

No Slurm with GPUs, no PALS and no GPU exist here: srun's placement is modelled from OLCF's description; PALS
is a recording stand-in that sets PALS_LOCAL_RANKID and runs the wrapped command once per rank, as the real
one does, so the real gpu_affinity wrapper picks each rank's device.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.site import SiteProfile, load_site_file
from hpctrain.errors import ConfigError, FitError
from hpctrain.submission.launchers.binding import parse_id_sets
from hpctrain.submission.render import render_script

ROOT = Path(__file__).resolve().parents[1]
RUN = "/RUN_DIR"

# --- the centres' tables ------------------------------------------------------------------------------------
FRONTIER_L3_GCD = {0: 4, 1: 5, 2: 2, 3: 3, 4: 6, 5: 7, 6: 0, 7: 1}
FRONTIER_CORES = 64
AURORA_CORES = 104
AURORA_RESERVED = {0, 52}
POLARIS_CORES = 32


def aurora_socket_of_cpu(cpu: int) -> int:
    return (cpu % AURORA_CORES) // 52


def aurora_socket_of_device(device: int) -> int:
    return (device // 2) // 3  # FLAT device -> GPU -> socket


def polaris_numa_of_cpu(cpu: int) -> int:
    return (cpu % POLARIS_CORES) // 8


# --- rendering --------------------------------------------------------------------------------------------


def site(name: str) -> SiteProfile:
    return load_site_file(ROOT / "site_configs" / f"{name}.yaml")


def job(name: str, *sets: str, queue: str | None = None) -> JobSpec:
    return load_job(ROOT / "jobs" / f"{name}.yaml", sets=list(sets), queue=queue)


def launch_argv(job_spec: JobSpec, site_profile: SiteProfile, command: list[str] | None = None) -> list[str]:
    return render_script(job_spec, site_profile, run_dir=RUN, spec_path=f"{RUN}/job.yaml", command=command).launch_argv


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in argv (None when absent)."""
    for i, word in enumerate(argv):
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
        if word == name:
            return argv[i + 1]
    return None


def directives(text: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


# --- Frontier: srun as OLCF describes it ---------------------------------------------------------------------


def frontier_srun_placement(argv: list[str], specialized: int = 8) -> dict[int, tuple[set[int], int]]:
    """Local rank -> (physical cores, GCD) for an srun line on one Frontier node, per the OLCF user guide.

    -c counts logical CPUs; at the default --threads-per-core=1 one per core. Tasks go to L3 regions cyclically
    (-m block:cyclic), a task's cores come from its region first and only then from the next; core
    specialization (-S 8) has taken the first core of each region. --gpu-bind=closest: the GCD of the region
    holding the task's cores. A task whose cores do not exist raises ValueError.
    """
    assert argv[0] == "srun"
    tasks = int(option(argv, "--ntasks-per-node") or 1)
    cpus = int(option(argv, "--cpus-per-task") or 1)
    per_core = int(option(argv, "--threads-per-core") or 1)
    cores_per_task = -(-cpus // per_core)
    assert option(argv, "--gpu-bind") == "closest" and option(argv, "--gpus-per-task") == "1"
    free = {region: [8 * region + c for c in range(8 // 8 * (specialized // 8), 8)] for region in range(8)}
    placement: dict[int, tuple[set[int], int]] = {}
    for task in range(tasks):
        region, taken = task % 8, []
        while len(taken) < cores_per_task:
            if not any(free.values()):
                raise ValueError(f"task {task} wants {cores_per_task} cores: the node has none left")
            if not free[region]:
                region = (region + 1) % 8
                continue
            taken.append(free[region].pop(0))
        regions = {c // 8 for c in taken}
        placement[task] = (set(taken), FRONTIER_L3_GCD[min(regions)] if len(regions) == 1 else -1)
    return placement


def test_frontier_eight_ranks_get_seven_cores_and_the_gcd_of_their_l3_region() -> None:
    """The issue's command: 16 nodes x 8 ranks x 7 threads x 1 GCD renders OLCF's `-c7`, not -c14."""
    spec = job("ffn-perlmutter", "resources.ranks_per_node=8", "resources.gpus_per_rank=1",
               "resources.threads_per_rank=7", "resources.account=X", "resources.nodes=16",
               "resources.walltime=02:00:00", queue="batch")
    rendered = render_script(spec, site("frontier"), run_dir=RUN, spec_path=f"{RUN}/job.yaml")
    argv = rendered.launch_argv
    assert option(argv, "--cpus-per-task") == "7" and option(argv, "--threads-per-core") is None
    assert "--cpus-per-task=7" in directives(rendered.text)
    placement = frontier_srun_placement(argv)
    for rank, (cores, gcd) in placement.items():
        assert cores == set(range(8 * rank + 1, 8 * rank + 8)), rank  # one whole L3 region, its first core free
        assert gcd == FRONTIER_L3_GCD[rank], rank
    assert sorted(g for _, g in placement.values()) == list(range(8))  # every GCD once


def test_frontier_model_refuses_the_old_doubled_cpus_per_task() -> None:
    """The model can fail: -c14 (both threads counted) for 8 ranks asks for 112 of 56 cores."""
    argv = ["srun", "--ntasks-per-node=8", "--cpus-per-task=14", "--gpus-per-task=1", "--gpu-bind=closest", "x"]
    with pytest.raises(ValueError, match="none left"):
        frontier_srun_placement(argv)


def test_frontier_both_hardware_threads_need_threads_per_core_in_sbatch_and_srun() -> None:
    """8 ranks x 14 threads use both threads of 7 cores: OLCF asks for --threads-per-core=2 in both places."""
    spec = job("ffn-frontier", "resources.threads_per_rank=14")
    rendered = render_script(spec, site("frontier"), run_dir=RUN, spec_path=f"{RUN}/job.yaml")
    assert option(rendered.launch_argv, "--threads-per-core") == "2"
    assert option(rendered.launch_argv, "--cpus-per-task") == "14"
    assert {"--threads-per-core=2", "--cpus-per-task=14"} <= set(directives(rendered.text))
    for rank, (cores, gcd) in frontier_srun_placement(rendered.launch_argv).items():
        assert len(cores) == 7 and gcd == FRONTIER_L3_GCD[rank]


def test_frontier_debug_is_a_qos_on_the_batch_partition() -> None:
    rendered = render_script(job("ffn-frontier", "resources.nodes=2", queue="debug"), site("frontier"),
                             run_dir=RUN, spec_path=f"{RUN}/job.yaml")
    lines = directives(rendered.text)
    assert "--partition=batch" in lines and "--qos=debug" in lines
    with pytest.raises(FitError, match="02:00:00"):
        render_script(job("ffn-frontier", "resources.walltime=03:00:00", queue="debug"), site("frontier"),
                      run_dir=RUN, spec_path=f"{RUN}/job.yaml")


def test_perlmutter_cpus_per_task_still_counts_hardware_threads() -> None:
    """NERSC: Slurm CPUs are hardware threads on Perlmutter; 4 ranks x 16 cores is -c 32 (unchanged)."""
    argv = launch_argv(job("ffn-perlmutter"), site("perlmutter"))
    assert option(argv, "--cpus-per-task") == "32" and option(argv, "--threads-per-core") is None


# --- PALS sites: the rendered list and the wrapper's map, run through a PALS stand-in -----------------------

PALS_STAND_IN = r'''#!{python}
import os, subprocess, sys
argv, opts, i = sys.argv[1:], {{}}, 0
while argv[i].startswith("-"):
    opts[argv[i]] = argv[i + 1]
    i += 2
total, per_node = int(opts["-n"]), int(opts["--ppn"])
rc = 0
for rank in range(total):
    env = dict(os.environ, PALS_RANKID=str(rank), PALS_LOCAL_RANKID=str(rank % per_node))
    rc |= subprocess.call(argv[i:], env=env)
sys.exit(rc)
'''


def run_under_pals(tmp_path: Path, site_profile: SiteProfile, spec: JobSpec, variable: str) -> dict[int, str]:
    """Local rank -> the device variable the real gpu_affinity wrapper set, started by a PALS stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "mpiexec"
    exe.write_text(PALS_STAND_IN.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    here = site_profile.model_copy(update={"environment": site_profile.environment.model_copy(
        update={"venv": None, "python": sys.executable})})
    argv = launch_argv(spec, here, command=["sh", "-c", f'echo "$PALS_LOCAL_RANKID=${variable}"'])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=True)
    return {int(k): v for k, v in (line.split("=", 1) for line in out.stdout.split())}


def pals_binding(argv: list[str]) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(each local rank's CPUs from ``--cpu-bind list:``, each local rank's devices from ``--devices``)."""
    bind = option(argv, "--cpu-bind")
    assert bind is not None and bind.startswith("list:"), bind
    devices = option(argv, "--devices")
    assert devices is not None
    return parse_id_sets(bind[len("list:"):]), parse_id_sets(devices)


def test_aurora_accepts_twelve_ranks_one_per_tile_bound_as_alcf_documents(tmp_path: Path) -> None:
    spec = job("ffn-aurora", "resources.nodes=1")
    argv = launch_argv(spec, site("aurora"))
    assert option(argv, "--cpu-bind") == ("list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:"
                                          "93-100")  # ALCF's example 4, character for character
    assert option(argv, "--depth") is None
    cpus, devices = pals_binding(argv)
    assert len(cpus) == len(devices) == 12
    for rank, (rank_cpus, rank_devices) in enumerate(zip(cpus, devices, strict=True)):
        assert not {c % AURORA_CORES for c in rank_cpus} & AURORA_RESERVED, rank
        assert len({aurora_socket_of_cpu(c) for c in rank_cpus}) == 1, f"rank {rank} spans sockets"
        assert {aurora_socket_of_device(d) for d in rank_devices} == {aurora_socket_of_cpu(rank_cpus[0])}, rank
        assert rank_devices == (rank,)  # gpu_tile_compact.sh: GPU r/2, tile r%2 = FLAT device r
    masks = run_under_pals(tmp_path, site("aurora"), spec, "ZE_AFFINITY_MASK")
    assert masks == {r: str(r) for r in range(12)}


@pytest.mark.processes
def test_aurora_six_ranks_spread_over_all_six_gpus(tmp_path: Path) -> None:
    """One tile per rank but six ranks: one tile of each GPU, next to the rank's socket (not GPUs 0-2 only)."""
    spec = job("ffn-aurora", "resources.nodes=1", "resources.ranks_per_node=6", "resources.threads_per_rank=16")
    cpus, devices = pals_binding(launch_argv(spec, site("aurora")))
    assert sorted(d // 2 for (d,) in devices) == list(range(6))
    for rank_cpus, rank_devices in zip(cpus, devices, strict=True):
        assert len({aurora_socket_of_cpu(c) for c in rank_cpus}) == 1 and len(rank_cpus) == 16
        assert aurora_socket_of_device(rank_devices[0]) == aurora_socket_of_cpu(rank_cpus[0])
    assert run_under_pals(tmp_path, site("aurora"), spec, "ZE_AFFINITY_MASK") == {r: str(2 * r) for r in range(6)}


def test_aurora_whole_gpu_per_rank_and_hyperthreads_stay_on_the_rank_socket() -> None:
    spec = job("ffn-aurora", "resources.nodes=1", "resources.ranks_per_node=6", "resources.gpus_per_rank=2",
               "resources.threads_per_rank=32")
    cpus, devices = pals_binding(launch_argv(spec, site("aurora")))
    assert devices == tuple((2 * g, 2 * g + 1) for g in range(6))  # both tiles of GPU g
    for rank_cpus, rank_devices in zip(cpus, devices, strict=True):
        assert len(rank_cpus) == 32 and {c % AURORA_CORES for c in rank_cpus} & AURORA_RESERVED == set()
        assert {aurora_socket_of_cpu(c) for c in rank_cpus} == {aurora_socket_of_device(rank_devices[0])}


def test_aurora_ranks_span_sockets_only_when_one_socket_cannot_hold_them() -> None:
    # 3 ranks x 40 threads (20 cores x 2 threads each): two on socket 0, one on socket 1, none split.
    cpus, _ = pals_binding(launch_argv(job("ffn-aurora", "resources.nodes=1", "resources.ranks_per_node=3",
                                           "resources.threads_per_rank=40", "resources.gpus_per_rank=2"),
                                       site("aurora")))
    assert [{aurora_socket_of_cpu(c) for c in rank} for rank in cpus] == [{0}, {0}, {1}]
    # One rank with the whole node (a CPU job): every usable core, both threads, the reserved ones left out.
    argv = launch_argv(job("ffn-aurora", "resources.nodes=1", "resources.ranks_per_node=1",
                           "resources.threads_per_rank=204", "resources.gpus_per_rank=0", "train.comm_backend=mpi"),
                       site("aurora"))
    (whole,) = parse_id_sets(option(argv, "--cpu-bind")[len("list:"):])  # type: ignore[index]
    assert len(whole) == 204 and not {c % AURORA_CORES for c in whole} & AURORA_RESERVED
    with pytest.raises(FitError, match="has 12"):
        launch_argv(job("ffn-aurora", "resources.nodes=1", "resources.ranks_per_node=13",
                        "resources.threads_per_rank=1"), site("aurora"))


@pytest.mark.parametrize(("ranks", "threads"), [(4, 8), (2, 16), (2, 1), (1, 4), (4, 1)])
def test_polaris_every_rank_gets_the_gpu_of_its_cores_numa_domain(tmp_path: Path, ranks: int, threads: int) -> None:
    """ALCF: cores 0-7 sit next to GPU 3 (set_affinity_gpu_polaris.sh gives local rank r GPU 3-r)."""
    spec = job("ffn-polaris", "resources.nodes=1", f"resources.ranks_per_node={ranks}",
               f"resources.threads_per_rank={threads}")
    cpus, devices = pals_binding(launch_argv(spec, site("polaris")))
    for rank, (rank_cpus, (gpu,)) in enumerate(zip(cpus, devices, strict=True)):
        assert len(rank_cpus) == threads
        numa = {polaris_numa_of_cpu(c) for c in rank_cpus}
        assert 3 - gpu in numa, f"rank {rank}: GPU {gpu} is not next to its CPUs {rank_cpus}"
        if threads <= 8:  # a rank that fits in one NUMA domain stays in it
            assert numa == {3 - gpu}, f"rank {rank}: CPUs {rank_cpus} span NUMA domains {numa}"
    if (ranks, threads) == (4, 8):
        assert devices == ((3,), (2,), (1,), (0,))
        assert run_under_pals(tmp_path, site("polaris"), spec, "CUDA_VISIBLE_DEVICES") == {0: "3", 1: "2", 2: "1",
                                                                                           3: "0"}


def test_polaris_model_can_fail_with_the_old_order() -> None:
    """The check above is not vacuous: the old map (rank r -> GPU r) puts rank 0's GPU on another NUMA domain."""
    cpus, _ = pals_binding(launch_argv(job("ffn-polaris", "resources.nodes=1"), site("polaris")))
    assert polaris_numa_of_cpu(cpus[0][0]) != 3 - 0


def test_list_binding_is_refused_for_launchers_that_cannot_take_it(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nextends: {ROOT / 'site_configs' / 'frontier.yaml'}\ncpu_bind: list\n")
    with pytest.raises(ConfigError, match="cpu_bind: list"):
        launch_argv(job("ffn-frontier"), load_site_file(path))


# --- the profiles' facts name their sources -----------------------------------------------------------------

GPU_SITES = ["frontier", "aurora", "polaris", "perlmutter"]


@pytest.mark.parametrize("name", GPU_SITES)
def test_gpu_profiles_name_their_source_and_guessed_keys_exist(name: str) -> None:
    text = (ROOT / "site_configs" / f"{name}.yaml").read_text()
    header = "\n".join(line for line in text.splitlines()[:12] if line.startswith("#"))
    assert "read 2026" in header and ("docs." in header or "user guide" in header.lower()), header
    profile = site(name).model_dump()
    for key in site(name).guessed:
        node: object = profile
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"guessed key {key!r} is not in the profile"
            node = node[part]


def test_gpu_profile_facts_match_the_centres_tables() -> None:
    frontier, aurora, polaris = site("frontier").node, site("aurora").node, site("polaris").node
    assert (frontier.cores, frontier.physical_cores, frontier.gpus, frontier.devices_per_gpu) == (56, 64, 8, 2)
    assert [frontier.gpu_order[i] for i in range(8)] == [FRONTIER_L3_GCD[i] for i in range(8)]  # type: ignore[index]
    assert frontier.reserved_cores == [8 * i for i in range(8)] and frontier.task_threads_per_core == 1
    assert (aurora.cores, aurora.physical_cores, aurora.sockets, set(aurora.reserved_cores)) == (
        102, AURORA_CORES, 2, AURORA_RESERVED)
    assert (aurora.gpus, aurora.devices_per_gpu, aurora.gpu_kind) == (12, 2, "intel")
    assert (polaris.cores, polaris.gpu_order) == (POLARIS_CORES, [3, 2, 1, 0])


def test_a_queue_names_a_qos_only_on_slurm_beside_a_partition(tmp_path: Path) -> None:
    pbs = tmp_path / "pbs.yaml"
    pbs.write_text(f"name: p\nextends: {ROOT / 'site_configs' / 'polaris.yaml'}\n"
                   "queues: {debug: {max_nodes: 2, max_walltime: '01:00:00', qos: fast}}\n")
    with pytest.raises(ConfigError, match="pbs has no QOS"):
        load_site_file(pbs)
    qos_site = tmp_path / "q.yaml"
    qos_site.write_text(f"name: q\nextends: {ROOT / 'site_configs' / 'perlmutter.yaml'}\n"
                        "queues: {gpu: {max_nodes: 2, max_walltime: '01:00:00', qos: premium}}\n")
    with pytest.raises(ConfigError, match="beside its partition"):
        load_site_file(qos_site)


@pytest.mark.parametrize(("site_name", "job_name", "backend", "message"), [
    ("polaris", "ffn-polaris", "xccl", "cannot reduce on nvidia GPUs"),
    ("aurora", "ffn-aurora", "nccl", "cannot reduce on intel GPUs"),
])
def test_a_backend_for_another_gpu_kind_is_refused_before_rendering(site_name: str, job_name: str, backend: str,
                                                                    message: str) -> None:
    with pytest.raises(FitError, match=message):
        launch_argv(job(job_name, f"train.comm_backend={backend}"), site(site_name))


def test_the_device_backend_follows_the_gpu_kind_and_a_cpu_job_takes_gloo() -> None:
    assert render_script(job("ffn-frontier"), site("frontier"), run_dir=RUN,
                         spec_path=f"{RUN}/job.yaml").placement.backend == "nccl"  # RCCL on ROCm
    assert render_script(job("ffn-aurora"), site("aurora"), run_dir=RUN,
                         spec_path=f"{RUN}/job.yaml").placement.backend == "xccl"
    cpu_only = job("ffn-aurora", "resources.gpus_per_rank=0")
    rendered = render_script(cpu_only, site("aurora"), run_dir=RUN, spec_path=f"{RUN}/job.yaml")
    assert rendered.placement.backend == "gloo" and "HPCTRAIN_GPU_KIND" not in rendered.text
