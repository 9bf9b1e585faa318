"""Laptop-style submitit: callables sent over the loopback sshd (fixture ``sshd``) to the real Slurm behind it.

On this box laptop and cluster are one machine, so the executor's folder (the "laptop") and the run root (the
"cluster") are different directories, and the test hides the folder while the job runs: the job must not
need it. Results and logs come back over the one ssh master, on demand. The job's Python is chosen with
``hpctrain_python``; one without submitit still runs plain callables, and what it lacks for others is one
clear error before anything queues.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
import submitit_support
from submitit_support import Places, Resumable, add, wait_then_look

from hpctrain.errors import ConfigError
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.transport import Completed, SSHTransport, TransportPool

cloudpickle.register_pickle_by_value(submitit_support)
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = [pytest.mark.slurm, pytest.mark.sshd, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parent.parent


class CountingSSH(SSHTransport):
    """The real SSHTransport, recording the commands it runs on the login node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **kwargs: Any) -> Completed:
        self.calls.append(argv)
        return super().run(argv, **kwargs)


@pytest.fixture
def ssh_pool() -> Iterator[tuple[TransportPool, list[CountingSSH]]]:
    control = Path(tempfile.mkdtemp(prefix="hsm", dir="/tmp"))  # ControlPath sockets need a short path
    made: list[CountingSSH] = []

    def factory(remote: str | None, cfg: str | None) -> CountingSSH:
        assert remote is not None, "a command ran on the laptop instead of the login node"
        made.append(CountingSSH(remote, ssh_config=cfg, control_dir=str(control), connect_timeout=5))
        return made[-1]

    pool = TransportPool(factory)
    yield pool, made
    pool.close(stop_masters=True)
    shutil.rmtree(control, ignore_errors=True)


def _executor(places: Places, sshd: Any, slurm: Any, pool: TransportPool, python: str) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site="ci-slurm", hpctrain_remote=sshd.host,
                               hpctrain_ssh_config=str(sshd.config), hpctrain_run_root=str(places.runs),
                               hpctrain_python=python, hpctrain_pool=pool)
    ex.update_parameters(timeout_min=10, mem_gb=0.1, hpctrain_queue=submitit_support.slurm_queue(slurm.partition))
    return ex


def test_over_ssh_the_job_never_reads_the_laptop_folder(places: Places, sshd: Any, slurm: Any,
                                                         ssh_pool: tuple[TransportPool, list[CountingSSH]]) -> None:
    pool, made = ssh_pool
    go = places.root / "go"
    ex = _executor(places, sshd, slurm, pool, sys.executable)
    job = ex.submit(wait_then_look, str(go), str(places.folder))
    # The callable waits for `go`: hide the laptop folder before it looks, and keep it hidden to the end.
    away = places.folder.with_name("hidden-while-the-job-runs")
    places.folder.rename(away)
    go.touch()
    slurm.wait_for_state(job.job_id, ["COMPLETED"], timeout=180)
    away.rename(places.folder)
    result = job.result()
    assert result["sees_folder"] is False
    assert Path(result["cwd"]).parent == places.runs
    assert {"submitted.pkl", "job.sh", "job.yaml"} <= set(result["files"])
    assert not (places.folder / f"{job.job_id}_0_log.out").exists()  # logs come only when asked for
    assert "hpctrain submitit runner: task 0" in (job.stderr() or "")
    assert (places.folder / f"{job.job_id}_0_log.err").is_file()
    with RunRegistry() as reg:
        run = reg.get_run(job.run_id)
    assert run.remote == sshd.host
    assert str(places.folder) not in Path(run.run_dir, "job.sh").read_text()
    # Everything went through one ssh master: submit, probe, polls, result and log fetches.
    (ssh,) = made
    assert any(argv[:3] == ["env", "-C", str(Path(run.run_dir))] for argv in ssh.calls)
    assert ex.submit(add, 1, 2).result() == 3 and len(made) == 1


def _bare_python(directory: Path, with_cloudpickle: bool) -> str:
    """An interpreter of this Python version that sees hpctrain's source and nothing installed (``-S``), plus
    a copy of cloudpickle when asked: a cluster where hpctrain's base install is all there is."""
    site = directory / "site"
    site.mkdir(parents=True)
    if with_cloudpickle:
        shutil.copytree(Path(cloudpickle.__file__).parent, site / "cloudpickle")
    wrapper = directory / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}:{site}" exec "{sys._base_executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_job_python_without_submitit(places: Places, sshd: Any, slurm: Any,
                                       ssh_pool: tuple[TransportPool, list[CountingSSH]]) -> None:
    pool, made = ssh_pool
    python = _bare_python(places.root / "bare", with_cloudpickle=True)
    ex = _executor(places, sshd, slurm, pool, python)
    # A plain callable needs only the runner and cloudpickle there.
    job = ex.submit(add, 40, 2)
    assert job.result() == 42
    assert f"with {sys._base_executable}" in (job.stderr() or "")
    # A Checkpointable needs submitit there: refused before it queues, naming what to install.
    with pytest.raises(ConfigError, match=rf"{python} on {sshd.host} cannot import submitit, which the callable "
                                          r"submitit_support\.Resumable needs") as info:
        ex.submit(Resumable(str(places.root / "marker")))
    assert "pip install 'submitit>=1.5,<1.6'" in str(info.value)
    bare = _bare_python(places.root / "barer", with_cloudpickle=False)
    ex.update_parameters(hpctrain_python=bare)
    with pytest.raises(ConfigError, match=rf"{bare} on {sshd.host} cannot import cloudpickle") as info:
        ex.submit(add, 1, 1)
    assert "pip install cloudpickle" in str(info.value)
    with RunRegistry() as reg:
        assert [r.run_id for r in reg.list_runs()] == [job.run_id]  # nothing else was registered
    assert len(made) == 1
