"""The submitit plug-in without a scheduler: the installed entry points, the parameters and their errors, the
pickle checks before submission, the in-job runner (run here as the job runs it, signals included), the
JobEnvironment from hpctrain's launcher table, the batched file fetch, and the staging hook of submit_runs.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import warnings
from importlib import metadata
from pathlib import Path

import cloudpickle
import pytest
import submitit
import submitit_support
import yaml
from submitit.core import plugins, utils
from submitit_support import Places, Resumable, add, fail, wait_for

from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError, FitError, SchedulerError, TransportError
from hpctrain.submission.api import submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.transport import LocalTransport
from hpctrain.submitit_plugin.environment import HpctrainJobEnvironment
from hpctrain.submitit_plugin.executor import HpctrainExecutor
from hpctrain.submitit_plugin.fetch import fetch_files
from hpctrain.submitit_plugin.params import IgnoredParameterWarning, ParameterError, build_job
from hpctrain.submitit_plugin.probe import PythonProbe, needed_modules, referenced_globals
from hpctrain.submitit_plugin.runner import PAYLOAD_FILE, log_name, result_name
from hpctrain.submitit_plugin.watcher import reason_in_submitit_words

cloudpickle.register_pickle_by_value(submitit_support)
places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
REPO = Path(__file__).resolve().parent.parent


# --- discovery and parameters -----------------------------------------------------------------------------------


def test_the_installed_entry_points_name_the_plugin(places: Places) -> None:
    """What `pip install hpctrain[submitit]` registers is what submitit loads (setup.cfg [options.entry_points])."""
    eps = {ep.name: ep.value for ep in metadata.entry_points().select(group="submitit")}
    assert eps == {"executor": "hpctrain.submitit_plugin.executor:HpctrainExecutor",
                   "job_environment": "hpctrain.submitit_plugin.environment:HpctrainJobEnvironment"}
    assert plugins.get_executors()["hpctrain"] is HpctrainExecutor
    assert isinstance(plugins.get_job_environments()["hpctrain"], HpctrainJobEnvironment)
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site="ci-slurm",
                               hpctrain_run_root=str(places.runs))
    assert isinstance(ex._executor, HpctrainExecutor)
    assert ex._executor.parameters == {"site": "ci-slurm", "run_root": str(places.runs)}
    # Never picked unasked: the cluster must be named.
    assert HpctrainExecutor.affinity() == 0


def test_auto_executor_parameters_reach_the_job_spec(places: Places) -> None:
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site="ci-slurm")
    ex.update_parameters(timeout_min=90, nodes=1, tasks_per_node=2, cpus_per_task=2, mem_gb=1.5, name="sweep",
                         hpctrain_queue="debug", hpctrain_account="proj42", hpctrain_env={"A": "1"})
    params = ex._executor.parameters
    assert params["timeout_min"] == 90 and params["queue"] == "debug" and params["tasks_per_node"] == 2
    job = build_job(params, max_requeues=3, name="ignored")
    assert isinstance(job, JobSpec) and job.name == "sweep"
    res = job.resources
    assert (res.nodes, res.ranks_per_node, res.threads_per_rank, res.walltime, res.queue, res.account,
            res.memory_gb) == (1, 2, 2, "01:30:00", "debug", "proj42", 1.5)
    assert job.checkpoint.max_requeues == 3 and job.checkpoint.signal_lead_s == 120 and job.env == {"A": "1"}
    # A later walltime replaces the earlier timeout_min; short walltimes get a quarter of theirs as lead.
    ex.update_parameters(hpctrain_walltime="00:02:00")
    assert "timeout_min" not in ex._executor.parameters
    assert build_job(ex._executor.parameters, max_requeues=0, name="x").checkpoint.signal_lead_s == 30
    gpus = build_job({"gpus_per_node": 4, "tasks_per_node": 2}, max_requeues=0, name="g")
    assert gpus.resources.gpus_per_rank == 2


def test_unknown_and_bad_parameters_are_refused_with_the_valid_ones(places: Places) -> None:
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain")
    with pytest.raises(NameError, match="Unknown argument 'nodez' for executor 'hpctrain'") as info:
        ex.update_parameters(hpctrain_nodez=2)
    assert "site" in str(info.value) and "remote" in str(info.value)  # submitit lists the valid ones
    direct = HpctrainExecutor(places.folder)
    with pytest.raises(ParameterError, match=r"Unavailable parameter\(s\): \['nodez'\]") as info:
        direct.update_parameters(nodez=2)
    assert isinstance(info.value, ValueError) and "did you mean 'nodes'" in str(info.value)
    assert "tasks_per_node" in str(info.value)
    with pytest.raises(ParameterError, match="nodes='2': expected int, got str"):
        direct.update_parameters(nodes="2")
    with pytest.raises(ParameterError, match="not a multiple of tasks_per_node"):
        direct.update_parameters(gpus_per_node=3, tasks_per_node=2)
    with pytest.raises(ParameterError, match="walltime and timeout_min"):
        direct.update_parameters(walltime="00:10:00", timeout_min=10)


def test_a_job_that_does_not_fit_its_site_is_refused_naming_the_parameter(places: Places) -> None:
    """Values are checked when set; the fit with the site when the job is submitted (parameters come in any
    order: Polaris needs an account, which can only follow the site), before anything is registered."""
    local = HpctrainExecutor(places.folder, run_root=str(places.runs))
    local.update_parameters(nodes=2)
    with pytest.raises(FitError, match="parameter nodes=2") as info:
        local.submit(add, 1, 2)
    assert "at most 1" in str(info.value)
    slurm = HpctrainExecutor(places.folder, site="ci-slurm")
    slurm.update_parameters(timeout_min=2 * 24 * 60)
    with pytest.raises(FitError, match="parameter timeout_min=2880.*over the limit of queue 'debug'"):
        slurm.job_spec(add)
    with pytest.raises(ConfigError, match="parameter nodes=0: Input should be greater than or equal to 1"):
        slurm.update_parameters(nodes=0)
    assert slurm.parameters == {"site": "ci-slurm", "timeout_min": 2880}  # a refused update changes nothing
    polaris = HpctrainExecutor(places.folder, site="polaris", remote="alice@polaris.alcf.anl.gov")
    with pytest.raises(FitError, match="needs an account"):
        polaris.job_spec(add)
    with RunRegistry() as reg:
        assert reg.list_runs() == []
    with pytest.raises(ParameterError, match="runs on this machine; it takes no remote"):
        HpctrainExecutor(places.folder, site="local", remote="alice@login1")
    with pytest.raises(ConfigError, match="no-such-site"):
        HpctrainExecutor(places.folder, site="no-such-site")


def test_refusals_name_the_submitit_parameters_not_the_job_spec_keys(places: Places) -> None:
    """A Python user sets ``nodes`` and ``account``, not ``--nodes`` or ``resources.account``: the key, the
    text and the fix of each refusal name the executor's parameters (AutoExecutor's spelling where it differs)."""
    cases: list[tuple[dict[str, object], dict[str, object], str, str]] = [
        ({}, {"nodes": 2}, "parameter nodes=2: 2 nodes requested but site 'local' (local) runs on at most 1",
         "lower nodes, or pick a queue (parameter queue) or a site (parameter site)"),
        ({"site": "polaris", "remote": "alice@polaris.alcf.anl.gov"}, {},
         "executor parameters: account: site 'polaris' needs an account",
         "set the executor parameter account (AutoExecutor: hpctrain_account=...)"),
        ({"site": "ci-slurm"}, {"timeout_min": 5000}, "parameter timeout_min=5000: walltime 83:20:00 is over",
         "lower timeout_min (or walltime)"),
        ({}, {"tasks_per_node": 64}, "parameter tasks_per_node=64: 64 ranks x 1 threads", "lower tasks_per_node"),
        ({}, {"cpus_per_task": 64}, "parameter cpus_per_task=64: 1 ranks x 64 threads", "lower cpus_per_task"),
        ({}, {"gpus_per_node": 2}, "parameter gpus_per_node=2: 2 GPUs per rank requested", "set gpus_per_node=0"),
        ({}, {"mem_gb": 100000}, "parameter mem_gb=100000: 100000.0 GB per node", "lower mem_gb"),
        ({"site": "ci-slurm"}, {"comm_backend": "nccl"}, "comm_backend nccl needs GPUs: set gpus_per_node",
         "set comm_backend to auto, mpi or gloo"),
    ]
    for init, parameters, message, fix in cases:
        ex = HpctrainExecutor(places.folder, **init)  # type: ignore[arg-type]
        ex.update_parameters(**parameters)
        with pytest.raises(FitError) as info:
            ex.submit(add, 1, 2)
        text = str(info.value)
        assert message in text and fix in text, text
        assert "resources." not in text and "--" not in text and "threads_per_rank" not in text, text
    with pytest.raises(ConfigError) as error:
        HpctrainExecutor(places.folder).update_parameters(signal_lead_s=5)
    assert str(error.value) == "parameter signal_lead_s=5: Input should be greater than or equal to 10 (got 5)"
    with RunRegistry() as reg:
        assert reg.list_runs() == []


def test_slurm_parameters_given_to_auto_executor_are_warned_about(places: Places) -> None:
    """AutoExecutor drops ``slurm_*`` parameters with cluster="hpctrain": a Slurm user who moves over is told,
    with the hpctrain parameter to use, at the line that passed them."""
    with pytest.warns(IgnoredParameterWarning) as seen:
        ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", slurm_partition="gpu")
        ex.update_parameters(slurm_time=30, slurm_account="proj", timeout_min=5, slurm_setup=["module load x"],
                             slurm_constraint="a100")
        ex.update_parameters(slurm_time="02:00:00")
    texts = [str(w.message) for w in seen]
    assert len(texts) == 3 and all(w.filename == __file__ for w in seen)
    assert "slurm_partition='gpu': use hpctrain_queue='gpu'" in texts[0]
    for said in ("slurm_time=30: use timeout_min=30", "slurm_account='proj': use hpctrain_account='proj'",
                 "slurm_setup=['module load x']: use the site profile's environment",
                 "slurm_constraint='a100': use a directive in the site profile"):
        assert said in texts[1]
    assert "slurm_time='02:00:00': use hpctrain_walltime='02:00:00'" in texts[2]
    assert ex._executor.parameters == {"timeout_min": 5}  # the warned ones are indeed not used
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredParameterWarning)
        ex.update_parameters(timeout_min=6, hpctrain_queue="debug")


def test_a_parameter_once_set_is_unset_by_none(places: Places) -> None:
    """AutoExecutor drops None values before the executor sees them: ``hpctrain_queue=None`` still unsets the queue
    (the site's default applies again), and the refusals that ask for it say how."""
    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site="ci-slurm")
    ex.update_parameters(hpctrain_queue="debug", hpctrain_account="proj42", timeout_min=30)
    ex.update_parameters(hpctrain_queue=None, timeout_min=None)
    assert ex._executor.parameters == {"site": "ci-slurm", "account": "proj42"}
    job, _ = ex._executor.job_spec(add)
    assert job.resources.queue is None and job.resources.walltime == "01:00:00"  # the defaults
    direct = HpctrainExecutor(places.folder, site="ci-slurm")
    direct.update_parameters(queue="debug")
    direct.update_parameters(queue=None)
    assert direct.parameters == {"site": "ci-slurm"}
    # A queue carried over to a site that has none: the fix is one the user can make.
    ex.update_parameters(hpctrain_queue="debug", hpctrain_site="local")
    with pytest.raises(ConfigError, match="site 'local' has no queues") as info:
        ex._executor.job_spec(add)
    assert info.value.hint == ("unset queue for this site: update_parameters(queue=None) (AutoExecutor: "
                               "hpctrain_queue=None)")
    ex.update_parameters(hpctrain_queue=None)
    assert ex._executor.job_spec(add)[0].resources.queue is None
    # An empty text is not "unset": refused, saying what is.
    with pytest.raises(ConfigError, match="parameter queue='': must be one plain word") as info:
        ex.update_parameters(hpctrain_queue="")
    assert "to go back to the default, unset queue: update_parameters(queue=None) (AutoExecutor: " \
           "hpctrain_queue=None)" in str(info.value)
    assert "queue" not in ex._executor.parameters


