"""``hpctrain sites discover``: profiles written from what the scheduler on the login node reports.

Real components: the single-node Slurm (fixture ``slurm``; the truth is read from ``scontrol`` here, not
written into the test), the loopback sshd (fixture ``sshd``), and Slurm's client commands against a
controller that is not there (a login node whose scheduler does not answer). Stand-ins, as no PBS Pro or
Cobalt server exists here: Debian's ``slurm-wlm-torque`` ``qstat``/``qsub``/``pbsnodes`` wrappers over the real
Slurm (Torque's output layout, no queue limits), and ``tests/standins/cobalt_qstat -Q`` / ``cobalt_partlist``
replaying recorded Cobalt tables through the real probe and transport. PBS Pro's own layouts (JSON and text)
and Cobalt's tables are checked from the outputs recorded in ``tests/data/discovery`` (see its README).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.site import load_site_file
from hpctrain.errors import ConfigError, SchedulerError, TransportError
from hpctrain.submission.discovery.check import compare_profile
from hpctrain.submission.discovery.detect import detected_scheduler, discover, findings_from
from hpctrain.submission.discovery.facts import NO_LIMIT_S, gpu_kind_of, size_gb
from hpctrain.submission.discovery.probe import MARK, Probe, Section, probe_script, probe_sections, run_probe
from hpctrain.submission.discovery.profile import draft_profile, write_profile
from hpctrain.submission.schedulers.base import all_schedulers
from hpctrain.submission.schedulers.cobalt.discovery import nodes_per_queue, table
from hpctrain.submission.schedulers.slurm.discovery import gres_gpus, key_values, slurm_seconds
from hpctrain.submission.transport import Completed, LocalTransport, SSHTransport
from tests.cluster_support import Cluster
from tests.transport_record import as_recorded

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "discovery"
STANDINS = REPO / "tests" / "standins"
BASIC_TOOLS = ["sh", "env", "mktemp", "cat", "rm", "id", "uname", "getconf", "timeout", "tail", "mkdir", "mv",
               "printf", "true", "sleep"]
TINY = """name: tiny-discovered
model: resnet
train: {steps: 2, batch_per_rank: 2, lr: 0.01}
resources: {nodes: 1, ranks_per_node: 1, walltime: "00:05:00"}
checkpoint: {signal_lead_s: 10}
"""


def short_dir() -> str:
    """A directory short enough for ssh ControlMaster sockets (pytest's tmp_path is too long)."""
    return tempfile.mkdtemp(prefix="hpd-", dir="/tmp")


def data(name: str) -> str:
    return (DATA / name).read_text()


def probe_of(programs: list[str], variables: dict[str, str] | None = None, **answers: str) -> Probe:
    """A Probe as the login node would answer it: the named commands exist; each answer exited 0."""
    sections = {
        "host": Section("login1.example.org"), "user": Section("alice"), "cpus": Section("32"),
        "memory": Section(str(64 * 2 ** 20)), "end": Section(),
        "programs": Section("\n".join(f"{p} /usr/bin/{p}" for p in programs)),
        "variables": Section("\n".join(f"{k}={v}" for k, v in (variables or {}).items())),
    }
    sections.update({name: Section(text, "", 0) for name, text in answers.items()})
    return Probe(sections)


class EnvTransport(LocalTransport):
    """The real LocalTransport, running commands under ``env NAME=VALUE...`` (a login node's own PATH)."""

    def __init__(self, **env: str) -> None:
        self.env = env
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **kw: Any) -> Completed:
        self.calls.append(as_recorded(argv, kw))
        return super().run(["env", *(f"{k}={v}" for k, v in self.env.items()), *argv], **kw)


