"""`sites discover` reads queue policies and `--check` reports drift: Slurm partition limits and a QOS (made by the
tests with scontrol and sacctmgr; the local Slurm runs slurmdbd) on the real local Slurm, the same QOS layouts and
PBS policies from hand-written command output (no PBS server runs here); `validate` and `submit` refuse before
sbatch what the scheduler would refuse, the per-user queued limit counted by the back-end at submit time (Slurm's
squeue, and PBS's qstat through Debian's Torque wrappers over the same Slurm); and a job stopped at its checkpoint
in a queue that forbids chaining, as `status` shows it."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.site import load_site, load_site_file
from hpctrain.errors import FitError
from hpctrain.submission.discovery.check import compare_profile
from hpctrain.submission.discovery.detect import discover, findings_from
from hpctrain.submission.discovery.probe import Probe, Section
from hpctrain.submission.discovery.profile import draft_profile, write_profile
from hpctrain.submission.schedulers.slurm.discovery import read_qos
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
    # A refusal cites the QOS's own limit, not only the partition.
    assert draft.profile.rule_source("short", "max_walltime").startswith("sacctmgr show qos debug: MaxWall=02:00:00; ")
    assert "MaxSubmitPU=1" in draft.profile.rule_source("short", "max_queued_per_user")
    assert draft.profile.rule_source("short", "min_nodes") == draft.profile.queues["short"].source
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


def _sacctmgr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _delete_qos(name: str) -> None:
    """Remove the test's QOS once slurmctld has let go of its cancelled jobs (sacctmgr refuses while any is active)."""
    import time

    done = _sacctmgr("delete", "qos", name)
    for _ in range(60):
        if done.returncode == 0 or "active" not in (done.stdout + done.stderr).lower():
            break
        time.sleep(0.5)
        done = _sacctmgr("delete", "qos", name)
    assert done.returncode == 0 or "Nothing deleted" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.slurm
