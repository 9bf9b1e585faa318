"""Proof that the test infrastructure is real: the single-node Slurm (sbatch/srun/sacct -c/requeue) with its
accounting (slurmdbd over MariaDB: sacctmgr, sacct, enforced QOS limits), the Torque wrappers (qsub on Slurm),
the loopback sshd with ControlMaster, and the MPICH wheel's mpiexec.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import SlurmCluster, SshLogin


def run(argv: list[str], cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def wait_for_text(path: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in (content := path.read_text()):
            return content
        time.sleep(0.3)
    content = path.read_text() if path.exists() else "(missing)"
    pytest.fail(f"{text!r} not in {path} after {timeout} s: {content}")


@pytest.fixture(scope="module")
def two_task_job(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("two_task") / "out.txt"
    job_id = slurm.sbatch("-n", "2", "-J", "infra-two", "-o", str(out), "--wrap", "srun -n 2 hostname")
    slurm.wait_for_state(job_id, ["COMPLETED"], timeout=60)
    return job_id, out


@pytest.mark.slurm
def test_sinfo_shows_node_up_in_debug_partition(slurm: SlurmCluster) -> None:
    out = run(["sinfo", "-h", "-N", "-o", "%N %P %t %c"])
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    debug = [r for r in rows if r[0] == slurm.node and r[1].rstrip("*") == "debug"]
    assert debug, out.stdout
    # Other tests may be running jobs at the same time: idle, mixed or allocated all mean "up".
    assert debug[0][2] in {"idle", "mix", "alloc"}, out.stdout
    assert int(debug[0][3]) == slurm.cpus >= 4
    assert slurm.partition == "debug"


@pytest.mark.slurm
def test_slurm_conf_holds_only_settings_and_comments(slurm: SlurmCluster) -> None:
    """The config is written from a shell heredoc: nothing from a command substitution (a stray backtick
    once pasted `sacct -c` output into it) may end up in the file every Slurm client parses."""
    conf = Path("/etc/slurm/slurm.conf")
    lines = [ln for ln in conf.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    odd = [ln for ln in lines if "=" not in ln.split()[0]]
    assert not odd, f"lines that are not Key=Value in {conf}: {odd[:3]}"
    assert sum(ln.startswith("ClusterName=") for ln in lines) == 1


@pytest.mark.slurm
def test_sbatch_two_tasks_runs_srun_twice(two_task_job: tuple[int, Path]) -> None:
    _, out = two_task_job
    lines = out.read_text().split()
    assert len(lines) == 2, out.read_text()
    assert lines[0] == lines[1]  # same (only) node


@pytest.mark.slurm
def test_sacct_c_reports_finished_jobs(slurm: SlurmCluster, two_task_job: tuple[int, Path],
                                       tmp_path: Path) -> None:
    job_id, _ = two_task_job
    out = run(["sacct", "-c", "-j", str(job_id), "-n", "-P", "-o", "JobID,State,ExitCode"])
    assert out.returncode == 0, out.stderr
    assert f"{job_id}|COMPLETED|0:0" in out.stdout.splitlines(), out.stdout

    failing = slurm.sbatch("-n", "1", "-o", str(tmp_path / "fail.txt"), "--wrap", "exit 3")
    slurm.wait_for_state(failing, ["FAILED"], timeout=60)
    out = run(["sacct", "-c", "-j", str(failing), "-n", "-P", "-o", "JobID,State,ExitCode"])
    assert f"{failing}|FAILED|3:0" in out.stdout.splitlines(), out.stdout


@pytest.mark.slurm
def test_slurmdbd_answers_and_slurmctld_enforces_its_limits(slurm: SlurmCluster,
                                                           two_task_job: tuple[int, Path]) -> None:
    """slurmdbd knows the cluster and root's association, slurmctld enforces QOS limits from it, and sacct (not
    only sacct -c) reports a finished job, as one record: job ids are not reused across restarts."""
    clusters = run(["sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster"])
    assert clusters.returncode == 0, clusters.stderr
    assert "hpctrain" in clusters.stdout.split()
    assoc = run(["sacctmgr", "-n", "-P", "show", "assoc", "user=root", "format=Cluster,Account,User"])
    assert "hpctrain|root|root" in assoc.stdout.splitlines(), assoc.stdout
    config = run(["scontrol", "show", "config"]).stdout
    values = {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in config.splitlines())}
    assert values["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert "limits" in values["AccountingStorageEnforce"].split(","), values["AccountingStorageEnforce"]
    job_id, _ = two_task_job
    out = run(["sacct", "-D", "-X", "-j", str(job_id), "-n", "-P", "-o", "JobID,State,ExitCode"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{job_id}|COMPLETED|0:0"], out.stdout


@pytest.mark.slurm
def test_sbatch_test_only_refuses_impossible_node_count(slurm: SlurmCluster) -> None:
    ok = run(["sbatch", "--test-only", "-p", slurm.partition, "-N", "1", "--wrap", "true"])
    assert ok.returncode == 0, ok.stderr
    assert "to start at" in ok.stderr
    bad = run(["sbatch", "--test-only", "-p", slurm.partition, "-N", "5", "--wrap", "true"])
    assert bad.returncode != 0
    assert "node configuration is not available" in bad.stderr or "Node count" in bad.stderr, bad.stderr


@pytest.mark.slurm
def test_more_ranks_than_cores_fit_on_the_node(slurm: SlurmCluster) -> None:
    # 4 ranks on a 2-core box are accepted without flags: the node declares more CPUs than it has
    # (see scripts/ci/slurm.sh).  Beyond the declared CPUs only --overcommit helps, not --oversubscribe.
    def test_only(*args: str) -> subprocess.CompletedProcess[str]:
        return run(["sbatch", "--test-only", "-p", slurm.partition, *args, "--wrap", "true"])

    assert test_only("-n", "4").returncode == 0
    too_many = str(slurm.cpus + 1)
    assert test_only("-n", too_many).returncode != 0
    assert test_only("-n", too_many, "--oversubscribe").returncode != 0
    assert test_only("-n", too_many, "--overcommit").returncode == 0


@pytest.mark.slurm
@pytest.mark.timeout(90)
def test_requeue_brings_job_back_with_restart_count(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "requeue.txt"
    script = tmp_path / "requeue.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "restart=${SLURM_RESTART_COUNT:-0}"\n'
        'if [[ ${SLURM_RESTART_COUNT:-0} == 0 ]]; then sleep 120; fi\n'
    )
    job_id = slurm.sbatch("-n", "1", "-J", "infra-requeue", "--requeue", "--open-mode=append",
                          "-o", str(out), str(script))
    slurm.wait_for_state(job_id, ["RUNNING"], timeout=30)
    wait_for_text(out, "restart=0", timeout=15)
    req = run(["scontrol", "requeue", str(job_id)])
    assert req.returncode == 0, req.stderr
    # AuthInfo=cred_expire=10 makes the job eligible again after ~12 s instead of ~121 s.
    slurm.wait_for_state(job_id, ["COMPLETED"], timeout=40)
    runs = [line for line in out.read_text().splitlines() if line.startswith("restart=")]
    assert runs == ["restart=0", "restart=1"], out.read_text()
    assert "DUE TO JOB REQUEUE" in out.read_text()


@pytest.mark.slurm
def test_qsub_runs_pbs_script_on_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    # slurm-wlm-torque maps -N, nodes/ppn and walltime; it ignores `#PBS -o/-j` and writes
    # <script>.o<id> in the submit directory.
    script = tmp_path / "pbs_job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#PBS -N infra-pbs\n"
        "#PBS -l nodes=1:ppn=2,walltime=00:05:00\n"
        'echo "pbs name=$SLURM_JOB_NAME ntasks=$SLURM_NTASKS"\n'
    )
    sub = run(["qsub", str(script)], cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job_id = int(sub.stdout.strip().split(".")[0])
    show = run(["scontrol", "show", "job", str(job_id)])
    assert "TimeLimit=00:05:00" in show.stdout, show.stdout
    slurm.wait_for_state(job_id, ["COMPLETED"], timeout=60)
    assert (tmp_path / f"pbs_job.sh.o{job_id}").read_text().strip() == "pbs name=infra-pbs ntasks=2"
    qstat = run(["qstat", str(job_id)])
    assert "infra-pbs" in qstat.stdout, qstat.stdout + qstat.stderr


@pytest.mark.sshd
def test_ssh_login_and_control_master(sshd: SshLogin) -> None:
    # ControlPath must stay under ~100 bytes (Unix socket limit): pytest's tmp_path is too long for it.
    with tempfile.TemporaryDirectory(prefix="cm", dir="/tmp") as short:
        control = ["-o", "ControlMaster=auto", "-o", f"ControlPath={short}/%C", "-o", "ControlPersist=60"]
        first = run(sshd.argv("echo", "ok", options=control), timeout=30)
        assert first.returncode == 0, first.stderr
        assert first.stdout == "ok\n"
        try:
            check = run(sshd.argv(options=[*control, "-O", "check"]), timeout=10)
            assert check.returncode == 0, check.stderr
            assert "Master running" in check.stderr
            second = run(sshd.argv("echo $SSH_CONNECTION", options=control), timeout=30)
            assert second.returncode == 0, second.stderr
            assert second.stdout.split()[2:] == ["127.0.0.1", str(sshd.port)], second.stdout
        finally:
            run(sshd.argv(options=[*control, "-O", "exit"]), timeout=10)


def plain_ssh(sshd: SshLogin, key: Path, known_hosts: Path) -> list[str]:
    """ssh to the loopback sshd without the generated config (-F /dev/null), with this key/known hosts."""
    return ["ssh", "-F", "/dev/null", "-p", str(sshd.port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"IdentityFile={key}", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "GlobalKnownHostsFile=/dev/null", "root@127.0.0.1"]


@pytest.mark.sshd
def test_sshd_accepts_only_its_key_and_host_key(sshd: SshLogin, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)])
    ok = run([*plain_ssh(sshd, sshd.key, sshd.known_hosts), "echo", "ok"], timeout=30)
    assert (ok.returncode, ok.stdout) == (0, "ok\n"), ok.stderr

    denied = run([*plain_ssh(sshd, other, sshd.known_hosts), "true"], timeout=30)
    assert denied.returncode == 255
    assert "Permission denied" in denied.stderr

    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    fake_known = tmp_path / "known_hosts"
    fake_known.write_text(f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n")
    mismatch = run([*plain_ssh(sshd, sshd.key, fake_known), "true"], timeout=30)
    assert mismatch.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in mismatch.stderr, mismatch.stderr


@pytest.mark.mpi
def test_mpiexec_runs_two_ranks(venv_bin: Path) -> None:
    # Rank 0 prints what it gathered: two ranks printing at once may interleave within a line.
    code = (
        "from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "g = c.gather((c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1)), root=0); "
        "g and print(g)"
    )
    out = run([str(venv_bin / "mpiexec"), "-n", "2", str(venv_bin / "python"), "-c", code], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(0, 2, 3), (1, 2, 3)]", out.stdout


@pytest.mark.mpi
@pytest.mark.slurm
def test_srun_pmi2_starts_mpi4py_ranks(slurm: SlurmCluster, venv_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "mpi.txt"
    py = venv_bin / "python"
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; g = c.gather(c.Get_size()); g and print(g)"
    cmd = f"srun --mpi=pmi2 -n 2 {shlex.quote(str(py))} -c {shlex.quote(code)}"
    job_id = slurm.sbatch("-n", "2", "-J", "infra-mpi", "-o", str(out), "--wrap", cmd)
    slurm.wait_for_state(job_id, ["COMPLETED"], timeout=90)
    assert out.read_text().strip() == "[2, 2]", out.read_text()