def shim(directory: Path, tools: list[str], links: dict[str, Path] | None = None) -> str:
    """A bin directory with links to only ``tools`` (plus BASIC_TOOLS and ``links``): a login node's PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in BASIC_TOOLS + tools:
        real = shutil.which(tool)
        if real and not (directory / tool).exists():
            (directory / tool).symlink_to(real)
    for name, target in (links or {}).items():
        (directory / name).symlink_to(target)
    return str(directory)


def scontrol_records(kind: str) -> list[dict[str, str]]:
    """The truth, straight from ``scontrol show KIND -o`` (split on spaces; the fields used hold none)."""
    out = subprocess.run(["scontrol", "show", kind, "-o"], capture_output=True, text=True, timeout=30, check=True)
    return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.stdout.splitlines() if line]


def truth_seconds(text: str) -> int:
    if text in ("UNLIMITED", "INFINITE"):
        return NO_LIMIT_S
    days, _, clock = text.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


def machine_node(nodes: list[dict[str, str]]) -> dict[str, str]:
    """The kind of node discovery calls the machine's: the most common (the cluster's nodes outnumber the head)."""
    kinds = Counter((n["CPUTot"], n["ThreadsPerCore"], n["RealMemory"]) for n in nodes)
    cpus, threads, memory = kinds.most_common(1)[0][0]
    return {"CPUTot": cpus, "ThreadsPerCore": threads, "RealMemory": memory}


def assert_matches_local_slurm(findings: Any) -> None:
    parts = scontrol_records("partition")
    nodes = scontrol_records("node")
    node = machine_node(nodes)
    assert findings.scheduler.name == "slurm" and findings.scheduler.answered
    assert set(findings.scheduler.queues) == {p["PartitionName"] for p in parts} >= {"debug", "long"}
    default = next(p["PartitionName"] for p in parts if p["Default"] == "YES")
    assert findings.scheduler.default_queue.value == default and not findings.scheduler.default_queue.guessed
    for p in parts:
        q = findings.scheduler.queues[p["PartitionName"]]
        assert q.max_walltime_s.value == truth_seconds(p["MaxTime"])
        limit = int(p["TotalNodes"]) if p["MaxNodes"] == "UNLIMITED" else min(int(p["MaxNodes"]), int(p["TotalNodes"]))
        assert q.max_nodes.value == limit
        # each partition's own kind of node: the head's partitions differ from the namespace nodes' one
        (kind,) = {(n["CPUTot"], n["RealMemory"]) for n in nodes if p["PartitionName"] in n["Partitions"].split(",")}
        shape = q.node or findings.node
        assert (shape.cores.value * shape.threads_per_core.value, shape.memory_gb.value) == \
            (int(kind[0]), round(int(kind[1]) / 1024, 1)), p["PartitionName"]
    shape = findings.node
    assert shape.cores.value * shape.threads_per_core.value == int(node["CPUTot"])
    assert shape.threads_per_core.value == int(node["ThreadsPerCore"])
    assert shape.memory_gb.value == round(int(node["RealMemory"]) / 1024, 1)
    assert shape.gpus.value == 0 and not shape.cores.guessed


# --- pure pieces -------------------------------------------------------------------------------------------


def test_sections_keep_each_commands_output_error_and_status_apart() -> None:
    text = (f"noise\n{MARK} a out\nline 1\n{MARK} a err\noops\n{MARK} a rc 3\n"
            f"{MARK} b out\n\n{MARK} end\n")
    sections = probe_sections(text)
    assert sections["a"] == Section("line 1", "oops", 3)
    assert sections["b"].out == "" and sections["b"].rc is None and "end" in sections
    probe = Probe(sections)
    assert probe.failure("a") == "oops" and probe.answered("a") is None and probe.failure("b") is None


def test_the_probe_is_posix_sh_and_runs_only_commands_that_exist() -> None:
    script = probe_script(all_schedulers())
    dash = shutil.which("dash")
    if dash:  # Debian's /bin/sh: the strictest POSIX shell here
        assert subprocess.run([dash, "-n", "-c", script]).returncode == 0
    assert "have sinfo || have scontrol" in script and "have pbsnodes &&" in script
    assert script.rstrip().endswith("exit 0")


def test_scontrol_lines_values_with_spaces_and_equal_signs() -> None:
    line = ("NodeName=n1 OS=Linux 5.14 #1 SMP PREEMPT_DYNAMIC  RealMemory=229376 CfgTRES=cpu=8,mem=1G "
            "Reason=gpu 2 ECC errors [root@2024-03-03T22:20:02]")
    rec = key_values(line)
    assert rec["OS"] == "Linux 5.14 #1 SMP PREEMPT_DYNAMIC" and rec["RealMemory"] == "229376"
    assert rec["CfgTRES"] == "cpu=8,mem=1G" and rec["Reason"].startswith("gpu 2 ECC")


@pytest.mark.parametrize("gres, expected", [
    ("(null)", (0, None)), ("gpu:4", (4, None)), ("gpu:a100:4(S:0-1)", (4, "a100")),
    ("gpu:nvidia_a100-sxm4-40gb:4(S:0-3),shard:8", (4, "nvidia_a100-sxm4-40gb")),
    ("gpu:mi250:4,gpu:mi250:4", (8, "mi250")),
])
def test_gres_gpus(gres: str, expected: tuple[int, str | None]) -> None:
    assert gres_gpus(gres) == expected


def test_small_readers() -> None:
    assert slurm_seconds("UNLIMITED") is None and slurm_seconds("1-00:00:00") == 86400
    assert slurm_seconds("00:30:00") == 1800 and slurm_seconds("30") == 1800
    assert size_gb("527672492kb") == 503.2 and size_gb("11845mb") == 11.6 and size_gb("2gb") == 2.0
    assert size_gb("n/a") is None
    assert [gpu_kind_of(m) for m in ("a100", "H100", "MI250X", "pvc", "gfx90a", "mystery")] == [
        "nvidia", "nvidia", "amd", "intel", "amd", None]


def test_detection_prefers_slurm_and_tells_cobalt_from_pbs() -> None:
    assert detected_scheduler(probe_of(["sinfo", "scontrol", "qstat", "pbsnodes"])).name == "slurm"
    assert detected_scheduler(probe_of(["qstat", "qsub"], qstat_queues=data("cobalt_qstat_Q.txt"))).name == "cobalt"
    assert detected_scheduler(probe_of(["qstat", "qsub", "partlist"])).name == "cobalt"
    assert detected_scheduler(probe_of(["qstat", "qsub"], qstat_queues=data("pbs_qstat_Q.txt"))).name == "pbs"
    assert detected_scheduler(probe_of(["qstat"], qstat_queues=data("torque_qstat_Q.txt"))).name == "pbs"
    assert detected_scheduler(probe_of(["mpiexec"])).name == "local"


# --- recorded outputs ---------------------------------------------------------------------------------------


def test_recorded_local_slurm() -> None:
    probe = probe_of(["sinfo", "scontrol", "sacctmgr", "srun"],
                     slurm_partitions=data("slurm_scontrol_partition.txt"),
                     slurm_nodes=data("slurm_scontrol_node.txt"), slurm_sinfo=data("slurm_sinfo.txt"),
                     slurm_config=data("slurm_scontrol_config.txt"), slurm_mpi=data("slurm_srun_mpi_list.txt"))
    probe.sections["slurm_assoc"] = Section("", data("slurm_sacctmgr_disabled.stderr.txt"), 1)
    f = findings_from(probe)
    real_memory = int(re.search(r"RealMemory=(\d+)", data("slurm_scontrol_node.txt")).group(1))
    assert set(f.scheduler.queues) == {"debug", "long"} and f.scheduler.default_queue.value == "debug"
    assert f.node.cores.value == 8 and f.node.memory_gb.value == round(real_memory / 1024, 1)
    assert all(q.max_walltime_s.value == NO_LIMIT_S and q.max_nodes.value == 1 for q in f.scheduler.queues.values())
    assert f.scheduler.accounts is None and any("sacctmgr" in n and "accounting_storage" in n for n in f.notes)
    assert f.scheduler.mpi_plugins == ["pmix", "none", "cray_shasta", "pmi2"]
    assert f.scratch.value == "/tmp" and not f.scratch.guessed
    assert f.scheduler.cluster_name == "hpctrain"
    draft = draft_profile(f)
    assert draft.profile.name == "hpctrain" and draft.profile.queues["debug"].max_walltime == "8760:00:00"
    assert 'max_walltime: "365-00:00:00"  # scontrol show partition debug: MaxTime=UNLIMITED' in draft.text


def test_recorded_slurm_gpu_cluster() -> None:
    probe = probe_of(["sinfo", "scontrol", "sacctmgr", "srun", "mpiexec"],
                     variables={"LOADEDMODULES": "craype-x86-milan:PrgEnv-gnu/8.3.3:cray-mpich/8.1.25",
                                "LMOD_VERSION": "8.7.14"},
                     slurm_partitions=data("slurm_gpu_scontrol_partition.txt"),
                     slurm_nodes=data("slurm_gpu_scontrol_node.txt"), slurm_assoc=data("slurm_gpu_sacctmgr.txt"),
                     slurm_mpi=data("slurm_gpu_srun_mpi_list.txt"))
    f = findings_from(probe, remote="alice@login1.example.org")
    q = f.scheduler.queues
    assert (q["gpu"].max_nodes.value, q["gpu"].max_walltime_s.value) == (1536, 2 * 86400)
    assert (q["gpu_debug"].max_nodes.value, q["gpu_debug"].max_walltime_s.value) == (8, 1800)
    assert q["cpu"].max_nodes.value == 3072 and "MaxNodes=UNLIMITED" in q["cpu"].max_nodes.source
    assert q["big_mem"].min_nodes.value == 2 and "DOWN" in q["big_mem"].description
    assert f.node.shape() == (64, 2, 4, "nvidia", 224.0) and f.node.count == 3
    assert q["cpu"].node.shape() == (128, 2, 0, "none", 480.0)
    assert f.scheduler.accounts.value == ["m4321", "nstaff"]
    assert f.mpi_library.value == "CRAY MPICH" and f.mpi_modules == ["cray-mpich/8.1.25"]
    assert f.launcher_args.value == ["--mpi=cray_shasta"] and f.comm_backend.value == "nccl"
    assert f.module_system == "Lmod"

    draft = draft_profile(f)
    p = draft.profile
    assert p.name == "example" and p.login_host == "login1.example.org" and p.default_queue == "gpu"
    assert p.queues["cpu"].node.cores == 128 and p.queues["cpu"].node.gpus == 0
    assert p.queues["gpu"].node is None and p.queues["big_mem"].min_nodes == 2
    assert p.account is None and any("2 accounts" in n for n in draft.notes)
    assert p.mpi.expected_library == "CRAY MPICH" and p.mpi.modules == ["cray-mpich/8.1.25"]
    assert set(p.guessed) == {"remote_root", "account_required", "environment.modules"}
    assert len(draft.todo) == 3 and all("  (" in t for t in draft.todo)
    assert "# Note: the machine has 3 kinds of nodes" in draft.text
    # Every value line says where it came from.
    body = draft.text.split("\nscheduler:", 1)[1].splitlines()[1:]
    values = [ln for ln in body if re.match(r"^\s*[\w.-]+: \S", ln)]
    assert values and all("  # " in ln for ln in values), [ln for ln in values if "  # " not in ln]


@pytest.mark.parametrize("form", ["json", "text"])
def test_recorded_pbs_pro(form: str) -> None:
    if form == "json":
        answers = {"pbs_queues_json": data("pbs_qstat_Q_f.json"), "pbs_nodes_json": data("pbs_pbsnodes_a.json")}
    else:
        answers = {"pbs_queues": data("pbs_qstat_Q_f.txt"), "pbs_nodes": data("pbs_pbsnodes_a.txt")}
    probe = probe_of(["qstat", "qsub", "pbsnodes", "mpiexec"],
                     variables={"LOADEDMODULES": "cray-pals:cray-mpich/8.1.28"},
                     qstat_queues=data("pbs_qstat_Q.txt"), pbs_server=data("pbs_qstat_B_f.txt"), **answers)
    f = findings_from(probe)
    q = f.scheduler.queues
    assert f.scheduler.name == "pbs" and f.scheduler.default_queue.value == "debug"
    assert (q["debug"].max_nodes.value, q["debug"].max_walltime_s.value) == (2, 3600)
    assert (q["prod"].min_nodes.value, q["prod"].max_nodes.value, q["prod"].max_walltime_s.value) == (10, 496, 86400)
    assert q["prod"].description.startswith("routing queue to small,medium,large")
    assert q["preemptable"].max_walltime_s.value == 72 * 3600
    assert "maintenance" not in q and any("maintenance (disabled)" in n for n in f.notes)
    # prod's execution queues are kept, reached only through prod; the text form lists only small of them.
    assert q["small"].direct_submit.value is False and q["small"].max_nodes.value == 24
    assert q["prod"].routes_to.value == (["small", "medium", "large"] if form == "json" else ["small"])
    assert q["prod"].direct_submit is None and q["debug"].min_walltime_s.value == 300
    assert q["debug"].max_running_per_user.value == 1 and "max_run = [u:PBS_GENERIC=1]" in \
        q["debug"].max_running_per_user.source
    assert f.node.shape() == (64, 1, 4, "nvidia", 503.2) and f.node.ncpus_only
    assert f.node.threads_per_core.guessed and not f.node.cores.guessed
    assert f.launcher.value == "mpiexec" and f.mpi_library.value == "CRAY MPICH"
    draft = draft_profile(f, name="polaris-discovered")
    assert draft.profile.scheduler == "pbs" and draft.profile.queues["debug-scaling"].max_nodes == 10
    assert "node.threads_per_core" in draft.profile.guessed
    prod, small = draft.profile.queues["prod"], draft.profile.queues["small"]
    assert prod.routes_to == q["prod"].routes_to.value and not small.direct_submit
    assert small.min_walltime == "00:05:00" and "sites discover" in (small.source or "")
    assert draft.profile.queues["debug"].max_running_per_user == 1


def test_recorded_torque_layout_and_missing_limits() -> None:
    probe = probe_of(["qstat", "qsub", "pbsnodes"], qstat_queues=data("torque_qstat_Q.txt"),
                     pbs_queues=data("torque_qstat_Q_f.txt"), pbs_nodes=data("torque_pbsnodes_a.txt"))
    f = findings_from(probe)
    availmem = int(re.search(r"availmem=(\d+)mb", data("torque_pbsnodes_a.txt")).group(1))
    assert set(f.scheduler.queues) == {"debug", "long"}
    assert f.node.cores.value == 8 and f.node.memory_gb.value == round(availmem / 1024, 1)
    debug = f.scheduler.queues["debug"]
    assert debug.max_walltime_s.guessed and debug.max_nodes.value == 1 and not debug.max_nodes.guessed
    draft = draft_profile(f)
    assert {"queues.debug.max_walltime", "queues.long.max_walltime", "default_queue"} <= set(draft.profile.guessed)


def test_recorded_cobalt() -> None:
    assert nodes_per_queue(data("cobalt_partlist.txt")) == {
        "default": 6, "backfill": 6, "debug-cache-quad": 4, "debug-flat-quad": 2, "R.ffn-scaling": 1}
    assert table(data("cobalt_qstat_Q.txt"))[1]["MaxUserNodes"] == "8"
    probe = probe_of(["qstat", "qsub", "partlist", "aprun"], qstat_queues=data("cobalt_qstat_Q.txt"),
                     cobalt_partlist=data("cobalt_partlist.txt"))
    f = findings_from(probe)
    q = f.scheduler.queues
    assert f.scheduler.name == "cobalt" and f.launcher.value == "aprun"
    assert f.scheduler.default_queue.value == "default" and not f.scheduler.default_queue.guessed
    assert q["debug-cache-quad"].max_nodes.value == 4 and "partlist" in q["debug-cache-quad"].max_nodes.source
    assert q["debug-flat-quad"].max_nodes.value == 2 and q["default"].max_walltime_s.value == 86400
    assert q["R.ffn-scaling"].max_walltime_s.guessed and "stopped" in q["training"].description
    assert q["training"].max_nodes.guessed  # no limit in qstat -Q and no partition serves it
    assert f.node.cores.guessed and f.node.memory_gb.guessed  # Cobalt does not describe nodes
    draft = draft_profile(f, name="theta-discovered")
    assert draft.profile.scheduler == "cobalt" and {"node.cores", "node.memory_gb"} <= set(draft.profile.guessed)


# --- --check -------------------------------------------------------------------------------------------------


def _gpu_probe(partitions: str) -> Probe:
    return probe_of(["sinfo", "scontrol"], slurm_partitions=partitions, slurm_nodes=data("slurm_gpu_scontrol_node.txt"))


def test_check_finds_a_renamed_partition_a_changed_limit_and_a_new_node_shape() -> None:
    original = data("slurm_gpu_scontrol_partition.txt")
    draft = draft_profile(findings_from(_gpu_probe(original)), name="gpu-site")
    assert compare_profile(draft.profile, findings_from(_gpu_probe(original))).differences == []

    changed = (original.replace("PartitionName=gpu_debug ", "PartitionName=debug_gpu ")
               .replace("MaxTime=2-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=nid[001000-002791]",
                        "MaxTime=1-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=nid[001000-002791]"))
    result = compare_profile(draft.profile, findings_from(_gpu_probe(changed)))
    by_key = {d.key: d for d in result.differences}
    assert set(by_key) == {"queues.gpu_debug", "queues.gpu.max_walltime"}
    assert "'debug_gpu' has the same limits: renamed?" in by_key["queues.gpu_debug"].machine
    assert (by_key["queues.gpu.max_walltime"].profile, by_key["queues.gpu.max_walltime"].machine) == (
        "48:00:00", "24:00:00")

    gone = original.replace("PartitionName=big_mem ", "PartitionName=bigger_mem ").replace("MinNodes=2", "MinNodes=4")
    result = compare_profile(draft.profile, findings_from(_gpu_probe(gone)))
    assert [d.key for d in result.differences] == ["queues.big_mem"]
    assert "has no queue 'big_mem'" in result.differences[0].machine
    assert any("'bigger_mem'" in n and "not in the profile" in n for n in result.notes)

    bigger = data("slurm_gpu_scontrol_node.txt").replace("RealMemory=491520", "RealMemory=983040")
    probe = probe_of(["sinfo", "scontrol"], slurm_partitions=original, slurm_nodes=bigger)
    (difference,) = compare_profile(draft.profile, findings_from(probe)).differences
    assert difference.key == "queues.cpu.node.memory_gb" and difference.machine == "960.0"


def test_check_pbs_ncpus_may_count_hardware_threads() -> None:
    probe = probe_of(["qstat", "pbsnodes"], qstat_queues=data("pbs_qstat_Q.txt"), pbs_server=data("pbs_qstat_B_f.txt"),
                     pbs_queues_json=data("pbs_qstat_Q_f.json"), pbs_nodes_json=data("pbs_pbsnodes_a.json"))
    shipped = load_site_file(REPO / "site_configs" / "polaris.yaml")  # 32 cores x 2 threads; PBS says ncpus=64
    result = compare_profile(shipped, findings_from(probe))
    assert not [d for d in result.differences if d.key.startswith("node.")], result.differences
    assert "queues.prod.min_nodes" not in {d.key for d in result.differences}


def test_check_refuses_when_the_scheduler_does_not_answer() -> None:
    probe = probe_of(["sinfo", "scontrol"])
    probe.sections["slurm_partitions"] = Section("", "slurm_load_partitions: Unable to contact slurm controller", 1)
    with pytest.raises(SchedulerError, match="did not answer"):
        compare_profile(load_site_file(REPO / "site_configs" / "ci-slurm.yaml"), findings_from(probe))


# --- writing ------------------------------------------------------------------------------------------------


def test_write_is_atomic_and_never_replaces_without_force(tmp_path: Path) -> None:
    target = tmp_path / "site.yaml"
    write_profile("name: a\n", target)
    with pytest.raises(ConfigError, match="file exists; not replaced.*--force"):
        write_profile("name: b\n", target)
    assert target.read_text() == "name: a\n"
    write_profile("name: c\n", target, force=True)
    assert target.read_text() == "name: c\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site.yaml"]  # no temp files left
    with pytest.raises(ConfigError, match="is a directory"):
        write_profile("name: d\n", tmp_path)


def test_a_bad_name_is_refused() -> None:
    f = findings_from(probe_of(["mpiexec"]))
    with pytest.raises(ConfigError, match="not a valid site name"):
        draft_profile(f, name="my site")


# --- real components -----------------------------------------------------------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from hpctrain.cli import main; rc = main(sys.argv[1:]); "
            "heavy = sorted(m for m in ('torch', 'numpy', 'mpi4py') if m in sys.modules); "
            "print('HEAVY', heavy, file=sys.stderr) if heavy else None; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=240,
                          cwd=REPO, env={**os.environ, **(env or {})})


@pytest.mark.slurm
def test_discover_the_local_slurm_and_submit_with_the_written_profile(
        tmp_path: Path, slurm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = EnvTransport()
    findings = discover(transport)
    assert len(transport.calls) == 1  # one round trip
    assert_matches_local_slurm(findings)
    draft = draft_profile(findings, name="discovered-ci")
    site = write_profile(draft.text, tmp_path / "discovered-ci.yaml")
    assert load_site_file(site).model_dump() == draft.profile.model_dump()

    from hpctrain.submission.api import RunHandle, submit_runs
    from hpctrain.submission.registry import RunRegistry

    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    (tmp_path / "tiny.yaml").write_text(TINY)
    with RunRegistry() as reg:
        done = submit_runs(tmp_path / "tiny.yaml", str(site), command=["sh", "-c", "echo discovered site works"],
                           run_root=str(tmp_path / "runs"), registry=reg)
    (run,) = done.runs
    (job_id,) = done.job_ids
    slurm.wait_for_state(job_id, ["COMPLETED"], timeout=90)
    handle = RunHandle(run.run_id)
    assert handle.wait(timeout=90, poll_s=1).state == "completed"
    assert "discovered site works" in handle.logs()


@pytest.mark.slurm
def test_discover_the_cluster_partition_and_run_on_two_of_its_nodes(
        cluster: Cluster, cluster_tmp: Path, slurm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The namespace nodes' partition as discovery reads it, and a 2-node job the written profile sends there."""
    findings = discover(EnvTransport())
    (truth,) = [p for p in scontrol_records("partition") if p["PartitionName"] == cluster.partition]
    (node,) = [n for n in scontrol_records("node") if n["NodeName"] == cluster.nodes[0]]
    queue = findings.scheduler.queues[cluster.partition]
    assert (truth["MaxNodes"], truth["TotalNodes"]) == ("5", "5") and len(cluster.nodes) == 5
    assert queue.max_nodes.value == 5 and not queue.max_nodes.guessed
    assert queue.max_walltime_s.value == truth_seconds(truth["MaxTime"]) == 2 * 3600
    shape = queue.node or findings.node  # the machine's shape unless the partition's nodes differ from it
    assert (shape.cores.value * shape.threads_per_core.value, shape.memory_gb.value) == (
        int(node["CPUTot"]), round(int(node["RealMemory"]) / 1024, 1))
    assert shape.cores.value * shape.threads_per_core.value == 2

    draft = draft_profile(findings, name="discovered-cluster")
    site = write_profile(draft.text, cluster_tmp / "discovered-cluster.yaml")
    profile = load_site_file(site)
    assert profile.model_dump() == draft.profile.model_dump()
    written = profile.queues[cluster.partition]
    assert (written.max_nodes, written.max_walltime) == (5, "02:00:00")
    assert (written.node or profile.node).cores * (written.node or profile.node).threads_per_core == 2
    assert f"scontrol show partition {cluster.partition}: MaxTime={truth['MaxTime']}" in draft.text

    from hpctrain.submission.api import RunHandle, submit_runs
    from hpctrain.submission.registry import RunRegistry

    monkeypatch.setenv("HPCTRAIN_HOME", str(cluster_tmp / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    (cluster_tmp / "tiny.yaml").write_text(TINY)
    with RunRegistry() as reg:
        done = submit_runs(cluster_tmp / "tiny.yaml", str(site), nodes=2, queue=cluster.partition,
                           command=["sh", "-c", 'echo "rank $SLURM_PROCID on $(hostname)"'],
                           run_root=str(cluster_tmp / "runs"), registry=reg)
    (run,) = done.runs
    (job_id,) = done.job_ids
    slurm.wait_for_state(job_id, ["COMPLETED"], timeout=900)  # may queue behind other developers' jobs
    handle = RunHandle(run.run_id)
    assert handle.wait(timeout=120, poll_s=1).state == "completed"
    log = handle.logs()
    hosts = dict(re.findall(r"(?m)^rank (\d+) on (\S+)$", log))
    # Two ranks on two different namespace nodes: one node running both would show its name twice.
    assert set(hosts) == {"0", "1"} and hosts["0"] != hosts["1"], log
    assert set(hosts.values()) <= set(cluster.nodes), log


@pytest.mark.slurm
def test_cli_writes_once_refuses_to_overwrite_and_checks(tmp_path: Path, slurm: Any) -> None:
    target = tmp_path / "mine.yaml"
    first = run_cli("sites", "discover", "--name", "mine", "-o", str(target))
    assert first.returncode == 0, first.stderr
    assert "HEAVY" not in first.stderr and f"wrote {target}" in first.stdout and "to do:" in first.stdout
    text = target.read_text()
    again = run_cli("sites", "discover", "-o", str(target))
    assert again.returncode == 2 and "file exists; not replaced" in again.stderr and "Traceback" not in again.stderr
    assert target.read_text() == text

    check = run_cli("sites", "discover", "--check", str(target))
    assert check.returncode == 0 and "matches what" in check.stdout, check.stdout + check.stderr

    # The machine's `long` renamed in the profile and a limit that is not the machine's.
    edited = re.sub(r"(?m)^  long:", "  longer:", text)
    edited = re.sub(r"(?m)^(  debug:\n(?:    .*\n)*?    max_walltime: )\S+", r"\g<1>'01:00:00'", edited)
    assert edited.count("longer:") == 1 and "'01:00:00'" in edited
    target.write_text(edited)
    check = run_cli("sites", "discover", "--check", str(target))
    assert check.returncode == 2, check.stdout + check.stderr
    renamed = "queues.longer: profile longer, machine has no 'longer'; 'long' has the same limits: renamed?"
    assert renamed in check.stdout
    assert "queues.debug.max_walltime: profile 01:00:00, machine no limit" in check.stdout
    assert "difference(s)" in check.stdout and "Traceback" not in check.stderr

    printed = run_cli("sites", "discover")
    assert printed.returncode == 0 and printed.stdout.startswith("# Discovered by")
    assert "to do:" in printed.stderr and "to do:" not in printed.stdout  # the YAML alone on stdout


@pytest.mark.slurm
@pytest.mark.sshd
def test_discover_over_ssh_is_one_round_trip_and_agrees(slurm: Any, sshd: Any, tmp_path: Path) -> None:
    class Counting(SSHTransport):
        calls = 0

        def run(self, argv: list[str], **kw: Any) -> Completed:
            Counting.calls += 1
            return super().run(argv, **kw)

    control = short_dir()
    transport = Counting(sshd.host, ssh_config=str(sshd.config), control_dir=control)
    try:
        findings = discover(transport, remote=sshd.host)
    finally:
        transport.close()
        shutil.rmtree(control, ignore_errors=True)
    assert Counting.calls == 1
    assert_matches_local_slurm(findings)
    draft = draft_profile(findings)
    assert draft.profile.login_host == sshd.host
    cli = run_cli("sites", "discover", "--remote", sshd.host, "--ssh-config", str(sshd.config), "--name", "viassh",
                  "-o", str(tmp_path / "viassh.yaml"))
    assert cli.returncode == 0, cli.stderr
    assert load_site_file(tmp_path / "viassh.yaml").queues.keys() == draft.profile.queues.keys()


@pytest.mark.slurm
def test_pbs_through_the_torque_wrappers(tmp_path: Path, slurm: Any) -> None:
    """STAND-IN: Debian's qstat/pbsnodes wrappers print Torque's layout from the real Slurm's state."""
    path = shim(tmp_path / "bin", ["qstat", "qsub", "pbsnodes"])
    findings = discover(EnvTransport(PATH=path))
    parts = {p["PartitionName"] for p in scontrol_records("partition")}
    node = machine_node(scontrol_records("node"))
    assert findings.scheduler.name == "pbs" and set(findings.scheduler.queues) == parts
    assert findings.node.cores.value == int(node["CPUTot"])
    assert findings.node.memory_gb.value == round(int(node["RealMemory"]) / 1024, 1)
    assert all(q.max_walltime_s.guessed for q in findings.scheduler.queues.values())  # Torque shows no limits
    draft = draft_profile(findings)
    assert draft.profile.scheduler == "pbs" and "queues.debug.max_walltime" in draft.profile.guessed


def test_cobalt_through_its_stand_ins(tmp_path: Path) -> None:
    """STAND-IN: cobalt_qstat -Q and cobalt_partlist replay the recorded tables through the real probe."""
    path = shim(tmp_path / "bin", [], links={"qstat": STANDINS / "cobalt_qstat", "qsub": STANDINS / "cobalt_qsub",
                                             "partlist": STANDINS / "cobalt_partlist"})
    transport = EnvTransport(PATH=path, COBALT_STANDIN_QUEUES=str(DATA / "cobalt_qstat_Q.txt"),
                             COBALT_STANDIN_PARTLIST=str(DATA / "cobalt_partlist.txt"))
    findings = discover(transport)
    assert findings.scheduler.name == "cobalt" and findings.scheduler.answered
    assert findings.scheduler.queues["debug-cache-quad"].max_nodes.value == 4
    assert findings.node.cores.value == os.cpu_count() and findings.node.cores.guessed
    draft = draft_profile(findings, name="cobalt-standin")
    assert draft.profile.default_queue == "default" and "node.cores" in draft.profile.guessed


def test_a_login_node_without_scheduler_gives_a_minimal_local_profile(tmp_path: Path) -> None:
    findings = discover(EnvTransport(PATH=shim(tmp_path / "bin", [])))
    assert findings.scheduler.name == "local"
    assert any("no scheduler commands" in n for n in findings.notes)
    assert findings.node.cores.value == os.cpu_count() and not findings.node.cores.guessed
    draft = draft_profile(findings, name="bare")
    assert draft.profile.scheduler == "local" and draft.profile.launcher == "local"
    assert draft.profile.comm_backend == "gloo" and draft.profile.queues == {}


def test_a_program_that_leaves_a_daemon_behind_does_not_hold_the_probe(tmp_path: Path) -> None:
    """A login node's `mpiexec` that starts a background process still holding its stdout (as daemons that
    profile scripts start do): the probe's commands write to files, so the answer is not held open."""
    bin_dir = tmp_path / "bin"
    shim(bin_dir, [])
    pid_file = tmp_path / "daemon.pid"
    (bin_dir / "mpiexec").write_text(f"#!/bin/sh\nsleep 300 & echo $! > {pid_file}\necho 'HYDRA build details:'\n")
    (bin_dir / "mpiexec").chmod(0o755)
    try:
        probe = run_probe(EnvTransport(PATH=str(bin_dir)), all_schedulers(), timeout=120)
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 15)
    assert probe.answered("mpi_version") == "HYDRA build details:"
    assert findings_from(probe).mpi_library.value == "MPICH"


@pytest.mark.slurm
def test_a_slurm_that_does_not_answer_gives_a_guessed_profile_and_a_clear_message(tmp_path: Path) -> None:
    """Slurm's real client commands, pointed at a controller port nobody listens on."""
    conf = tmp_path / "slurm.conf"
    lines = [ln for ln in Path("/etc/slurm/slurm.conf").read_text().splitlines()
             if not ln.startswith(("SlurmctldPort", "MessageTimeout"))]
    conf.write_text("\n".join(lines + ["SlurmctldPort=9", "MessageTimeout=1"]) + "\n")
    path = shim(tmp_path / "bin", ["sinfo", "scontrol", "srun", "sacctmgr"])
    transport = EnvTransport(PATH=path, SLURM_CONF=str(conf))
    findings = discover(transport)
    assert findings.scheduler.name == "slurm" and not findings.scheduler.answered
    assert any("Unable to contact slurm controller" in n for n in findings.notes)
    assert any("none answered" in n for n in findings.notes)
    draft = draft_profile(findings, name="silent")
    assert draft.profile.queues == {} and {"node.cores", "node.memory_gb"} <= set(draft.profile.guessed)
    cli = run_cli("sites", "discover", "--name", "silent", env={"PATH": path, "SLURM_CONF": str(conf)})
    assert cli.returncode == 0 and "none answered" in cli.stderr and "Traceback" not in cli.stderr
    assert cli.stdout.startswith("# Discovered by")
    check = run_cli("sites", "discover", "--check", str(REPO / "site_configs" / "ci-slurm.yaml"),
                    env={"PATH": path, "SLURM_CONF": str(conf)})
    assert check.returncode == 3 and "cannot check: Slurm did not answer" in check.stderr


def test_an_unreachable_login_node_is_one_message(tmp_path: Path) -> None:
    control = short_dir()
    with pytest.raises(TransportError, match="cannot reach"):
        run_probe(SSHTransport("nobody@hpctrain-nowhere.invalid", control_dir=control), all_schedulers())
    shutil.rmtree(control, ignore_errors=True)
    cli = run_cli("sites", "discover", "--remote", "nobody@hpctrain-nowhere.invalid",
                  env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert cli.returncode == 4 and cli.stderr.startswith("hpctrain: error: cannot reach") and cli.stdout == ""