def test_qos_limits_are_discovered_checked_and_enforced_before_sbatch(
        tmp_path: Path, slurm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A QOS with MaxWall 20 min and MaxSubmitPU 1, made by the test and bound to a partition it creates: discovery
    reads it, --check reports a profile that says 2 h and no per-user limit, validate refuses a 30-min job naming
    MaxWall and where it was read, sbatch only holds that job; with that job queued, submit refuses a second one
    before sbatch, which would refuse it too."""
    from hpctrain.config.job import load_job
    from hpctrain.submission.api import submit_runs
    from hpctrain.submission.queue_limits import check_queued_jobs
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.schedulers.base import place

    qos, part = f"hpct_qos_{os.getpid()}", f"hpct_qosp_{os.getpid()}"
    made = _sacctmgr("add", "qos", qos, "MaxWall=00:20:00", "MaxSubmitJobsPerUser=1")
    assert made.returncode == 0, made.stdout + made.stderr
    job_ids: list[str] = []
    try:
        made = _scontrol("create", f"PartitionName={part}", f"Nodes={slurm.node}", "MaxTime=INFINITE", f"QOS={qos}",
                         "Hidden=YES", "State=UP")
        assert made.returncode == 0, made.stderr
        findings = discover(LocalTransport())
        assert findings.scheduler.qos[qos].max_queued_per_user.value == 1
        queue = findings.scheduler.queues[part]
        assert queue.max_walltime_s.value == 1200
        assert queue.max_walltime_s.source == f"sacctmgr show qos {qos}: MaxWall=00:20:00"
        assert queue.max_queued_per_user.value == 1 and "MaxSubmitPU=1" in queue.max_queued_per_user.source

        stale = tmp_path / "stale.yaml"
        stale.write_text(f"extends: ci-slurm\nname: stale\nqueues:\n  {part}:\n    max_nodes: 1\n"
                         "    max_walltime: '02:00:00'\n")
        diffs = {d.key: d for d in compare_profile(load_site_file(stale), findings).differences}
        wall = diffs[f"queues.{part}.max_walltime"]
        assert (wall.profile, wall.machine) == ("02:00:00", "00:20:00") and "MaxWall" in wall.source
        queued = diffs[f"queues.{part}.max_queued_per_user"]
        assert (queued.profile, queued.machine) == ("none", "1") and "MaxSubmitPU=1" in queued.source

        site = load_site_file(write_profile(draft_profile(findings, name="drafted").text, tmp_path / "drafted.yaml"))
        (tmp_path / "tiny.yaml").write_text(TINY)
        long_job = load_job(tmp_path / "tiny.yaml", sets=[f"resources.queue={part}"], walltime="00:30:00")
        with pytest.raises(FitError) as err:
            place(long_job, site)
        text = str(err.value)
        assert f"walltime 00:30:00 is over the limit of queue '{part}' of site 'drafted' (00:20:00)" in text
        assert f"sacctmgr show qos {qos}: MaxWall=00:20:00" in text and "read by `hpctrain sites discover`" in text
        assert "\n" not in text

        # What Slurm does with that job (the QOS has no DenyOnLimit): queues it and never starts it.
        short_job = load_job(tmp_path / "tiny.yaml", sets=[f"resources.queue={part}"], walltime="00:10:00")
        check_queued_jobs(LocalTransport(), site, place(short_job, site), 1)  # nothing queued yet: room for one
        done = subprocess.run(["sbatch", "--parsable", "-p", part, "-t", "30", "--wrap", "true"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        job_ids.append(done.stdout.strip().split(";")[0])
        assert _wait_reason(job_ids[0], "QOSMaxWallDurationPerJobLimit") == "QOSMaxWallDurationPerJobLimit"

        # That job fills MaxSubmitPU=1: hpctrain's submit refuses a job that fits MaxWall, before sbatch ...
        monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
        monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
        with RunRegistry() as reg, pytest.raises(FitError) as err:
            submit_runs(tmp_path / "tiny.yaml", site, queue=part, walltime="00:10:00", command=["true"],
                        run_root=str(tmp_path / "runs"), registry=reg)
        text = str(err.value)
        assert f"queue '{part}' of site 'drafted' takes at most 1 queued jobs per user" in text
        assert f"sacctmgr show qos {qos}: MaxSubmitPU=1" in text and "read by `hpctrain sites discover`" in text
        assert "you have 1 job pending or running there (squeue on this machine)" in text
        assert text.endswith("wait for one to finish or cancel one: hpctrain cancel RUN") and "\n" not in text
        with RunRegistry() as reg:
            assert reg.list_runs() == []
        listed = subprocess.run(["squeue", "-h", "-p", part, "-o", "%i"], capture_output=True, text=True, timeout=30)
        assert listed.stdout.split() == job_ids
        # ... and sbatch itself would refuse it.
        refused = subprocess.run(["sbatch", "--parsable", "-p", part, "-t", "10", "--wrap", "true"],
                                 capture_output=True, text=True, timeout=30)
        if refused.returncode == 0:
            job_ids.append(refused.stdout.strip().split(";")[0])
        assert refused.returncode != 0 and "QOSMaxSubmitJobPerUserLimit" in refused.stderr, refused.stderr
    finally:
        for job_id in job_ids:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
        _scontrol("delete", f"PartitionName={part}")
        _delete_qos(qos)


@pytest.mark.slurm
def test_pbs_submit_counts_the_users_queued_jobs_with_qstat(
        tmp_path: Path, slurm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PBS's max_queued checked at submit through the PBS stand-in (Debian's Torque qstat/qsub over the real
    Slurm, whose partitions are its queues): no job queued, submit goes through to qsub; one held job queued,
    submit refuses the next before qsub."""
    from conftest import write_standin_site

    from hpctrain.submission.api import submit_runs
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.schedulers.pbs import count_queued

    queue = f"hq{os.getpid() % 100000}"  # qstat -a shows 8 characters of a queue name
    made = _scontrol("create", f"PartitionName={queue}", f"Nodes={slurm.node}", "MaxTime=INFINITE", "Hidden=YES",
                     "State=UP")
    assert made.returncode == 0, made.stderr
    site = write_standin_site(tmp_path, "pbs-limited", "pbs")
    site.write_text(site.read_text() + f"default_queue: {queue}\nqueues:\n  {queue}:\n    max_nodes: 1\n"
                    "    max_walltime: '01:00:00'\n    max_queued_per_user: 1\n    source: the test's own rule\n")
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    (tmp_path / "tiny.yaml").write_text(TINY)
    job_ids: list[str] = []
    try:
        with RunRegistry() as reg:
            first = submit_runs(tmp_path / "tiny.yaml", str(site), command=["true"], registry=reg)
        job_ids += [j.split(".")[0] for j in first.job_ids if j]
        assert len(job_ids) == 1
        # A held job stays queued whatever the first one does.
        held = subprocess.run(["sbatch", "--parsable", "--hold", "-p", queue, "-t", "5", "--wrap", "true"],
                              capture_output=True, text=True, timeout=30)
        assert held.returncode == 0, held.stderr
        job_ids.append(held.stdout.strip().split(";")[0])
        qstat = subprocess.run(["sh", "-c", 'exec qstat -a -u "$(id -un)"'], capture_output=True, text=True,
                               timeout=30)
        assert count_queued(qstat.stdout, queue) >= 1, qstat.stdout
        with RunRegistry() as reg, pytest.raises(FitError) as err:
            submit_runs(tmp_path / "tiny.yaml", str(site), command=["true"], registry=reg)
        text = str(err.value)
        assert (f"queue '{queue}' of site 'pbs-limited' takes at most 1 queued jobs per user (the test's own rule)"
                in text)
        assert "pending or running there (qstat -a on this machine)" in text and "hpctrain cancel RUN" in text
        with RunRegistry() as reg:
            assert len(reg.list_runs()) == 1
    finally:
        for job_id in job_ids:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
        _scontrol("delete", f"PartitionName={queue}")


def test_pbs_queued_count_reads_qstat_a() -> None:
    """PBS Pro's `qstat -a -u` layout (and Torque's: a job name with a space); finished jobs and other queues are not
    counted; a queue name longer than the column matches on its first 8 characters."""
    from hpctrain.submission.schedulers.pbs import count_queued

    text = textwrap.dedent("""\

        polaris-pbs-01:
                                                                    Req'd  Req'd   Elap
        Job ID          Username Queue    Jobname    SessID NDS TSK Memory Time  S Time
        --------------- -------- -------- ---------- ------ --- --- ------ ----- - -----
        101.polaris     alice    debug    train        --     1  64    --  01:00 Q   --
        102.polaris     alice    debug    my job       4321   1  64    --  01:00 R 00:10
        103.polaris     alice    debug    done         4322   1  64    --  01:00 F 00:59
        104.polaris     alice    preempta train        --     2 128    --  01:00 H   --
        105.polaris     alice    prod     train        --    10 640    --  06:00 Q   --
        """)
    assert count_queued(text, "debug") == 2
    assert count_queued(text, "preemptable") == 1 and count_queued(text, "prod") == 1
    assert count_queued(text, "small") == 0 and count_queued("", "debug") == 0


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
    from hpctrain.submission.registry import RunRegistry

    site = tmp_path / "nochain.yaml"
    site.write_text("extends: ci-slurm\nname: nochain\nqueues:\n  debug:\n    chaining: false\n"
                    "    source: the test's own rule\n")
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    (tmp_path / "tiny.yaml").write_text(TINY)
    with RunRegistry() as reg:
        done = submit_runs(tmp_path / "tiny.yaml", str(site), command=["sh", "-c", "exit 75"],
                           run_root=str(tmp_path / "runs"), registry=reg)
    (run,) = done.runs
    script = (Path(run.run_dir) / "job.sh").read_text()
    assert "scontrol requeue" not in script and "#SBATCH --requeue" not in script
    view = RunHandle(run.run_id).wait(timeout=120, poll_s=1)
    assert view.state == "failed", view
    assert view.reason.startswith(f"stopped at its checkpoint; resume with `hpctrain resume {run.run_id}`"), view.reason
    assert "no requeue: queue 'debug' of site 'nochain' forbids job chaining (the test's own rule)" in view.reason