def test_a_timeout_reason_says_walltime_not_the_exit_code_of_the_signal() -> None:
    """What the watcher keeps for ``job.get_info()`` and the errors: the local controller's and Slurm's TIMEOUT
    reasons as hpctrain reads them, in a submitit user's words; other states keep their exit code."""
    assert reason_in_submitit_words("timeout", "walltime of 15 s reached; exit code -15") == \
        "walltime of 15 s reached"
    assert reason_in_submitit_words("timeout", "exit code 0") == "stopped at its walltime (timeout_min)"
    assert reason_in_submitit_words("timeout", "restart 1 of 1; exit code 143 (killed by signal 15)") == \
        "stopped at its walltime (timeout_min); restart 1 of 1"
    assert reason_in_submitit_words("failed", "exit code 137 (killed by signal 9)") == \
        "exit code 137 (killed by signal 9)"


def test_the_polaris_example_of_the_docs_renders(places: Places) -> None:
    """docs/submitit.md's laptop-to-Polaris parameters make a PBS Pro script whose ranks run the runner from the
    profile's venv under PALS mpiexec, one GPU each."""
    from hpctrain.submission.render import render_script

    ex = submitit.AutoExecutor(places.folder, cluster="hpctrain", hpctrain_site="polaris",
                               hpctrain_remote="alice@polaris.alcf.anl.gov")
    ex.update_parameters(timeout_min=30, nodes=2, tasks_per_node=4, gpus_per_node=4, hpctrain_queue="debug",
                         hpctrain_account="MyProject")
    executor = ex._executor
    assert isinstance(executor, HpctrainExecutor)
    job, site = executor.job_spec(add)
    assert job.name == "add" and site.name == "polaris"
    command = executor.runner_command(job, executor.python(site))
    run_dir = "$HOME/hpctrain-runs/add-1"
    script = render_script(job, site, run_dir=run_dir, spec_path=f"{run_dir}/job.yaml", command=command).text
    assert "#PBS -A MyProject" in script and "#PBS -q debug" in script and "#PBS -l walltime=00:30:00" in script
    assert "mpiexec -n 8 --ppn 4" in script and "gpu_affinity" in script
    assert '"$HOME"/hpctrain-venv/bin/python -m hpctrain.submitit_plugin.runner --max-requeues 3 --signal USR2' \
        in script


