"""Tests of runtime/comm/ and runtime/comm/watchdog.py with real launchers (MPICH hydra mpiexec, torchrun).

The timeout tests really hang one rank and check that the whole job exits non-zero, on time, naming it.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from hpctrain.errors import ConfigError, RuntimeFailure
from hpctrain.launch_env import LaunchEnv
from hpctrain.runtime.comm.backends import make_communicator
from hpctrain.runtime.comm.base import SingleProcessCommunicator
from hpctrain.runtime.comm.rendezvous import port_from_job_id, rendezvous_address
from hpctrain.runtime.comm.watchdog import Pending, Watchdog
from hpctrain.submission.launchers.local_launch import free_port

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
MPIEXEC = str(ROOT / ".venv" / "bin" / "mpiexec")
TORCHRUN = str(ROOT / ".venv" / "bin" / "torchrun")
WORKER = str(ROOT / "tests" / "mp_helpers" / "comm_worker.py")


# A hang guard, not a timing: inside pytest's own limit, far above three ranks' start-up on a busy machine.
HANG_GUARD_S = 500


def _clean_env() -> dict[str, str]:
    drop = ("PMI_", "MPI_LOCAL", "SLURM_", "OMPI_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "TORCHELASTIC")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_clean_env(), cwd=ROOT)


@pytest.mark.mpi
@pytest.mark.parametrize(("n", "backend"), [(2, "mpi"), (3, "mpi"), (3, "gloo")])
def test_collectives_under_mpiexec(n: int, backend: str) -> None:
    # gloo under mpiexec also exercises the rendezvous: rank 0's host:port broadcast over MPI.
    out = _run([MPIEXEC, "-n", str(n), PY, WORKER, "collectives", backend], timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count(f"{backend} collectives OK") == n


@pytest.mark.mpi
@pytest.mark.parametrize("chosen", [{}, {"UCX_TLS": "self,sm"}])
def test_mpich_wheel_on_one_node_starts_without_ucx_unless_the_user_chose(chosen: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """MPICH's UCX netmod exchanges every transport's address at MPI_Init (it once failed there under srun);
    on one node hpctrain starts the wheel's MPICH over libfabric's tcp provider on loopback instead. A transport
    the user chose (here UCX_TLS) is left alone."""
    import json

    env = {**_clean_env(), **chosen}
    out = subprocess.run([MPIEXEC, "-n", "2", PY, WORKER, "transport", str(tmp_path)], capture_output=True,
                         text=True, timeout=HANG_GUARD_S, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1] and all(r["sum"] == [2.0] * 3 for r in reports)
    for r in reports:
        if chosen:
            assert r["set"] == {"MPICH_CH4_NETMOD": None, "FI_PROVIDER": None, "FI_TCP_IFACE": None}
            assert r["ucx_transports"], r  # UCX came up, as the user asked
        else:
            assert r["set"] == {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}
            assert r["ucx_transports"] == [] and "async" not in r["threads"], r  # UCX never initialised


NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
PID_WORKER = str(ROOT / "tests" / "mp_helpers" / "mpi_pid_worker.py")
SHM = Path("/dev/shm")
SHM_SEGMENT = re.compile(r"(\d+):\d+:\d+(:\d+)?")  # libfabric's shm provider: <pid>:<uid>:<n>[:<m>]


def _remove_dead_ranks_shm_segments() -> None:
    """libfabric's shm provider leaves its segments in /dev/shm when MPI_Init aborts. A later rank given the same
    PID (these tests hand out the same PIDs on purpose) then finds the dead rank's segment, and its MPI_Init
    aborts or hangs at random. The segments of PIDs no process holds are removed."""
    for path in SHM.iterdir() if SHM.is_dir() else ():
        match = SHM_SEGMENT.fullmatch(path.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            path.unlink(missing_ok=True)


def _run_with_pids_across_a_power_of_ten(env_extra: dict[str, str], tmp_path: Path) -> tuple[
        subprocess.CompletedProcess[str], list[int], Path]:
    """Runs 3 ranks whose PIDs have different numbers of digits (e.g. 9999 and 10000): the kernel hands out the
    PID after the one written to ns_last_pid. Other processes (the other xdist worker) can take PIDs in
    between, so it tries until the ranks' PIDs straddle a power of ten."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    boundaries = [b for b in (10_000, 1_000, 100_000) if b < pid_max]
    for attempt in range(12):
        out_dir = tmp_path / f"try-{attempt}"
        out_dir.mkdir(parents=True)
        _remove_dead_ranks_shm_segments()
        NS_LAST_PID.write_text(str(boundaries[attempt % len(boundaries)] - 4))
        out = subprocess.run([MPIEXEC, "-n", "3", PY, PID_WORKER, str(out_dir)], capture_output=True, text=True,
                             timeout=HANG_GUARD_S, env={**_clean_env(), **env_extra}, cwd=ROOT)
        pids = [int(p.read_text()) for p in sorted(out_dir.glob("pid-*"))]
        if len(pids) == 3 and len({len(str(p)) for p in pids}) > 1:
            return out, pids, out_dir
    pytest.fail("could not start 3 ranks whose PIDs straddle a power of ten in 12 tries")


