"""`sites discover` reads queue policies and `--check` reports drift: Slurm partition limits on the real local Slurm
(a partition the test creates), Slurm QOS limits and PBS policies from hand-written command output (the local Slurm
runs without slurmdbd, so sacctmgr lists no QOS; no PBS server runs here); and a job stopped at its checkpoint in a
queue that forbids chaining, as `status` shows it."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.site import load_site, load_site_file
from hpctrain.errors import FitError
from hpctrain.submission.discovery import compare_profile, discover, draft_profile, findings_from, write_profile
from hpctrain.submission.discovery.probe import Probe, Section
from hpctrain.submission.discovery.slurm import read_qos
from hpctrain.submission.transport import LocalTransport

TINY = """name: tiny-policy
model: resnet
train: {steps: 2, batch_per_rank: 2, lr: 0.01}
resources: {nodes: 1, ranks_per_node: 1, walltime: "00:05:00"}
checkpoint: {signal_lead_s: 10}
"""


def probe_of(programs: list[str], **answers: str) -> Probe:
    sections = {
        "host": Section("login1.example.org"), "user": Section("alice"), "cpus": Section("32"),
        "memory": Section(str(64 * 2 ** 20)), "end": Section(), "variables": Section(""),
        "programs": Section("\n".join(f"{p} /usr/bin/{p}" for p in programs)),
    }
    sections.update({name: Section(text, "", 0) for name, text in answers.items()})
    return Probe(sections)


# ---------------------------------------------------------------------------------------------------------
# Hand-written scheduler output (layouts from the sacctmgr and qstat man pages; values made up for the test)

SACCTMGR_QOS = """\
normal||||||
debug|02:00:00||node=8|1|1
big|12:00:00|node=4000||||
"""

PARTITIONS = ("PartitionName=batch AllowGroups=ALL Default=YES QoS=N/A MaxNodes=UNLIMITED MaxTime=12:00:00 MinNodes=1 "
              "Nodes=n[1-100] State=UP TotalCPUs=6400 TotalNodes=100\n"
              "PartitionName=short AllowGroups=ALL Default=NO QoS=debug MaxNodes=UNLIMITED MaxTime=1-00:00:00 "
              "MinNodes=2 Nodes=n[1-100] State=UP TotalCPUs=6400 TotalNodes=100\n")

QSTAT_QF = """\
Queue: debug
    queue_type = Execution
    resources_max.nodect = 2
    resources_max.walltime = 01:00:00
    resources_min.walltime = 00:05:00
    max_queued = [u:PBS_GENERIC=1]
    max_run = [u:PBS_GENERIC=1]
    enabled = True
    started = True

Queue: prod
    queue_type = Route
    route_destinations = tiny,small,other@elsewhere
    enabled = True
    started = True

Queue: tiny
    queue_type = Execution
    from_route_only = True
    resources_max.nodect = 512
    resources_max.walltime = 06:00:00
    resources_min.nodect = 1
    max_run_res.nodect = [u:PBS_GENERIC=1024]
    enabled = True
    started = True

Queue: small
    queue_type = Execution
    from_route_only = True
    resources_max.nodect = 1024
    resources_max.walltime = 12:00:00
    resources_min.nodect = 513
    max_user_run = 4
    enabled = True
    started = True