def test_an_unpicklable_callable_is_refused_before_anything_is_submitted(places: Places) -> None:
    ex = HpctrainExecutor(places.folder, run_root=str(places.runs))
    with pytest.raises(ConfigError, match=r"cannot pickle submitit_support\.add and its arguments: "
                                          r"TypeError: cannot pickle '_thread.lock' object") as info:
        ex.submit(add, 1, threading.Lock())
    assert "pass file paths or plain data" in str(info.value)
    with pytest.raises(ConfigError, match=r"submission 2 of 2"):
        ex.map_array(add, [1, 2], [3, threading.Lock()])
    with RunRegistry() as reg:
        assert reg.list_runs() == []
    assert not places.runs.exists()
    assert [p.name for p in places.folder.iterdir()] == []  # no pickle left behind


# --- what the job's Python must import ------------------------------------------------------------------------


def test_a_pickle_names_the_modules_it_needs() -> None:
    plain = cloudpickle.dumps(utils.DelayedSubmission(json.dumps, {"a": 1}))
    assert ("json", "dumps") in referenced_globals(plain)
    assert needed_modules(plain) == set()  # stdlib, and the runner stands in for DelayedSubmission
    by_value = cloudpickle.dumps(utils.DelayedSubmission(add, 1, 2))
    assert needed_modules(by_value) == {"cloudpickle"}
    assert needed_modules(cloudpickle.dumps(utils.DelayedSubmission(yaml.safe_dump, {}))) == {"yaml"}
    checkpointable = cloudpickle.dumps(utils.DelayedSubmission(Resumable("/tmp/m")))
    assert needed_modules(checkpointable) == {"cloudpickle", "submitit"}
    # Protocol 2 writes GLOBAL opcodes rather than STACK_GLOBAL.
    assert ("yaml", "safe_dump") in referenced_globals(pickle.dumps(yaml.safe_dump, protocol=2))


