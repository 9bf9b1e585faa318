"""Tests of launch_env.py and the job environments it asks: one per launcher.

Real launchers: MPICH hydra (the wheel's ``.venv/bin/mpiexec``), torchrun, and Slurm's srun when a real
Slurm answers ``sinfo``. Stand-ins (recorded environments, no such launcher exists on this machine): Open MPI
mpirun, PALS mpiexec (PBS / Slurm's cray_shasta plugin), ALPS aprun.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import RuntimeFailure
from hpctrain.launch_env import (
    LaunchEnv,
    detect_launch_env,
    scheduler_job_id,
    scheduler_nodes,
)
from hpctrain.node_lists import expand_slurm_nodelist, read_pbs_nodefile
from hpctrain.submission.launchers.local_launch import free_port

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
WORKER = str(ROOT / "tests" / "mp_helpers" / "comm_worker.py")


def _run_env_worker(argv: list[str], extra_env: dict[str, str] | None = None) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_"))}
    env.update(extra_env or {})
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # Ranks share one stdout pipe, so lines may interleave: pick the JSON objects out of the stream.
    rows = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", out.stdout)]
    return sorted(rows, key=lambda r: r["rank"])


# ------------------------------------------------------------------------------------ real launchers


@pytest.mark.mpi
def test_hydra_mpiexec_real() -> None:
    rows = _run_env_worker([str(ROOT / ".venv/bin/mpiexec"), "-n", "2", PY, WORKER, "env"])
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["launcher"]) for r in rows] == [
        (0, 2, 0, 2, "hydra"), (1, 2, 1, 2, "hydra")
    ]
    assert all(r["node_rank"] == 0 and r["nodes"] == 1 for r in rows)


@pytest.mark.processes
def test_torchrun_real() -> None:
    port = free_port()
    rows = _run_env_worker(
        [str(ROOT / ".venv/bin/torchrun"), "--nproc-per-node", "2", "--master-port", str(port), WORKER, "env"]
    )
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["launcher"]) for r in rows] == [
        (0, 2, 0, 2, "torchrun"), (1, 2, 1, 2, "torchrun")
    ]
    assert rows[0]["master_port"] == port and rows[0]["master_addr"]



@pytest.mark.slurm
def test_srun_real(slurm: object) -> None:
    rows = _run_env_worker(["srun", "-n", "2", "--overcommit", PY, WORKER, "env"])
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["launcher"]) for r in rows] == [
        (0, 2, 0, 2, "slurm"), (1, 2, 1, 2, "slurm")
    ]
    assert all(r["node_rank"] == 0 and r["nodes"] == 1 for r in rows)


# ------------------------------------------------------------------------------- recorded environments


def test_none_is_single_process() -> None:
    assert detect_launch_env({"HOME": "/root", "PATH": "/bin"}) == LaunchEnv(0, 1, 0, 1, 0, 1, "none")


def test_slurm_recorded_multi_node() -> None:
    # srun -N 2 -n 5 (3 tasks on node 0, 2 on node 1): rank 4 is the second task on nid011.
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "4", "SLURM_NTASKS": "5",
        "SLURM_STEP_NUM_TASKS": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "3,2", "SLURM_JOB_NODELIST": "nid[010-011]",
    }
    assert detect_launch_env(env) == LaunchEnv(4, 5, 1, 2, 1, 2, "slurm")
    env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2),1"
    env.update(SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_NODEID="1")
    assert detect_launch_env(env).local_size == 2


def test_slurm_batch_shell_without_step_is_single_process() -> None:
    # The batch script itself (no srun step) must not claim to be rank 0 of SLURM_NTASKS.
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "nid001"}
    assert detect_launch_env(env).launcher == "none"


def test_pals_recorded() -> None:
    """Stand-in: PBS Pro + PALS mpiexec (Polaris/Aurora style), rank 5 of 8 with 4 per node."""
    env = {
        "PBS_JOBID": "123.polaris", "PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1",
        "PALS_APID": "abc", "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4",
    }
    assert detect_launch_env(env) == LaunchEnv(5, 8, 1, 4, 1, 2, "pals")


def test_alps_recorded_with_and_without_pmi_local_rank() -> None:
    """Stand-in: Cray aprun -n 6 -N 3. Without PMI_LOCAL_RANK the local rank is ALPS_APP_PE % per-node."""
    env = {"ALPS_APP_PE": "4", "PMI_RANK": "4", "PMI_SIZE": "6", "PMI_LOCAL_RANK": "1",
           "PMI_LOCAL_SIZE": "3"}
    assert detect_launch_env(env) == LaunchEnv(4, 6, 1, 3, 1, 2, "alps")
    env = {"ALPS_APP_PE": "4", "PMI_SIZE": "6", "HPCTRAIN_RANKS_PER_NODE": "3"}
    assert detect_launch_env(env) == LaunchEnv(4, 6, 1, 3, 1, 2, "alps")


def test_hydra_recorded() -> None:
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "9"}
    assert detect_launch_env(env) == LaunchEnv(3, 4, 1, 2, 1, 2, "hydra")


def test_openmpi_recorded_inside_slurm_allocation() -> None:
    """Stand-in: Open MPI mpirun in a Slurm batch script: OMPI_* wins over the inherited SLURM_*."""
    env = {
        "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
        "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "0",
    }
    assert detect_launch_env(env) == LaunchEnv(2, 4, 0, 2, 1, 2, "openmpi")


def test_torchrun_recorded_multi_node() -> None:
    env = {
        "TORCHELASTIC_RUN_ID": "x", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "nid001",
        "MASTER_PORT": "29500",
    }
    assert detect_launch_env(env) == LaunchEnv(5, 8, 1, 4, 1, 2, "torchrun", "nid001", 29500)


def test_inconsistent_or_malformed_values_raise() -> None:
    with pytest.raises(RuntimeFailure, match="PMI_RANK='x'"):
        detect_launch_env({"MPI_LOCALRANKID": "0", "PMI_RANK": "x", "PMI_SIZE": "2"})
    with pytest.raises(RuntimeFailure, match="inconsistent"):
        detect_launch_env({"MPI_LOCALRANKID": "0", "PMI_RANK": "2", "PMI_SIZE": "2"})
    with pytest.raises(RuntimeFailure, match="PMI_RANK and PMI_SIZE are missing"):
        detect_launch_env({"MPI_LOCALRANKID": "0"})


# ------------------------------------------------------------------------------------------- node lists


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nid[001-003,007]", ["nid001", "nid002", "nid003", "nid007"]),
        ("node7", ["node7"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
        ("gpu[8-11]-ib", ["gpu8-ib", "gpu9-ib", "gpu10-ib", "gpu11-ib"]),
        ("x[098-101]", ["x098", "x099", "x100", "x101"]),
    ],
)
def test_expand_slurm_nodelist(text: str, expected: list[str]) -> None:
    assert expand_slurm_nodelist(text) == expected


@pytest.mark.parametrize("bad", ["nid[001-003", "nid]1[", "nid[a-b]"])
def test_expand_slurm_nodelist_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_slurm_nodelist(bad)


def test_pbs_nodefile_and_scheduler_nodes(tmp_path: Path) -> None:
    f = tmp_path / "nodefile"
    f.write_text("x3001\nx3001\nx3002\n\nx3001\n")
    assert read_pbs_nodefile(f) == ["x3001", "x3002"]
    assert scheduler_nodes({"PBS_NODEFILE": str(f), "PBS_JOBID": "5.pbs"}) == ["x3001", "x3002"]
    assert scheduler_nodes({"SLURM_JOB_NODELIST": "n[1-2]"}) == ["n1", "n2"]
    assert scheduler_nodes({}) == []
    assert scheduler_job_id({"PBS_JOBID": "5.pbs"}) == "5.pbs"


def test_pals_without_local_size_uses_nodefile(tmp_path: Path) -> None:
    f = tmp_path / "nodefile"
    f.write_text("a\nb\n")
    env = {"PALS_RANKID": "3", "PMI_SIZE": "4", "PALS_LOCAL_RANKID": "1", "PBS_NODEFILE": str(f)}
    got = detect_launch_env(env)
    assert (got.local_size, got.nodes, got.node_rank) == (2, 2, 1)


def test_module_imports_no_torch() -> None:
    code = "import sys, hpctrain.launch_env; print('torch' in sys.modules, 'mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False False"


def test_a_plug_in_job_environment_named_by_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """A back-end hpctrain does not ship: the script names its job environment (module:attribute), the rank imports
    that module alone and reads rank, job id, nodes, array task and restarts from it; torchrun still comes first,
    the plug-in before the built-in launchers whose variables it may also set."""
    import types

    from hpctrain.job_environment import JobEnvironment, RankVariables
    from hpctrain.launch_env import job_id_of, restarts_of
    from hpctrain.submission.launchers.gpu_affinity import local_rank

    module = types.ModuleType("toy_job_env")
    module.TOY = JobEnvironment(  # type: ignore[attr-defined]
        "toy", ranks=(RankVariables("toyrun", "TOY_RANK", rank=("TOY_RANK",), size=("TOY_SIZE",),
                                    local_rank=("TOY_LOCAL",), nodes=("TOY_NODES",)),),
        job_id=("TOY_JOB",), node_list=("TOY_HOSTS",), array_job_id=("TOY_JOB",), array_index=("TOY_INDEX",),
        array_id_format="{job}.{index}", restart_count=("TOY_RESTARTS",))
    monkeypatch.setitem(sys.modules, "toy_job_env", module)
    env = {"HPCTRAIN_JOB_ENVIRONMENT": "toy_job_env:TOY", "TOY_RANK": "3", "TOY_SIZE": "4", "TOY_LOCAL": "1",
           "TOY_NODES": "2", "TOY_JOB": "77", "TOY_HOSTS": "n[1-2]", "TOY_INDEX": "5", "TOY_RESTARTS": "2",
           "PALS_RANKID": "0", "PMI_SIZE": "4", "PALS_LOCAL_RANKID": "0"}
    got = detect_launch_env(env)
    assert (got.launcher, got.rank, got.size, got.local_rank, got.local_size, got.node_rank, got.nodes) == (
        "toyrun", 3, 4, 1, 2, 1, 2)
    assert scheduler_job_id(env) == "77" and scheduler_nodes(env) == ["n1", "n2"]
    assert local_rank(env) == 1 and job_id_of(env) == "77.5" and restarts_of(env) == 2
    torchrun = {**env, "TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1"}
    assert detect_launch_env(torchrun).launcher == "torchrun"
    assert detect_launch_env({k: v for k, v in env.items() if k != "HPCTRAIN_JOB_ENVIRONMENT"}).launcher == "pals"


def test_a_node_is_named_as_its_scheduler_names_it_else_by_its_host_name() -> None:
    import socket

    from hpctrain.launch_env import node_name

    assert node_name({"SLURMD_NODENAME": "nid00042", "SLURM_PROCID": "0"}) == "nid00042"
    assert node_name({"SLURMD_NODENAME": ""}) == socket.gethostname()
    assert node_name({}) == socket.gethostname()