@pytest.mark.mpi
@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="setting the next PID needs root (ns_last_pid)")
def test_mpi_init_works_when_the_ranks_pids_have_different_lengths(tmp_path: Path) -> None:
    """The regression behind a CI failure: with libfabric's shm provider (hpctrain's one-node setting until
    2026-11-26) a rank's address is "fi_shm://<pid>:<uid>:<n>", whose length follows its PID's digits, and
    MPICH's address exchange at MPI_Init aborted ("Message truncated") when the ranks' PIDs straddled a power of
    ten. The second half shows the test can tell: the same run with FI_PROVIDER=shm still fails that way."""
    out, pids, out_dir = _run_with_pids_across_a_power_of_ten({}, tmp_path / "hpctrain")
    assert out.returncode == 0, (pids, out.stderr[-3000:])
    assert sorted(p.read_text() for p in out_dir.glob("ok-*")) == ["3 tcp"] * 3

    try:
        out, pids, _ = _run_with_pids_across_a_power_of_ten({"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "shm"},
                                                             tmp_path / "shm")
    finally:
        _remove_dead_ranks_shm_segments()
    assert out.returncode != 0 and "truncated" in out.stderr, (pids, out.stderr[-3000:])


def test_wheel_settings_only_for_the_wheel_without_a_user_choice_loopback_on_one_node() -> None:
    from hpctrain.runtime.comm.mpi_env import ONE_NODE_WHEEL, SEVERAL_NODES_WHEEL, mpich_wheel_in_use, wheel_settings

    hydra = {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "PMI_RANK": "0", "PMI_SIZE": "2"}
    assert wheel_settings(hydra, wheel=True) == ONE_NODE_WHEEL
    assert wheel_settings(hydra, wheel=False) == {}
    assert wheel_settings({**hydra, "FI_PROVIDER": "tcp"}, wheel=True) == {}
    assert wheel_settings({**hydra, "FI_TCP_IFACE": "eth0"}, wheel=True) == {}
    assert wheel_settings({**hydra, "MPI4PY_LIBMPI": "/opt/site/libmpi.so"}, wheel=True) == {}
    two_nodes = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "0",
                 "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "2"}
    assert wheel_settings(two_nodes, wheel=True) == SEVERAL_NODES_WHEEL  # no UCX: see mpi_env's docstring
    assert "FI_TCP_IFACE" not in SEVERAL_NODES_WHEEL
    assert wheel_settings({**two_nodes, "UCX_TLS": "rc,sm"}, wheel=True) == {}
    assert wheel_settings({**two_nodes, "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_STEP_NUM_NODES": "1"},
                             wheel=True) == ONE_NODE_WHEEL
    assert mpich_wheel_in_use()  # this environment's mpi4py loads the wheel (setup.cfg's `local` extra)
    assert not mpich_wheel_in_use(prefix="/nonexistent")


@pytest.mark.processes
def test_no_gloo_thread_outlives_train(tmp_path: Path) -> None:
    """train() as `hpctrain run` runs it (model, optimizer, reducer, checkpoints), then close(): none of gloo's
    native threads may be left for interpreter shutdown, where they made a rank die in std::terminate (exit 134)
    once in a few full-suite runs. They were left before 2026-11-26: the trainer's first optimizer imported
    torch.distributed.nn.functional after the group existed, and its default arguments kept the group."""
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "threads", "model": "tests.mp_helpers.trainer_models:tiny", "model_args": {"seed": 0},
        "data": {"synthetic": {"input_shape": [6], "outputs": 2, "samples": 40}},
        "train": {"steps": 4, "batch_per_rank": 4, "lr": 0.05, "optimizer": {"name": "sgd", "momentum": 0.9},
                  "collective_timeout_s": 30, "seed": 3},
        "checkpoint": {"every_steps": 2, "keep": 2},
    }))
    argv = [PY, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", "2", "--",
            PY, WORKER, "train", str(spec), str(tmp_path / "run")]
    out = _run(argv, 300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    for r in (0, 1):
        assert f"rank {r}: trained to step 4; gloo threads left: []" in out.stdout, out.stdout[-3000:]


@pytest.mark.processes
def test_collectives_gloo_under_torchrun() -> None:
    argv = [TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), WORKER, "collectives", "gloo"]
    out = _run(argv, HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("gloo collectives OK") == 2


TIMEOUT_S = 4.0


@pytest.mark.mpi
def test_mpi_stuck_rank_aborts_job_and_is_named() -> None:
    # The stuck rank sleeps an hour: a job that ends, inside the hang guard, with the watchdog's message was
    # aborted by it (how soon is a timing, and the machine may be busy).
    out = _run([MPIEXEC, "-n", "3", PY, WORKER, "hang", "mpi", str(TIMEOUT_S), "2"], timeout=HANG_GUARD_S)
    assert out.returncode != 0
    assert "rank 2 did not arrive at collective #3 (allreduce, bucket 3) within 4 s" in out.stderr, out.stderr


@pytest.mark.processes
def test_gloo_stuck_rank_aborts_job_and_is_named() -> None:
    argv = [TORCHRUN, "--nproc-per-node", "3", "--master-port", str(free_port()), WORKER,
            "hang", "gloo", str(TIMEOUT_S), "2"]
    out = _run(argv, timeout=HANG_GUARD_S)
    assert out.returncode != 0
    assert "rank 2 did not arrive at collective #3 (allreduce, bucket 3) within 4 s" in out.stderr, out.stderr


@pytest.mark.mpi
def test_gloo_stuck_rank0_is_named_by_the_others() -> None:
    # Rank 0 hosts the TCPStore; its server thread still answers while rank 0's Python sleeps.
    out = _run([MPIEXEC, "-n", "3", PY, WORKER, "hang", "gloo", str(TIMEOUT_S), "0"], timeout=HANG_GUARD_S)
    assert out.returncode != 0
    assert "rank 0 did not arrive at collective #3" in out.stderr, out.stderr


def test_watchdog_fires_once_for_late_collective_and_not_for_done_ones() -> None:
    fired: list[Pending] = []
    wd = Watchdog(0.3, fired.append, tick_s=0.02)
    done = wd.arm(1, "allreduce", "bucket 0")
    wd.disarm(done)
    wd.arm(2, "allreduce", "bucket 1", is_done=lambda: True)  # completed but never waited
    late = wd.arm(3, "broadcast", "params")
    time.sleep(0.8)
    wd.close()
    assert [p.index for p in fired] == [3]
    assert fired[0] == late and fired[0].describe() == "collective #3 (broadcast, params)"


def test_watchdog_poll_runs_when_idle() -> None:
    calls = threading.Event()
    wd = Watchdog(10, lambda p: None, poll=calls.set, tick_s=0.02)
    assert calls.wait(2)
    wd.close()


def test_watchdog_close_waits_for_a_poll_in_progress() -> None:
    """A poll still inside a native call at interpreter shutdown can abort the process: close() lets it end."""
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow_poll() -> None:
        entered.set()
        release.wait(10)
        finished.set()

    wd = Watchdog(10, lambda p: None, poll=slow_poll, tick_s=0.02)
    assert entered.wait(5)
    threading.Timer(0.5, release.set).start()
    wd.close()
    assert finished.is_set() and not wd._thread.is_alive()


def test_watchdog_waits_longer_than_any_side_store_call() -> None:
    from hpctrain.runtime.comm.torch_dist import SIDE_STORE_TIMEOUT_S
    from hpctrain.runtime.comm.watchdog import CLOSE_WAIT_S

    assert CLOSE_WAIT_S > SIDE_STORE_TIMEOUT_S


def test_rendezvous_from_scheduler_nodelist_and_job_id() -> None:
    env = LaunchEnv(1, 4, 1, 2, 0, 2, "slurm")
    environ = {"SLURM_JOB_NODELIST": "nid[005-006]", "SLURM_JOB_ID": "777"}
    assert rendezvous_address(env, environ) == ("nid005", port_from_job_id("777"))
    assert 20000 <= port_from_job_id("777") < 60000 and port_from_job_id("777") != port_from_job_id("778")


def test_rendezvous_torchrun_master_addr_wins() -> None:
    env = LaunchEnv(0, 2, 0, 2, 0, 1, "torchrun", "host-a", 29500)
    assert rendezvous_address(env, {"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "1"}) == ("host-a", 29500)


def test_rendezvous_without_any_source_names_the_fix() -> None:
    with pytest.raises(RuntimeFailure, match="MASTER_ADDR and MASTER_PORT"):
        rendezvous_address(LaunchEnv(0, 2, 0, 2, 0, 1, "env"), {})


def test_make_communicator_rejects_unknown_and_mismatched_backends() -> None:
    with pytest.raises(ConfigError, match="unknown communication backend 'tcp'"):
        make_communicator("tcp", 10, environ={})
    with pytest.raises(ConfigError, match="started 2 ranks"):
        make_communicator("none", 10, environ={"MPI_LOCALRANKID": "0", "PMI_RANK": "0", "PMI_SIZE": "2"})


def test_single_process_communicator_and_gloo_size_one() -> None:
    c = make_communicator("none", 10, environ={})
    assert isinstance(c, SingleProcessCommunicator)
    t = torch.arange(4.0)
    c.allreduce_async_(t).wait()
    assert torch.equal(t, torch.arange(4.0)) and [x.tolist() for x in c.allgather(t)] == [t.tolist()]
    g = make_communicator("gloo", 10, environ={})  # size 1 rendezvous on localhost, real gloo
    try:
        assert (g.rank, g.size) == (0, 1)
        g.allreduce_(t, op="mean")
        assert torch.equal(t, torch.arange(4.0))
    finally:
        g.close()