"""


def test_slurm_qos_limits_bind_the_partition_that_names_them() -> None:
    qos = read_qos(SACCTMGR_QOS)
    assert qos["debug"].max_walltime_s.value == 7200 and qos["debug"].max_nodes_per_user.value == 8
    assert qos["debug"].max_running_per_user.value == 1 and qos["debug"].max_queued_per_user.value == 1
    assert qos["big"].max_nodes.value == 4000 and qos["normal"].max_walltime_s is None
    f = findings_from(probe_of(["sinfo", "scontrol", "sacctmgr"], slurm_partitions=PARTITIONS,
                               slurm_qos=SACCTMGR_QOS))
    short = f.scheduler.queues["short"]
    assert short.max_walltime_s.value == 7200 and "MaxWall=02:00:00" in short.max_walltime_s.source
    assert short.max_queued_per_user.value == 1 and short.min_nodes.value == 2
    assert f.scheduler.queues["batch"].max_queued_per_user is None
    draft = draft_profile(f, name="qos-site")
    assert draft.profile.queues["short"].max_queued_per_user == 1
    assert any("Slurm QOS 'big' sets MaxWall=12:00:00, MaxTRES=node=4000" in n for n in draft.notes)


def test_check_reports_a_qos_limit_the_profile_lacks(tmp_path: Path) -> None:
    """A queue that submits with a QOS (Frontier's debug) meets the QOS's MaxWall and per-user limits."""
    f = findings_from(probe_of(["sinfo", "scontrol", "sacctmgr"], slurm_partitions=PARTITIONS,
                               slurm_qos=SACCTMGR_QOS))
    path = tmp_path / "mine.yaml"
    path.write_text(textwrap.dedent("""\
        name: mine
        scheduler: slurm
        launcher: srun
        node: {cores: 64, memory_gb: 256}
        default_queue: batch
        queues:
          batch: {max_nodes: 100, max_walltime: "12:00:00"}
          debug: {submit_as: batch, qos: debug, max_nodes: 100, max_walltime: "04:00:00"}
          short: {max_nodes: 100, min_nodes: 2, max_walltime: "02:00:00"}
        """))
    keys = {d.key: d for d in compare_profile(load_site_file(path), f).differences}
    assert keys["queues.debug.max_walltime"].machine == "02:00:00"
    assert keys["queues.debug.max_queued_per_user"].profile == "none"
    assert keys["queues.debug.max_queued_per_user"].machine == "1"
    assert "MaxSubmitPU=1" in keys["queues.debug.max_queued_per_user"].source
    assert "queues.short.max_walltime" not in keys and "queues.short.max_running_per_user" in keys
    assert "queues.batch.max_walltime" not in keys


def test_pbs_routing_queues_and_per_user_limits() -> None:
    """Parsed from hand-written `qstat -Q -f` text (no PBS server runs here)."""
    f = findings_from(probe_of(["qstat", "qsub", "pbsnodes"], pbs_queues=QSTAT_QF))
    q = f.scheduler.queues
    assert q["prod"].routes_to.value == ["tiny", "small"]  # other@elsewhere is another server's
    assert (q["prod"].max_nodes.value, q["prod"].max_walltime_s.value) == (1024, 12 * 3600)
    assert q["debug"].max_queued_per_user.value == 1 and q["debug"].min_walltime_s.value == 300
    assert q["tiny"].direct_submit.value is False and q["tiny"].max_nodes_per_user.value == 1024
    assert q["small"].max_running_per_user.value == 4 and "max_user_run = 4" in q["small"].max_running_per_user.source
    draft = draft_profile(f, name="pbs-site")
    site = draft.profile
    assert site.queues["prod"].routes_to == ["tiny", "small"] and not site.queues["small"].direct_submit
    assert site.default_queue in ("debug", "prod")
    # The drafted profile refuses what the scheduler would: 100 nodes for 8 h through prod land in tiny (6 h).
    from hpctrain.config.queue_policy import choose_queue

    assert choose_queue(site, "prod", site.queues["prod"], 600, "10:00:00").execution_queue == "small"
    with pytest.raises(FitError, match="'prod' sends 100 nodes to 'tiny'.*06:00:00.*ask for 513 nodes"):
        choose_queue(site, "prod", site.queues["prod"], 100, "08:00:00")
    # And --check names the policies a profile without them lacks.
    mine = load_site("polaris").model_copy()
    keys = {d.key for d in compare_profile(mine, f).differences}
    assert "queues.debug.max_queued_per_user" in keys


# ---------------------------------------------------------------------------------------------------------
# The real local Slurm


def _scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)


@pytest.mark.slurm
def test_partition_limits_are_discovered_checked_and_enforced_before_sbatch(tmp_path: Path, slurm: Any) -> None:
    """A partition with MaxTime 30 min and MinNodes/MaxNodes 1, made by the test (a QOS needs slurmdbd, which the
    local Slurm runs without): discovery reads it, --check reports a profile that says 2 h, the drafted profile
    refuses a 1 h job naming the limit and where it was read, and sbatch would only hold that job."""
    name = f"hpct_policy_{os.getpid()}"
    made = _scontrol("create", f"PartitionName={name}", f"Nodes={slurm.node}", "MaxTime=00:30:00", "MaxNodes=1",
                     "Hidden=YES", "State=UP")
    assert made.returncode == 0, made.stderr
    job_id = None
    try:
        findings = discover(LocalTransport())
        queue = findings.scheduler.queues[name]
        assert queue.max_walltime_s.value == 1800 and "MaxTime=00:30:00" in queue.max_walltime_s.source
        stale = tmp_path / "stale.yaml"
        stale.write_text(f"extends: ci-slurm\nname: stale\nqueues:\n  {name}:\n    max_nodes: 1\n"
                         "    max_walltime: '02:00:00'\n")
        diffs = {d.key: d for d in compare_profile(load_site_file(stale), findings).differences}
        assert (diffs[f"queues.{name}.max_walltime"].profile, diffs[f"queues.{name}.max_walltime"].machine) == (
            "02:00:00", "00:30:00")

        site = write_profile(draft_profile(findings, name="drafted").text, tmp_path / "drafted.yaml")
        from hpctrain.config.job import load_job
        from hpctrain.submission.schedulers.base import place

        (tmp_path / "tiny.yaml").write_text(TINY)
        job = load_job(tmp_path / "tiny.yaml", sets=[f"resources.queue={name}"], walltime="01:00:00")
        with pytest.raises(FitError) as err:
            place(job, load_site_file(site))
        text = str(err.value)
        assert f"walltime 01:00:00 is over the limit of queue '{name}'" in text and "(00:30:00)" in text
        assert "read by `hpctrain sites discover`" in text and "\n" not in text

        # What Slurm does with that job (EnforcePartLimits=NO here): queues it and never starts it.
        done = subprocess.run(["sbatch", "--parsable", "-p", name, "-t", "60", "--wrap", "true"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip().split(";")[0]
        assert _wait_reason(job_id, "PartitionTimeLimit") == "PartitionTimeLimit"
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
        _scontrol("delete", f"PartitionName={name}")


def _wait_reason(job_id: str, wanted: str, polls: int = 180) -> str:
    """The job's pending reason once the scheduler has given it one (it evaluates pending jobs every few s)."""
    import time

    reason = ""
    for _ in range(polls):
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%r"], capture_output=True, text=True, timeout=30)
        reason = out.stdout.strip()
        if reason == wanted:
            return reason
        time.sleep(0.5)
    return reason


@pytest.mark.slurm
def test_a_job_stopped_at_its_checkpoint_where_chaining_is_forbidden(
        tmp_path: Path, slurm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script of a queue without chaining has no requeue; the job ends with status 75 at its checkpoint and
    status says to resume it, and why it was not requeued."""
    from hpctrain.submission.api import RunHandle, submit_runs
    from hpctrain.submission.registry import Registry

    site = tmp_path / "nochain.yaml"
    site.write_text("extends: ci-slurm\nname: nochain\nqueues:\n  debug:\n    chaining: false\n"
                    "    source: the test's own rule\n")
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    (tmp_path / "tiny.yaml").write_text(TINY)
    with Registry() as reg:
        done = submit_runs(tmp_path / "tiny.yaml", str(site), command=["sh", "-c", "exit 75"],
                           run_root=str(tmp_path / "runs"), registry=reg)
    (run,) = done.runs
    script = (Path(run.run_dir) / "job.sh").read_text()
    assert "scontrol requeue" not in script and "#SBATCH --requeue" not in script
    view = RunHandle(run.run_id).wait(timeout=120, poll_s=1)
    assert view.state == "failed", view
    assert view.reason.startswith(f"stopped at its checkpoint; resume with `hpctrain resume {run.run_id}`"), view.reason
    assert "no requeue: queue 'debug' of site 'nochain' forbids job chaining (the test's own rule)" in view.reason