def test_the_probe_names_what_the_jobs_python_lacks(tmp_path: Path) -> None:
    transport = LocalTransport()
    probe = PythonProbe()
    probe.check(transport, sys.executable, {"yaml", "submitit"}, what="the callable f")
    assert {"yaml", "submitit", "cloudpickle", "hpctrain.submitit_plugin.runner"} <= probe.found
    with pytest.raises(ConfigError, match="cannot import no_such_module_xyz, which the callable f needs") as info:
        probe.check(transport, sys.executable, {"no_such_module_xyz"}, what="the callable f")
    assert "cloudpickle.register_pickle_by_value(no_such_module_xyz)" in str(info.value)
    old = tmp_path / "python2"
    old.write_text('#!/bin/sh\necho \'{"hpctrain-module-probe": "answer", "version": [2, 7], "missing": []}\'\n')
    old.chmod(0o755)
    with pytest.raises(ConfigError, match=r"is Python 2\.7, this one is 3\.\d+"):
        PythonProbe().check(transport, str(old), set(), what="f")
    with pytest.raises(TransportError, match="not found"):
        PythonProbe().check(transport, str(tmp_path / "missing-python"), set(), what="f")


def test_the_probe_expands_a_python_under_home_as_the_batch_script_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles name ``$HOME/venv/bin/python``: the login node's shell expands it, not the laptop."""
    monkeypatch.setenv("HOME", str(Path(sys.executable).parent))
    probe = PythonProbe()
    probe.check(LocalTransport(), "$HOME/" + Path(sys.executable).name, {"yaml"}, what="f")
    assert "yaml" in probe.found
    with pytest.raises(TransportError, match="not found"):
        PythonProbe().check(LocalTransport(), "~/no-such-python", set(), what="f")


