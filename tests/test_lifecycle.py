"""The run lifecycle as a user walks it, from fresh CLI processes: a run submitted with ``--site FILE`` outlives
the file, a cancel of an ended run sends nothing, requeues read as requeues, ``status --watch`` never cuts an
id and prints plain tables into a pipe, the same cause gives the same exit code everywhere, and dry runs say
where they put their files. On the ``local`` site (real local controller, real ranks) and, marked ``slurm``,
on the real single-node Slurm behind the loopback sshd.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from hpctrain.exit_codes import EXIT_CHECKPOINT, EXIT_CONFIG, EXIT_OK, EXIT_TRANSPORT
from hpctrain.submission.api import RunHandle, submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.run_record import META_FILE, RunMeta, record_dir
from hpctrain.submission.schedulers import local_controller
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.transport import LocalTransport, TransportPool
from tests.conftest import TinyJob
from tests.transport_record import as_recorded

REPO = Path(__file__).resolve().parent.parent
# Exits 75 (stopped at a checkpoint) in its first run; in the second it waits for the test to create
# `release` (so the test sees it running, however slow the machine), writes a metrics line and ends well:
# what a run that met its walltime once does. The restart counter is the scheduler's (Slurm) or the
# controller's (local).
REQUEUE_ONCE = ("if [ \"${SLURM_RESTART_COUNT:-${HPCTRAIN_RESTART_COUNT:-0}}\" -ge 1 ]; then "
                "for i in $(seq 600); do [ -e release ] && break; sleep 0.2; done; "
                "echo '{\"step\": 2, \"loss\": 0.5}' >> metrics.jsonl; exit 0; fi; exit 75")


@pytest.fixture
def env(isolated_home: Path, tiny_job: TinyJob) -> Path:
    """The test's own home with ``tiny.yaml``, whose run may be requeued twice."""
    tiny_job(checkpoint="{signal_lead_s: 10, max_requeues: 2}")
    return isolated_home


