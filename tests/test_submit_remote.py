"""Laptop-style submission: the real sshd on 127.0.0.1 (fixture ``sshd``) in front of the real Slurm.

Submit through ssh, watch to COMPLETED, fetch logs, cancel another run — all over ONE ControlMaster
connection (same master pid throughout, one login in sshd's log for its client port) — plus the CLI from
fresh processes and the failures (unreachable host, sbatch missing on the login node) recorded as failed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.job import load_job
from hpctrain.config.site import load_site_file
from hpctrain.errors import TransportError
from hpctrain.submission.api import cancel_run, read_log, submit_runs
from hpctrain.submission.module_probe import MARKER
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import SUBMIT_FAILED
from hpctrain.submission.tracking import poll_runs
from hpctrain.submission.transport import Completed, SSHTransport, TransportPool
from tests.conftest import TinyJob
from tests.transport_record import as_recorded

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parent.parent
HELLO = ["sh", "-c", "echo remote hello; echo '{\"step\": 2, \"loss\": 0.5}' > metrics.jsonl"]


class CountingSSH(SSHTransport):
    """The real SSHTransport, counting commands; ``path`` runs them with a reduced PATH on the login node."""

    def __init__(self, *a: Any, path: str | None = None, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.calls: list[list[str]] = []
        self.path = path

    def run(self, argv: list[str], **kw: Any) -> Completed:
        self.calls.append(as_recorded(argv, kw))
        return super().run(["env", f"PATH={self.path}", *argv] if self.path else argv, **kw)



@pytest.fixture
def env(isolated_home: Path, tiny_job: TinyJob) -> Path:
    tiny_job()
    return isolated_home


def _master_pid(t: SSHTransport) -> str:
    check = subprocess.run(t.ssh_argv(None, "-O", "check"), capture_output=True, text=True, timeout=10)
    m = re.search(r"pid=(\d+)", check.stderr)
    assert m, check.stderr
    return m.group(1)


def test_submit_watch_logs_cancel_over_one_master(env: Path, sshd: Any, slurm: Any, short_dir: Path) -> None:
    made: list[CountingSSH] = []

    def factory(remote: str | None, cfg: str | None) -> CountingSSH:
        made.append(CountingSSH(remote, ssh_config=cfg, control_dir=str(short_dir), connect_timeout=5))
        return made[-1]

    pool = TransportPool(factory)
    root = str(env / "remote-runs")
    since = sshd.log_offset()
    with RunRegistry() as reg:
        a = submit_runs(env / "tiny.yaml", "ci-slurm", remote=sshd.host, ssh_config=str(sshd.config),
                        run_root=root, command=HELLO, registry=reg, pool=pool)
        (ssh,) = made
        master = _master_pid(ssh)
        b = submit_runs(env / "tiny.yaml", "ci-slurm", remote=sshd.host, ssh_config=str(sshd.config),
                        run_root=root, command=["sleep", "60"], registry=reg, pool=pool)
        run_a, run_b = a.runs[0], b.runs[0]
        assert Path(run_a.run_dir, "job.sh").is_file() and Path(run_a.run_dir, "job.yaml").is_file()

        deadline = time.monotonic() + 60
        while True:
            before = len(ssh.calls)
            views = {v.run_id: v for v in poll_runs(reg, [run_a, run_b], pool)}
            assert len(ssh.calls) == before + 1  # one ssh round trip per poll for both runs + metrics
            if views[run_a.run_id].state == "completed" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert views[run_a.run_id].state == "completed"
        assert views[run_a.run_id].progress is not None and views[run_a.run_id].progress.step == 2
        assert "remote hello" in read_log(reg, reg.get_run(run_a.run_id), pool)

        slurm.wait_for_state(b.job_ids[0], ["RUNNING"])
        cancel_run(reg, reg.get_run(run_b.run_id), pool)
        slurm.wait_for_state(b.job_ids[0], ["CANCELLED"])
        assert reg.get_run(run_b.run_id).state == "cancelled"

    assert len(made) == 1 and _master_pid(ssh) == master  # the same master served every command
    port = ssh.run(["sh", "-c", 'echo "$SSH_CONNECTION"'], timeout=30).stdout.split()[1]
    assert sshd.logins(port, since) == 1  # one login for the whole session
    ssh.close()


def _cli(env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "HPCTRAIN_HOME": str(env / "home"), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=env, env=environ, capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL)


def test_cli_over_ssh_reattaches_from_fresh_processes(env: Path, sshd: Any, slurm: Any) -> None:
    out = _cli(env, "submit", "tiny.yaml", "--site", "ci-slurm", "--remote", sshd.host, "--ssh-config",
               str(sshd.config), "--run-root", str(env / "remote-runs"), "--command", "echo cli hello", "--wait")
    assert out.returncode == 0, out.stderr
    run_id, job_id = out.stdout.splitlines()[0].split()
    assert out.stdout.splitlines()[1] == f"{run_id} completed"
    # A later process ("after a reboot") knows the run only from the registry and submit.json.
    view = json.loads(_cli(env, "status", run_id, "--json").stdout)[0]
    assert (view["state"], view["job_id"], view["remote"]) == ("completed", job_id, sshd.host)
    assert "cli hello" in _cli(env, "logs", run_id).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_host_is_recorded_as_failed(env: Path, short_dir: Path) -> None:
    port = _free_port()
    pool = TransportPool(lambda r, c: SSHTransport(r, ssh_config="/dev/null", control_dir=str(short_dir),
                                                   connect_timeout=5, extra_opts=("-o", f"Port={port}")))
    with RunRegistry() as reg:
        with pytest.raises(TransportError, match="unreachable"):
            submit_runs(env / "tiny.yaml", "ci-slurm", remote="root@127.0.0.1", run_root="/tmp/nowhere",
                        command=["true"], registry=reg, pool=pool)
        (run,) = reg.list_runs()
        assert run.state == SUBMIT_FAILED and "unreachable" in run.state_reason
        assert not reg.chain(run.run_id)[0].ok


def test_sbatch_missing_on_login_node_is_recorded_as_failed(env: Path, sshd: Any, short_dir: Path) -> None:
    shim = env / "bin"
    shim.mkdir()
    for tool in ["sh", "env", "cat", "mv", "mkdir", "rm"]:
        (shim / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    pool = TransportPool(lambda r, c: CountingSSH(r, ssh_config=c, control_dir=str(short_dir), connect_timeout=5,
                                                  path=str(shim)))
    with RunRegistry() as reg:
        with pytest.raises(TransportError, match=f"not found on {sshd.host}"):
            submit_runs(env / "tiny.yaml", "ci-slurm", remote=sshd.host, ssh_config=str(sshd.config),
                        run_root=str(env / "r"), command=["true"], registry=reg, pool=pool)
        (run,) = reg.list_runs()
        assert run.state == SUBMIT_FAILED and "Slurm module" in run.state_reason
    pool.close(stop_masters=True)


def test_an_interpreter_without_hpctrain_is_refused_before_anything_is_queued(env: Path, sshd: Any, slurm: Any,
                                                                              short_dir: Path) -> None:
    """ci-slurm sets no environment.venv: its jobs start the login node's python3, which has no hpctrain. submit
    --remote asks that interpreter, after the profile's environment setup, over the submission's ssh master and
    refuses before anything is registered or queued. An interpreter that has hpctrain is asked once per login
    node: the next submissions (fresh processes, fresh masters) read the cached answer until it expires."""
    from hpctrain.errors import ConfigError

    made: list[CountingSSH] = []

    def pool() -> TransportPool:
        def factory(remote: str | None, cfg: str | None) -> CountingSSH:
            made.append(CountingSSH(remote, ssh_config=cfg, control_dir=str(short_dir), connect_timeout=5))
            return made[-1]
        return TransportPool(factory)

    def probes(ssh: CountingSSH) -> int:
        return sum(1 for argv in ssh.calls if argv[:2] == ["bash", "-c"] and MARKER in argv[2])

    root = env / "remote-runs"
    with RunRegistry() as reg:
        with pytest.raises(ConfigError) as err:
            submit_runs(env / "tiny.yaml", "ci-slurm", remote=sshd.host, ssh_config=str(sshd.config),
                        run_root=str(root), registry=reg, pool=pool())
        assert err.value.key == "environment.venv"
        assert f"the job's interpreter python3 on {sshd.host} cannot import hpctrain" in str(err.value)
        assert "set environment.venv in site 'ci-slurm'" in str(err.value)
        assert reg.list_runs() == [] and not root.exists()
        assert probes(made[0]) == 1 and not any("sbatch" in " ".join(argv) for argv in made[0].calls)
    out = _cli(env, "submit", "tiny.yaml", "--site", "ci-slurm", "--remote", sshd.host, "--ssh-config",
               str(sshd.config), "--run-root", str(root))
    assert out.returncode == 2 and "hpctrain: error: environment.venv: the job's interpreter python3" in out.stderr
    assert "Traceback" not in out.stderr and not root.exists()

    venv = Path(sys.executable).parent.parent  # this test's venv: hpctrain and its training stack
    (env / "good.yaml").write_text(f"name: good\nextends: ci-slurm\nenvironment: {{venv: {venv}}}\n")
    for expected_probes in (1, 0):
        with RunRegistry() as reg:
            done = submit_runs(env / "tiny.yaml", str(env / "good.yaml"), remote=sshd.host,
                               ssh_config=str(sshd.config), run_root=str(root), registry=reg, pool=pool(),
                               dry_run=True)
        assert done.dry_run and "sbatch: Job" in done.message, done.message
        assert probes(made[-1]) == expected_probes
    from hpctrain.submission.interpreter import CACHE_TTL_S, cache_path, check_interpreter

    assert cache_path() == env / "home" / "cache" / "interpreters.json" and cache_path().is_file()
    job, site = load_job(env / "tiny.yaml"), load_site_file(env / "good.yaml")
    ssh = pool().get(sshd.host, str(sshd.config))
    assert check_interpreter(ssh, job, site) is False  # cached
    assert check_interpreter(ssh, job, site, now=time.time() + CACHE_TTL_S + 1) is True  # expired: asked again
    # The environment lines run as the batch script runs them (set -e): a line that fails there fails here.
    (env / "mod.yaml").write_text(f"name: mod\nextends: ci-slurm\nenvironment: {{venv: {venv}, modules: [nosuch]}}\n")
    with pytest.raises(ConfigError) as err:
        check_interpreter(ssh, job, load_site_file(env / "mod.yaml"))
    assert f"the job's interpreter {venv}/bin/python on {sshd.host} did not run after the environment setup of " \
           "site 'mod' (exit status 127: " in str(err.value) and "module: command not found" in str(err.value)
    for t in made:
        t.close()