# --- the runner, as the job runs it -----------------------------------------------------------------------------


def _stage(run_dir: Path, function: object, *args: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    delayed = utils.DelayedSubmission(function, *args)
    delayed.set_timeout(1, 3)
    (run_dir / PAYLOAD_FILE).write_bytes(cloudpickle.dumps(delayed))


def _runner(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCTRAIN_", "RANK", "WORLD"))}
    return subprocess.Popen([sys.executable, "-m", "hpctrain.submitit_plugin.runner", *args], cwd=run_dir,
                            env={**environ, **(env or {})})


def _outcome(run_dir: Path, task: int = 0) -> tuple[str, object]:
    return pickle.loads((run_dir / result_name(task)).read_bytes())


def test_the_runner_writes_the_result_and_the_logs(tmp_path: Path) -> None:
    _stage(tmp_path, add, 2, 3)
    assert _runner(tmp_path).wait(timeout=60) == 0
    assert _outcome(tmp_path) == ("success", 5)
    assert (tmp_path / log_name(0, "out")).read_text() == "adding 2 and 3\n"
    assert "a line on stderr" in (tmp_path / log_name(0, "err")).read_text()


def test_the_runner_returns_an_exception_with_its_traceback(tmp_path: Path) -> None:
    _stage(tmp_path, fail, 7)
    assert _runner(tmp_path, "--stderr-to-stdout").wait(timeout=60) == 1
    outcome, trace = _outcome(tmp_path)
    assert outcome == "error"
    assert "ValueError: bad value 7" in str(trace) and "submitit_support.py" in str(trace) and ", in fail" in str(trace)
    assert not (tmp_path / log_name(0, "err")).exists()


def test_a_checkpoint_signal_checkpoints_and_asks_for_a_requeue(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    _stage(tmp_path / "run", Resumable(str(marker)))
    first = _runner(tmp_path / "run", "--max-requeues", "2")
    wait_for(marker.exists, 60, "the callable started")
    first.send_signal(signal.SIGUSR2)
    assert first.wait(timeout=60) == 75
    assert not (tmp_path / "run" / result_name(0)).exists()
    saved = pickle.loads((tmp_path / "run" / PAYLOAD_FILE).read_bytes())
    assert saved.function.checkpointed_at is not None and saved.function.runs == 1
    # The requeued job (the batch script passes the restart count) continues from the checkpointed state.
    second = _runner(tmp_path / "run", "--max-requeues", "2", env={"HPCTRAIN_RESTART_COUNT": "1"})
    assert second.wait(timeout=60) == 0
    outcome, value = _outcome(tmp_path / "run")
    assert outcome == "success" and isinstance(value, dict)
    assert value["runs"] == 2 and value["resumed_from"] == saved.function.checkpointed_at


def test_past_max_requeues_the_signal_is_not_a_requeue(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    _stage(tmp_path / "run", Resumable(str(marker)))
    proc = _runner(tmp_path / "run", "--max-requeues", "1", "--signal", "USR1", env={"SLURM_RESTART_COUNT": "1"})
    wait_for(marker.exists, 60, "the callable started")
    proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: "max_requeues is 1" in (tmp_path / "run" / log_name(0, "err")).read_text(), 30,
             "the runner said it will not requeue")
    assert proc.poll() is None  # it runs on until the walltime
    proc.terminate()
    assert proc.wait(timeout=30) != 75


@pytest.mark.processes
def test_a_callable_without_checkpoint_runs_on_after_the_signal(tmp_path: Path) -> None:
    _stage(tmp_path, submitit_support.hold, str(tmp_path / "pid"), 3.0)
    proc = _runner(tmp_path)
    wait_for((tmp_path / "pid").exists, 60, "the callable started")
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=60) == 0
    assert _outcome(tmp_path) == ("success", "woke up")
    assert "has no checkpoint()" in (tmp_path / log_name(0, "err")).read_text()


def test_a_runner_without_cloudpickle_writes_a_readable_error(tmp_path: Path) -> None:
    """The job's Python lacks cloudpickle: the result is an error naming it (plain pickle can still say so)."""
    _stage(tmp_path, add, 1, 2)
    bare = subprocess.run([sys.executable, "-S", "-m", "hpctrain.submitit_plugin.runner"], cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}, timeout=60)
    assert bare.returncode == 1
    outcome, text = _outcome(tmp_path)
    assert outcome == "error" and "No module named 'cloudpickle'" in str(text) and "install cloudpickle" in str(text)


def test_the_job_environment_comes_from_the_launcher_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "PMI_", "OMPI_", "PALS_", "RANK", "WORLD_SIZE", "LOCAL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "hpctrain")
    monkeypatch.setenv("SUBMITIT_FOLDER", str(tmp_path))
    slurm = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1200", "SLURM_ARRAY_TASK_ID": "3",
             "SLURM_JOB_NODELIST": "nid[001-002]"}
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    env = submitit.JobEnvironment()
    assert isinstance(env, HpctrainJobEnvironment)
    assert (env.global_rank, env.num_tasks, env.local_rank, env.node, env.num_nodes) == (5, 8, 1, 1, 2)
    assert env.job_id == "1200_3" and env.hostnames == ["nid001", "nid002"]
    assert env.paths.result_pickle == tmp_path / "result-5.pkl" and env.paths.stdout == tmp_path / "log-5.out"
    for name in slurm:
        monkeypatch.delenv(name)
    # hpctrain's local launcher sets torchrun's variables.
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "HPCTRAIN_LOCAL_JOB_ID": "4242"}.items():
        monkeypatch.setenv(name, value)
    env = submitit.JobEnvironment()
    assert (env.global_rank, env.num_tasks, env.local_rank, env.node, env.job_id) == (1, 2, 1, 0, "4242")