def cli(env: Path, *args: str, timeout: float = 90, extra_env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=env, env=environ, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def chain_of(run_id: str) -> list[tuple[str, str | None, int | None]]:
    with RunRegistry() as reg:
        return [(s.kind, s.state, s.exit_code) for s in reg.chain(run_id)]


# --- requeues -------------------------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_local_requeue_reads_as_restart_k_of_n(env: Path) -> None:
    with RunRegistry() as reg:
        run = submit_runs(env / "tiny.yaml", "local", command=["sh", "-c", REQUEUE_ONCE], registry=reg).runs[0]
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        view = RunHandle(run.run_id).status()
        seen.append(f"{view.state}: {view.reason}")
        if view.state == "running" and view.restart:
            Path(run.run_dir, "release").touch()
        if view.state == "completed":
            break
        time.sleep(0.3)
    assert "running: restart 1 of 2, after a checkpoint" in seen, seen
    assert seen[-1] == "completed: in restart 1 of 2", seen
    # The first entry of the chain ended (exit 75, requeued); it does not stay "running" with no exit code.
    assert chain_of(run.run_id) == [("submit", "requeued", 75), ("requeue", "completed", 0)]
    (listed,) = json.loads(cli(env, "runs", "--json").stdout)
    assert [(c["kind"], c["state"], c["exit_code"]) for c in listed["chain"]] == chain_of(run.run_id)
    assert listed["restart"] == 1 and listed["max_requeues"] == 2
    # `runs` makes no scheduler call, yet it knows how far the completed run got.
    assert listed["progress"] == {"step": 2, "total": 2, "loss": 0.5, "rate": None}


@pytest.mark.slurm
def test_a_slurm_requeue_is_not_waiting_for_a_start_time(env: Path, slurm: Any) -> None:
    """Between the two segments Slurm holds the requeued job PENDING (reason BeginTime, ~12 s here): the
    run says it was requeued and is waiting to start again, not that it waits for a start time someone set."""
    with RunRegistry() as reg:
        done = submit_runs(env / "tiny.yaml", "ci-slurm", command=["sh", "-c", REQUEUE_ONCE], registry=reg)
    run, job_id = done.runs[0], done.job_ids[0]
    pending: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        view = RunHandle(run.run_id).status()
        if view.state == "pending" and view.restart:
            pending.append(view.reason)
        if view.state == "running" and view.restart:
            assert view.reason == "restart 1 of 2, after a checkpoint", view
            Path(run.run_dir, "release").touch()
        if view.state == "completed":
            break
        time.sleep(0.5)
    assert view.state == "completed", view
    assert pending, "the requeued job was never seen pending"
    for reason in pending:
        assert reason.startswith("requeued after a checkpoint (restart 1 of 2), waiting to start again"), reason
        assert "requested start time" not in reason
    assert chain_of(run.run_id) == [("submit", "requeued", 75), ("requeue", "completed", 0)]
    status = cli(env, "status", run.run_id)
    assert "in restart 1 of 2" in status.stdout and job_id in status.stdout


# --- cancel -------------------------------------------------------------------------------------------------


@pytest.mark.processes
def test_cancel_of_an_ended_run_says_so_and_sends_nothing(env: Path) -> None:
    calls: list[list[str]] = []

    class Counting(LocalTransport):
        def run(self, argv: list[str], **kw: Any) -> Any:
            calls.append(as_recorded(argv, kw))
            return super().run(argv, **kw)

    with RunRegistry() as reg:
        run = submit_runs(env / "tiny.yaml", "local", command=["true"], registry=reg).runs[0]
    assert RunHandle(run.run_id).wait(timeout=60, poll_s=0.3).state == "completed"
    handle = RunHandle(run.run_id, pool=TransportPool(lambda r, c: Counting()))
    done = handle.cancel()
    assert not done.sent and done.state == "completed"
    assert not any("cancel" in word for argv in calls for word in argv)  # only the (batched) status poll ran
    out = cli(env, "cancel", run.run_id)
    assert out.returncode == EXIT_OK, out.stderr
    assert out.stdout.strip() == f"{run.run_id} had already ended (completed): nothing sent to job {done.job_id}"
    assert handle.run.state == "completed"  # not rewritten as cancelled


# --- a profile given as a file ------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_run_outlives_its_site_file_resume_status_cancel(env: Path) -> None:
    """Submitted with --site FILE, trained to a checkpoint, cancelled; the file is deleted; status, resume
    (from that checkpoint, with the real ranks) and cancel of the continuation still work."""
    site = env / "my-laptop.yaml"
    site.write_text((REPO / "site_configs/local.yaml").read_text().replace("name: local", "name: my-laptop"))
    spec = env / "long.yaml"
    spec.write_text("name: long\nmodel: resnet\nmodel_args: {channels: 4, blocks: 1}\n"
                    "train: {steps: 1000000, batch_per_rank: 4, lr: 0.01, log_every: 5}\n"
                    "resources: {nodes: 1, ranks_per_node: 1, walltime: '00:10:00'}\n"
                    "checkpoint: {every_steps: 5, keep: 2}\n")
    out = cli(env, "submit", str(spec), "--site", str(site))
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.split()[0]
    with RunRegistry() as reg:
        run_dir = Path(reg.get_run(run_id).run_dir)
    deadline = time.monotonic() + 150
    while not (run_dir / "checkpoints" / "manifest.json").is_file():
        assert time.monotonic() < deadline, (run_dir / "job.out").read_text()[-2000:]
        time.sleep(0.5)
    site.unlink()
    assert cli(env, "cancel", run_id).stdout.startswith(f"{run_id} cancelled job ")
    assert RunHandle(run_id).wait(timeout=90, poll_s=0.5).state == "cancelled"
    deadline = time.monotonic() + 60  # the supervisor ends once its ranks have (a continuation waits for that)
    while local_controller.status(run_dir).state == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.3)

    status = cli(env, "status", run_id, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)[0]["site"] == "my-laptop", status.stderr
    resumed = cli(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "continues from step" in resumed.stdout
    deadline = time.monotonic() + 150
    while "resumed from" not in (run_dir / "job.out").read_text():
        assert time.monotonic() < deadline, (run_dir / "job.out").read_text()[-2000:]
        time.sleep(0.5)
    cancelled = cli(env, "cancel", run_id)
    assert cancelled.returncode == 0 and "cancelled job" in cancelled.stdout, cancelled.stderr
    assert [kind for kind, _, _ in chain_of(run_id)] == ["submit", "resume"]


# --- exit codes ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.processes
def test_same_cause_same_exit_code_everywhere(env: Path, tmp_path: Path) -> None:
    for command in (["status", "nosuchrun"], ["logs", "nosuchrun"], ["cancel", "nosuchrun"],
                    ["resume", "nosuchrun"]):
        out = cli(env, *command)
        assert out.returncode == EXIT_CONFIG and "no run matches 'nosuchrun'" in out.stderr, (command, out.stderr)

    # A run on a login node that does not answer (nothing listens on the port its ssh config names).
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host deadhost\n  HostName 127.0.0.1\n  Port {_free_port()}\n  ConnectTimeout 5\n"
                          "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    with RunRegistry() as reg:
        run = reg.create_run("away", "ci-slurm", "h", "/tmp/away", remote="deadhost")
        reg.add_submission(run.run_id, "4242", "submit", ok=True)
        rec = record_dir(reg, run.run_id)
        rec.mkdir(parents=True)
        (rec / META_FILE).write_text(RunMeta("slurm", ssh_config=str(ssh_config)).to_json())
    for command in (["status", run.run_id], ["logs", run.run_id], ["cancel", run.run_id], ["resume", run.run_id]):
        out = cli(env, *command, extra_env={"XDG_CACHE_HOME": tempfile.mkdtemp(prefix="hlc", dir="/tmp")})
        assert out.returncode == EXIT_TRANSPORT, (command, out.stdout, out.stderr)
        assert "unreachable" in out.stdout + out.stderr, (command, out.stdout, out.stderr)

    # Nothing to resume: a run that never wrote a checkpoint.
    with RunRegistry() as reg:
        done = submit_runs(env / "tiny.yaml", "local", command=["true"], registry=reg).runs[0]
    RunHandle(done.run_id).wait(timeout=60, poll_s=0.3)
    out = cli(env, "resume", done.run_id)
    assert out.returncode == EXIT_CHECKPOINT and "has no checkpoint" in out.stderr, out.stderr


# --- status --watch -----------------------------------------------------------------------------------------


@pytest.fixture
def three_long_ids(env: Path) -> list[str]:
    """Three ended runs with array-task ids as long as real ones and reasons longer than a terminal line is
    wide (nothing to poll: they have ended)."""
    ids = [f"digits-20261123-1509-6f3a_{i}" for i in range(3)]
    reason = "rank 0: train.decay.steps: cosine decay needs a length >= 1 " + "(and more words) " * 6
    with RunRegistry() as reg:
        for i, run_id in enumerate(ids):
            run = reg.create_run("digits", "local", "h", f"/tmp/{run_id}", run_id=run_id)
            reg.add_submission(run.run_id, f"4{i}", "submit", ok=True)
            reg.update_states({f"4{i}": JobStatus(f"4{i}", JobState.FAILED, reason, exit_code=2)}, site="local")
    return ids


@pytest.mark.processes
def test_watch_into_a_pipe_prints_a_plain_table(env: Path, three_long_ids: list[str]) -> None:
    out = cli(env, "status", *three_long_ids, "--watch", extra_env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["RUN", "SITE", "JOB", "STATE", "PROGRESS", "REASON"]
    assert [ln.split()[0] for ln in lines[1:]] == three_long_ids
    assert "\x1b" not in out.stdout  # no terminal control sequences


def _in_terminal(argv: list[str], columns: int, cwd: Path) -> str:
    """Run ``argv`` with a pseudo-terminal of ``columns`` columns as its stdout; its output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    environ = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm"}
    environ.pop("COLUMNS", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=environ, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.processes
def test_watch_in_a_terminal_never_cuts_ids(env: Path, three_long_ids: list[str]) -> None:
    text = _in_terminal([sys.executable, "-m", "hpctrain", "status", *three_long_ids, "--watch"], 120, env)
    for run_id in three_long_ids:
        assert run_id in text, text


# --- dry runs -------------------------------------------------------------------------------------------------


@pytest.mark.processes
def test_dry_run_says_where_its_files_are(env: Path) -> None:
    out = cli(env, "submit", "tiny.yaml", "--site", "local", "--dry-run")
    assert out.returncode == 0, out.stderr
    folder = Path(out.stdout.split("are in ")[1].split("/,")[0])
    assert folder.parent == env / "home" / "dry-run"
    assert (folder / "job.sh").is_file() and (folder / "job.yaml").is_file()


# --- over ssh, on Slurm ---------------------------------------------------------------------------------------



@pytest.mark.slurm
def test_a_remote_run_outlives_its_site_file(env: Path, sshd: Any, slurm: Any, short_dir: Path) -> None:
    """Submitted over ssh with --site FILE; the file is deleted; status, cancel and resume still know the site
    (resume gets as far as the checkpoint check and suggests only files that exist here)."""
    site = env / "remote-copy.yaml"
    site.write_text((REPO / "site_configs/ci-slurm.yaml").read_text().replace("name: ci-slurm", "name: remote-copy")
                    + f"remote_root: {env / 'remote-runs'}\n")
    ssh = {"XDG_CACHE_HOME": str(short_dir)}
    out = cli(env, "submit", "tiny.yaml", "--site", str(site), "--remote", sshd.host, "--ssh-config",
              str(sshd.config), "--command", "true", "--wait", extra_env=ssh)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.split()[0]
    site.unlink()
    view = json.loads(cli(env, "status", run_id, "--json", extra_env=ssh).stdout)[0]
    assert (view["state"], view["site"], view["remote"]) == ("completed", "remote-copy", sshd.host)
    cancel = cli(env, "cancel", run_id, extra_env=ssh)
    assert cancel.returncode == 0 and "had already ended (completed)" in cancel.stdout, cancel.stderr
    resume = cli(env, "resume", run_id, extra_env=ssh)
    assert resume.returncode == EXIT_CHECKPOINT and "has no checkpoint" in resume.stderr, resume.stderr
    assert "no site profile" not in resume.stderr
    suggested = shlex.split(resume.stderr.split("start it afresh: ")[1].rstrip(")\n"))
    assert Path(suggested[2]).is_file() and Path(suggested[4]).is_file()  # the staged spec and profile
    assert suggested[5:] == ["--remote", sshd.host]
