"""The node check on one machine: what one node checks (memory, node-local directories, devices, the import), the
choice of training nodes, the gatherer's judgement (problems, a node that never reports, a clock that is off) and
its files, with a stand-in step that starts one check process per pretended node (tests/mp_helpers/fake_node_step.py;
on the cluster of namespace nodes tests/test_cluster_bad_nodes.py runs the real step under srun).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.exit_codes import EXIT_RUNTIME
from hpctrain.nodes.blame import Blame, append_blames, nodes_to_leave_out, read_blames
from hpctrain.nodes.check import CheckSettings, check_directory, check_node, free_memory_gb
from hpctrain.nodes.select import select_nodes
from hpctrain.submission.failure import FAILURE_FILE
from hpctrain.submission.launchers.node_check import judge

REPO = Path(__file__).resolve().parent.parent
STEP = REPO / "tests" / "mp_helpers" / "fake_node_step.py"


def test_the_first_healthy_nodes_train_in_allocation_order_and_avoided_ones_only_when_others_lack() -> None:
    nodes = ["n1", "n2", "n3", "n4"]
    chosen = select_nodes(nodes, 2, {"n2": "/tmp full"}, {})
    assert chosen.training == ("n1", "n3") and chosen.spares == ("n4",) and chosen.left_out == {"n2": "/tmp full"}
    assert chosen.enough
    avoided = select_nodes(nodes, 2, {}, {"n1": "blamed earlier"})
    assert avoided.training == ("n2", "n3") and avoided.left_out == {"n1": "blamed earlier"}
    # Too few without it: the avoided node trains, and says so; a failed one never does.
    kept = select_nodes(nodes, 3, {"n4": "no report"}, {"n1": "blamed earlier"})
    assert kept.training == ("n1", "n2", "n3") and kept.kept_despite == {"n1": "blamed earlier"}
    short = select_nodes(nodes, 4, {"n4": "no report"}, {})
    assert not short.enough and short.training == ("n1", "n2", "n3")


def test_a_node_reports_its_memory_disks_and_import_and_names_what_is_wrong(tmp_path: Path) -> None:
    assert free_memory_gb("MemTotal: 100 kB\nMemAvailable:    2000000 kB\n") == pytest.approx(2.048)
    assert free_memory_gb("MemTotal: 100 kB\n") is None
    free, problem = check_directory(str(tmp_path), 0)
    assert free is not None and free > 0 and problem is None and not list(tmp_path.iterdir())
    free, problem = check_directory(str(tmp_path), 1 << 62)
    assert problem is not None and problem.startswith(f"{tmp_path} has ") and "the job needs" in problem
    # Not made yet: its parent takes the probe (staging makes it); a file where it should be is a problem.
    free, problem = check_directory(str(tmp_path / "absent" / "deeper"), 0)
    assert free is not None and problem is None and not (tmp_path / "absent").exists()
    (tmp_path / "file").write_text("not a directory")
    assert check_directory(str(tmp_path / "file" / "sub"), 0) == (None, f"{tmp_path / 'file'} is not a directory")
    report = check_node(CheckSettings(local_dirs=((str(tmp_path), 0), (str(tmp_path / "file"), 0)),
                                      min_memory_gb=1e9, import_module="json"), host="n7.example.org")
    assert report.node == "n7" and report.import_s is not None and str(tmp_path) in report.local_free_gb
    assert [p.split(" ")[1:4] for p in report.problems][:1] == [["GB", "of", "memory"]], report.problems
    assert any("file is not a directory" in p for p in report.problems), report.problems
    broken = check_node(CheckSettings(local_dirs=(), import_module="no_such_module_here"))
    assert broken.problems and "cannot import no_such_module_here" in broken.problems[0]


def test_the_gatherer_names_missing_nodes_problems_and_a_clock_that_is_off() -> None:
    reports = {"a": {"problems": []}, "b": {"problems": ["/tmp full"]},
               "c": {"problems": [], "offset_s": 30.0, "round_trip_s": 0.01},
               "d": {"problems": [], "offset_s": 0.5, "round_trip_s": 0.01}}
    failed = judge(["a", "b", "c", "d", "e"], reports, 30, "a")
    assert set(failed) == {"b", "c", "e"}
    assert failed["b"] == "/tmp full" and "clock is +30.0 s off a's" in failed["c"]
    assert failed["e"].startswith("no report within 30 s")


def test_blamed_nodes_are_read_back_and_slow_ones_left_out_only_with_spares(tmp_path: Path) -> None:
    append_blames(tmp_path, [Blame("n1", "killed by SIGKILL", ranks=(0, 1), source="launcher"),
                             Blame("n2", "link 9.8x the median", kind="slow", source="straggler")])
    (tmp_path / "blamed-nodes.jsonl").open("a").write('{"node": "n3", "kind": "cut li')  # a writer cut short
    blames = read_blames(tmp_path)
    assert [(b.node, b.kind, b.ranks) for b in blames] == [("n1", "failed", (0, 1)), ("n2", "slow", ())]
    assert list(nodes_to_leave_out(blames, spares=False)) == ["n1"]
    assert list(nodes_to_leave_out(blames, spares=True)) == ["n1", "n2"]
    assert blames[0].where == "n1 (ranks 0-1)"


def gatherer(run_dir: Path, nodes: str, needed: int, step: list[str], *extra: str,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "COBALT_"))}
    env["SLURM_JOB_NODELIST"], env["SLURM_JOB_ID"] = nodes, "77"
    argv = [sys.executable, "-m", "hpctrain.submission.launchers.node_check", "--run-dir", str(run_dir),
            "--nodes", str(needed), "--timeout", str(timeout), *extra, "--", *step]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout + 120,
                          stdin=subprocess.DEVNULL, cwd=REPO)


@pytest.mark.processes
def test_the_gatherer_picks_healthy_nodes_and_writes_one_results_file(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file where a directory should be")
    step = [sys.executable, str(STEP), "n1", f"n2=--local-dir,{tmp_path / 'blocked'}:1", "n3"]
    done = gatherer(tmp_path, "n[1-3]", 2, step)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "node check of 3 nodes" in done.stdout and "n2 left out:" in done.stdout, done.stdout
    results = json.loads((tmp_path / "node-check.json").read_text())
    assert results["training"] == ["n1", "n3"] and results["job"] == "77" and set(results["reports"]) == {
        "n1", "n2", "n3"}
    assert all(isinstance(r.get("offset_s"), float) for r in results["reports"].values())
    # What the first node handled, counted as it happened: one connection and 2 messages each way per node.
    assert results["first_node"] == {"connections": 3, "messages_received": 6, "messages_sent": 6}
    assert (tmp_path / "training-nodes").read_text() == "n1\nn3\n"
    assert [(b.node, b.source, b.job) for b in read_blames(tmp_path)] == [("n2", "check", "77")]


@pytest.mark.processes
def test_a_node_that_never_reports_ends_the_job_with_one_note_and_no_training_nodes(tmp_path: Path) -> None:
    done = gatherer(tmp_path, "n[1-2]", 2, [sys.executable, str(STEP), "n1", "-"], timeout=10)
    assert done.returncode == EXIT_RUNTIME, done.stdout + done.stderr
    note = (tmp_path / FAILURE_FILE).read_text()
    assert note.startswith("node check: n2: no report within 10 s") and "1 healthy node for 2 needed" in note
    assert not (tmp_path / "training-nodes").exists()


@pytest.mark.processes
def test_a_hung_step_is_ended_at_the_deadline(tmp_path: Path) -> None:
    done = gatherer(tmp_path, "n1", 1, [sys.executable, "-c", "import time; time.sleep(3600)"], timeout=10)
    assert done.returncode == EXIT_RUNTIME and "n1: no report within 10 s" in done.stderr, done.stderr


@pytest.mark.processes
def test_nodes_blamed_earlier_and_excluded_ones_are_avoided_and_a_lost_node_is_blamed(tmp_path: Path) -> None:
    append_blames(tmp_path, [Blame("n1", "killed by SIGKILL", source="launcher", job="70")])
    log = tmp_path / "slurm-77.out"
    log.write_text("srun: error: Node failure on n2\n")
    step = [sys.executable, str(STEP), "n1", "n2", "n3", "n4"]
    done = gatherer(tmp_path, "n[1-4]", 2, step, "--exclude", "n3", "--lost-nodes-log", str(log))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "training-nodes").read_text() == "n1\nn4\n"
    results = json.loads((tmp_path / "node-check.json").read_text())
    # n1 blamed earlier, n2 lost before, n3 excluded: two are needed, so n4 and the first avoided one train.
    assert results["training"] == ["n1", "n4"], results
    assert set(results["left_out"]) == {"n2", "n3"}
    blames = read_blames(tmp_path)
    assert [(b.node, b.source) for b in blames] == [("n1", "launcher"), ("n2", "scheduler")]


# --- the batch script ------------------------------------------------------------------------------------------


def rendered(site_name: str, **resources: object) -> str:
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import load_site
    from hpctrain.submission.render import render_script

    res = {"nodes": 2, "ranks_per_node": 1, "walltime": "00:30:00", **resources}
    job = JobSpec.model_validate({"name": "bad-nodes", "model": "resnet",
                                  "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1}, "resources": res})
    site = load_site(site_name)
    return render_script(job, site, run_dir="/r", spec_path="/r/job.yaml", python="/sw/bin/python").text


def test_spare_nodes_are_asked_of_the_scheduler_and_the_launch_starts_on_the_chosen_nodes() -> None:
    slurm = rendered("ci-cluster", spare_nodes=1)
    assert "#SBATCH --nodes=3" in slurm
    check_step, = [ln for ln in slurm.splitlines() if "hpctrain.nodes.check" in ln]
    assert check_step.lstrip().startswith("srun --nodes=3 --ntasks=3 --ntasks-per-node=1")
    launch, = [ln for ln in slurm.splitlines() if "-m hpctrain run" in ln]
    assert launch.startswith("srun --nodes=2 --ntasks=2") and "--nodelist=./training-nodes" in launch
    assert "--lost-nodes-log slurm-\"${SLURM_JOB_ID}\".out" in slurm
    assert "update JobId=%s ExcNodeList=%s" in slurm and "nodes.blame --run-dir . --spares" in slurm
    pbs = rendered("polaris", spare_nodes=1, queue="debug-scaling", account="a")
    assert "#PBS -l select=3:" in pbs
    launch, = [ln for ln in pbs.splitlines() if "-m hpctrain run" in ln]
    assert launch.startswith("mpiexec -n 2 --ppn 1 --hostfile ./training-nodes"), launch
    assert "hpctrain_excluded_nodes" not in pbs  # PBS cannot exclude: the spare nodes do it at the start


def test_spare_nodes_are_refused_where_the_launcher_cannot_choose_nodes_or_the_queue_is_too_small() -> None:
    from hpctrain.errors import ConfigError

    with pytest.raises(ConfigError) as aprun:
        rendered("theta", nodes=128, spare_nodes=2, queue="default", account="a")
    assert aprun.value.key == "resources.spare_nodes" and "aprun" in aprun.value.message, aprun.value
    with pytest.raises(ConfigError) as full:
        rendered("ci-cluster", nodes=5, spare_nodes=1)
    assert full.value.key == "resources.spare_nodes" and "(5 to train on and 1 spare)" in full.value.message


def test_the_check_runs_for_more_than_one_node_unless_turned_off() -> None:
    assert "hpctrain.nodes.check" in rendered("ci-cluster")
    assert "hpctrain.nodes.check" not in rendered("ci-cluster", node_check=False)
    assert "hpctrain.nodes.check" not in rendered("ci-cluster", nodes=1)
    assert "hpctrain.nodes.check" in rendered("ci-cluster", nodes=1, node_check=True)
    assert "--timeout 30" in rendered("ci-cluster", node_check_timeout_s=30)


@pytest.mark.processes
def test_on_pbs_the_check_chooses_the_nodes_and_mpiexec_gets_them_in_its_host_file(tmp_path: Path) -> None:
    """PBS Pro with PALS mpiexec, stand-ins (no PBS here): the Polaris profile's script with a spare node runs, its
    check step starts one check per host of $PBS_NODEFILE (tests/mp_helpers/pals_mpiexec_standin.py), the host with
    the broken node-local directory is left out and the launch gets the other two in --hostfile."""
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import load_site
    from hpctrain.submission.render import render_script

    site = load_site("polaris")
    site = site.model_copy(update={"environment": site.environment.model_copy(update={
        "venv": None, "setup": [], "modules": []}), "mpi": site.mpi.model_copy(update={"expected_library": None})})
    job = JobSpec.model_validate({"name": "pbs-spare", "model": "resnet",
                                  "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1},
                                  "resources": {"nodes": 2, "ranks_per_node": 1, "walltime": "00:30:00",
                                                "spare_nodes": 1, "queue": "debug-scaling", "account": "a",
                                                "memory_gb": 1}})  # this machine has no Polaris node's memory
    run_dir, bin_dir, records = tmp_path / "run", tmp_path / "bin", tmp_path / "records"
    for d in (run_dir, bin_dir, records):
        d.mkdir()
    text = render_script(job, site, run_dir=str(run_dir), spec_path=f"{run_dir}/job.yaml", python=sys.executable).text
    (run_dir / "job.sh").write_text(text)
    shim = bin_dir / "mpiexec"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests' / 'mp_helpers' / 'pals_mpiexec_standin.py'} "
                    '"$@"\n')
    shim.chmod(0o755)
    (tmp_path / "nodefile").write_text("x3001\nx3002\nx3003\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORD_DIR": str(records),
           "PBS_NODEFILE": str(tmp_path / "nodefile"), "PBS_JOBID": "12.polaris-pbs", "BAD_NODE": "x3002",
           "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    done = subprocess.run(["bash", str(run_dir / "job.sh")], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"node check: x3002 left out: {sys.executable} is not a directory" in done.stdout, done.stdout
    launch = json.loads((records / "launch.json").read_text())
    assert launch["hosts"] == ["x3001", "x3003"] and launch["argv"][:6] == ["-n", "2", "--ppn", "1", "--hostfile",
                                                                         "./training-nodes"], launch
    (blame,) = read_blames(run_dir)
    assert (blame.node, blame.job) == ("x3002", "12.polaris-pbs")