# --- fetching, staging -----------------------------------------------------------------------------------------------


def test_fetch_copies_many_files_in_one_command(tmp_path: Path) -> None:
    remote, local = tmp_path / "remote", tmp_path / "local"
    remote.mkdir()
    (remote / "a").write_bytes(b"\x00\x01binary\n" * 3)
    (remote / "big").write_bytes(os.urandom(5000))
    calls: list[list[str]] = []
    transport = submitit_support.CountingTransport(calls)
    got = fetch_files(transport, [(str(remote / n), local / n) for n in ("a", "missing", "big")], inline_bytes=1000)
    assert got == {local / "a", local / "big"}
    assert (local / "a").read_bytes() == (remote / "a").read_bytes()
    assert (local / "big").read_bytes() == (remote / "big").read_bytes()  # over inline_bytes: its own copy
    assert len(calls) == 1 and not (local / "missing").exists()


def test_submit_runs_stages_extra_files_and_task_arrays(places: Places) -> None:
    extra = places.root / "payload.txt"
    extra.write_text("staged beside the spec\n")
    job = build_job({}, max_requeues=0, name="files")
    with RunRegistry() as reg:
        done = submit_runs(job, "local", run_root=str(places.runs), command=["cat", "payload.txt"], registry=reg,
                           files=[[(extra, "payload.txt")]])
        (run,) = done.runs
        assert Path(run.run_dir, "payload.txt").read_text() == "staged beside the spec\n"
        with pytest.raises(SchedulerError, match="cannot run job arrays"):
            submit_runs(job, "local", run_root=str(places.runs), command=["true"], registry=reg, tasks=2)
        with pytest.raises(ConfigError, match="not both"):
            submit_runs(job, "ci-slurm", run_root=str(places.runs), command=["true"], registry=reg, tasks=2,
                        array="env.X=1,2")
        with pytest.raises(ConfigError, match="not a plain file name"):
            submit_runs(job, "local", run_root=str(places.runs), command=["true"], registry=reg,
                        files=[[(extra, "../outside.txt")]])
        assert not (places.runs / "outside.txt").exists()


def test_the_runner_imports_neither_torch_nor_submitit() -> None:
    """The job side needs hpctrain's base install and cloudpickle only (docs/submitit.md)."""
    code = ("import sys, hpctrain.submitit_plugin.runner; "
            "print([m for m in ('torch', 'numpy', 'mpi4py', 'submitit', 'pydantic') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


class _Keeps:
    """A callable with submitit's checkpoint(): ``follow`` says what checkpoint() returns."""

    def __init__(self, follow: bool) -> None:
        self.follow = follow

    def __call__(self) -> None:
        return None

    def checkpoint(self) -> utils.DelayedSubmission | None:
        return utils.DelayedSubmission(_Keeps(self.follow)) if self.follow else None


@pytest.mark.parametrize("rank_0_checkpoints", [True, False])
def test_other_ranks_wait_for_rank_0s_checkpoint_before_they_stop(tmp_path: Path, rank_0_checkpoints: bool) -> None:
    """A rank that exits 75 first makes srun (--kill-on-bad-exit) end the others, rank 0 in the middle of
    writing the checkpoint: so the other ranks wait for rank 0's word — the requeue marker (exit 75 with it) or
    the declined note (run on) — and a note of another attempt is not taken for this one's."""
    from hpctrain.exit_codes import REQUEUE_MARKER
    from hpctrain.submitit_plugin import runner

    payload = tmp_path / PAYLOAD_FILE
    submission = utils.DelayedSubmission(_Keeps(rank_0_checkpoints))
    payload.write_bytes(cloudpickle.dumps(submission))
    (tmp_path / REQUEUE_MARKER).write_text(json.dumps({"attempt": "41/0"}))  # an earlier job's
    (tmp_path / runner.DECLINED_NOTE).write_text(json.dumps({"attempt": "41/0"}))
    rank0 = runner.CheckpointSignal(0, 3, payload, attempt="42/1")
    rank1 = runner.CheckpointSignal(1, 3, payload, attempt="42/1", decision_wait_s=60)
    for stopper in (rank0, rank1):
        stopper.submission = submission
    outcome: dict[int, str] = {}

    def handle(rank: int, stopper: runner.CheckpointSignal) -> None:
        try:
            stopper.handle(signal.SIGUSR2)
            outcome[rank] = "runs on"
        except runner._Requeue:
            outcome[rank] = "exit 75"

    other = threading.Thread(target=handle, args=(1, rank1))
    other.start()
    other.join(1.0)
    assert other.is_alive()  # waiting for rank 0: the stale notes of job 41 do not count
    handle(0, rank0)
    other.join(30)
    want = "exit 75" if rank_0_checkpoints else "runs on"
    assert outcome == {0: want, 1: want}
