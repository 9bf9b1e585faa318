"""Submission and tracking on the ``local`` site (the local controller), the batched status script run by a
real ``sh``, the Python API, failed submissions, and 8 concurrent CLI processes on one registry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.errors import ConfigError, HpctrainError, SchedulerError
from hpctrain.submission.api import RunHandle, parse_after, parse_array, submit, submit_runs
from hpctrain.submission.marked_sections import split_marked_sections
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import SUBMIT_FAILED
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.tracking import POLL_MARK, batch_script, combine, expand_array_ranges, poll_runs
from hpctrain.submission.transport import LocalTransport, TransportPool, run_script
from tests.conftest import TinyJob
from tests.transport_record import as_recorded

REPO = Path(__file__).resolve().parent.parent
# A rank command that writes a metrics line and prints: stands in for `hpctrain run` (no torch import).
WRITE_METRICS = ["python3", "-c", "import json; print('hello from rank'); "
                 "open('metrics.jsonl', 'a').write(json.dumps({'step': 2, 'loss': 0.25, 'per_rank_rate': 7.0})"
                 " + '\\n')"]


@pytest.fixture
def env(isolated_home: Path, tiny_job: TinyJob) -> Path:
    """The test's own home (the environment its CLI processes inherit) with ``tiny.yaml`` in it."""
    tiny_job()
    return isolated_home


def _cli(*args: str, env_dir: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=env_dir, env=environ, stdin=subprocess.DEVNULL)


# --- the batched status script, run by the real sh ----------------------------------------------------------


def test_batch_script_falls_back_and_marks_sections(tmp_path: Path) -> None:
    metrics = tmp_path / "m dir" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text('{"step": 1}\n{"step": 5, "loss": 0.1}\n')
    script = batch_script(
        [[("acc0", ["sh", "-c", "echo no accounting >&2; exit 1"]), ("acc1", ["printf", "%s\\n", "a|b"])],
         [("live2", ["no-such-command-xyz"]), ("live3", ["echo", "it's $HOME"])]],
        [str(metrics), str(tmp_path / "missing")])
    out = LocalTransport().run(["sh", "-c", script], timeout=30, check=False)
    sec = split_marked_sections(out.stdout, POLL_MARK)
    assert sec["acc0"]["rc"] == "1" and sec["acc0"]["err"] == "no accounting"
    assert sec["acc1"] == {"out": "a|b", "err": "", "rc": "0"}
    assert sec["live2"]["rc"] == "127"
    assert sec["live3"]["out"] == "it's $HOME"  # arguments arrive verbatim
    assert json.loads(sec["tail0"]["out"]) == {"step": 5, "loss": 0.1}
    assert sec["tail1"].get("out", "") == "" and "end" in sec


def test_a_poll_of_many_runs_with_long_paths_is_not_bounded_by_the_command_line(tmp_path: Path) -> None:
    """1,500 run directories with 200-character paths make a poll script of ~600 KiB, past Linux's 128 KiB cap on
    one argument (MAX_ARG_STRLEN) and past what fits in an ssh command line: it travels on stdin."""
    deep = tmp_path / ("d" * 180)
    deep.mkdir()
    paths = [str(deep / f"run-{i:05d}" / "metrics.jsonl") for i in range(1500)]
    for path in paths[::500]:
        Path(path).parent.mkdir()
        Path(path).write_text(f'{{"step": {len(path)}}}\n')
    script = batch_script([[("live0", ["echo", "answered"])]], paths, paths, paths)
    assert len(script.encode()) > 4 * 128 * 1024
    out = run_script(LocalTransport(), script, timeout=120)
    sec = split_marked_sections(out.stdout, POLL_MARK)
    assert sec["live0"]["out"] == "answered" and "end" in sec
    assert [i for i in range(1500) if sec.get(f"tail{i}", {}).get("out")] == [0, 500, 1000]
    assert json.loads(sec["tail500"]["out"]) == {"step": len(paths[500])}
    args = ["it's", "$HOME", "a b", *paths]
    echoed = run_script(LocalTransport(), 'printf "%s\\n" "$@"', args, timeout=60, check=True)
    assert echoed.stdout.splitlines() == args  # positional parameters arrive verbatim too


def test_combine_prefers_live_while_active_and_marks_missing() -> None:
    acc = {"1": JobStatus("1", JobState.COMPLETED, exit_code=0), "2": JobStatus("2", JobState.FAILED, exit_code=3)}
    live = {"1": JobStatus("1", JobState.COMPLETED), "2": JobStatus("2", JobState.RUNNING),
            "3": JobStatus("3", JobState.PENDING)}
    got = combine(["1", "2", "3", "4"], acc, live)
    assert got["1"].exit_code == 0  # finished: the accounting record (with exit code) wins
    assert got["2"].state is JobState.RUNNING  # requeued and running again: live wins
    assert got["3"].state is JobState.PENDING
    assert got["4"].state is JobState.MISSING
    assert "4" not in combine(["4"], acc, None)  # nothing live answered: we cannot say it is missing


def _completion_records(job: str, runs: list[tuple[str, str]]) -> str:
    """``sacct -c -P -n`` lines of one job's ended runs (state, exit code), as parse_sacct_completion reads."""
    return "".join(f"{job}|ffn|{state}|{code}|00:00:05|t0|t1|localhost\n" for state, code in runs)


@pytest.mark.parametrize("squeue_state,records,restarts", [
    ("PENDING", [("REQUEUED", "0:0")] * 8, 8),  # queued again after the 8th requeue: restart 8
    ("RUNNING", [("REQUEUED", "0:0")] * 8, 8),
    # the 9th run has ended (8 requeues, then the last run) and Slurm is cleaning it up: its record may be
    # there already, and it is not a ninth restart
    ("COMPLETING", [("REQUEUED", "0:0")] * 8 + [("COMPLETED", "0:0")], 8),
    ("COMPLETING", [("REQUEUED", "0:0")] * 8, 7),  # its record not yet written: never more than the truth
])
def test_restarts_from_the_completion_file_never_count_a_winding_down_run(
        squeue_state: str, records: list, restarts: int) -> None:
    from hpctrain.submission.schedulers.slurm import parse_sacct_completion, parse_squeue

    live = parse_squeue(f"7|{squeue_state}|None|0:01|localhost|ffn\n")
    acc = parse_sacct_completion(_completion_records("7", records))
    assert combine(["7"], acc, live, ended_runs=True)["7"].restart_count == restarts


@pytest.mark.parametrize("squeue_state,records,restarts", [
    # the phases of one requeue as this Slurm's slurmdbd showed them, polled every 0.5 s
    ("PENDING", [], 0),
    ("COMPLETING", ["REQUEUED"], 0),  # the first run winding down after `scontrol requeue`
    ("PENDING", ["REQUEUED"], 1),  # pending again (BeginTime) before slurmdbd records the next run
    ("PENDING", ["REQUEUED", "PENDING"], 1),
    ("RUNNING", ["REQUEUED", "RUNNING"], 1),
    ("RUNNING", ["REQUEUED", "REQUEUED", "RUNNING"], 2),
])
def test_restarts_from_slurmdbd_are_kept_while_the_job_is_active(
        squeue_state: str, records: list[str], restarts: int) -> None:
    from hpctrain.submission.schedulers.slurm import parse_sacct, parse_squeue

    live = parse_squeue(f"7|{squeue_state}|None|0:01|localhost|ffn\n")
    acc = parse_sacct("".join(f"7|ffn|{state}|0:0|None|00:00:05|t0|t1|localhost\n" for state in records))
    got = combine(["7"], acc, live)["7"]
    assert (got.state, got.restart_count) == (live["7"].state, restarts)


def test_expand_pending_array_range() -> None:
    got = expand_array_ranges({"15_[0-2,5%2]": JobStatus("15_[0-2,5%2]", JobState.PENDING, "held"),
                               "16": JobStatus("16", JobState.RUNNING)})
    assert sorted(got) == ["15_0", "15_1", "15_2", "15_5", "16"]
    assert got["15_1"].reason_text == "held" and got["15_1"].job_id == "15_1"


def test_parse_array_and_after() -> None:
    assert parse_array("train.lr=1e-3, 3e-3,1e-2") == ("train.lr", ["1e-3", "3e-3", "1e-2"])
    with pytest.raises(ConfigError, match="KEY=V1"):
        parse_array("train.lr")
    assert parse_after("run-1:afterany") == ("run-1", "afterany")
    assert parse_after("run-1") == ("run-1", "afterok")


# --- the local site, end to end -------------------------------------------------------------------------------


@pytest.mark.processes
def test_local_submit_status_logs_through_the_cli(env: Path) -> None:
    out = _cli("submit", "tiny.yaml", "--site", "local", "--command", " ".join(map(_q, WRITE_METRICS)),
               env_dir=env)
    assert out.returncode == 0, out.stderr
    run_id, job_id = out.stdout.split()
    assert job_id.isdigit()
    run_dir = env / "runs" / run_id
    assert (run_dir / "job.yaml").is_file() and (run_dir / "job.sh").is_file()
    deadline = time.monotonic() + 30
    while True:  # a fresh process each time: status re-attaches from the registry alone
        st = _cli("status", run_id, "--json", env_dir=env)
        view = json.loads(st.stdout)[0]
        if view["state"] == "completed" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert view["state"] == "completed" and view["job_id"] == job_id
    assert view["progress"] == {"step": 2, "total": 2, "loss": 0.25, "rate": 7.0}
    logs = _cli("logs", run_id, env_dir=env)
    assert "hello from rank" in logs.stdout and "launcher exited with status 0" in logs.stdout
    assert "no log for rank 3" in _cli("logs", run_id, "--rank", "3", env_dir=env).stderr
    runs = json.loads(_cli("runs", "--json", env_dir=env).stdout)
    assert [r["run_id"] for r in runs] == [run_id]
    assert runs[0]["chain"][0]["ok"] is True and runs[0]["chain"][0]["job_id"] == job_id


@pytest.mark.processes
def test_logs_follow_and_status_watch_return_when_the_run_ends(env: Path) -> None:
    """Both start while the job still runs (it prints, sleeps 4 s, prints again): ``logs --follow`` streams
    both lines and the launcher's last one, ``status --watch`` redraws until the run is completed; both then
    exit 0 on their own (the generous timeouts only guard against a hang)."""
    command = ["python3", "-c", "import time; print('first line', flush=True); time.sleep(4); print('second line')"]
    out = _cli("submit", "tiny.yaml", "--site", "local", "--command", " ".join(map(_q, command)), env_dir=env)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.split()[0]
    environ = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    watch = subprocess.Popen([sys.executable, "-m", "hpctrain", "status", run_id, "--watch"], cwd=env, env=environ,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    follow = _cli("logs", run_id, "--follow", env_dir=env, timeout=120)
    watched, watch_err = watch.communicate(timeout=120)
    assert follow.returncode == 0, follow.stderr
    text = follow.stdout
    assert text.index("first line") < text.index("second line") < text.index("launcher exited with status 0")
    assert text.count("first line") == 1  # each chunk printed once, however many polls it took
    assert watch.returncode == 0, watch_err
    assert "COMPLETED" in watched and "tiny" in watched  # the live table, redrawn until the end
    final = json.loads(_cli("status", run_id, "--json", env_dir=env).stdout)[0]
    assert final["state"] == "completed"


def _q(word: str) -> str:
    import shlex

    return shlex.quote(word)


@pytest.mark.processes
def test_python_api_wait_logs_and_cancel(env: Path) -> None:
    handle = submit(env / "tiny.yaml", "local", command=WRITE_METRICS)
    assert isinstance(handle, RunHandle) and handle.job_id
    view = handle.wait(timeout=30, poll_s=0.3)
    assert view.state == "completed" and view.progress is not None and view.progress.step == 2
    assert "hello from rank" in handle.logs()
    slow = submit(env / "tiny.yaml", "local", command=["sleep", "60"])
    assert slow.status().state == "running"
    slow.cancel()
    assert slow.run.state == "cancelled"
    assert slow.wait(timeout=40, poll_s=0.3).state == "cancelled"
    import hpctrain

    assert hpctrain.submit is submit  # the lazy attribute


def test_a_python_api_dry_run_returns_the_script_and_registers_nothing(env: Path) -> None:
    done = submit(env / "tiny.yaml", "local", dry_run=True, command=WRITE_METRICS)
    assert not isinstance(done, RunHandle | list) and done.dry_run and done.runs == []
    assert Path(done.script_path).is_file() and "python3" in Path(done.script_path).read_text()
    with RunRegistry() as reg:
        assert reg.list_runs() == []
    assert not (env / "runs").exists()


def test_local_site_refuses_remote_arrays_and_dependencies(env: Path) -> None:
    with RunRegistry() as reg:
        with pytest.raises(ConfigError, match="cannot be used with --remote"):
            submit_runs(env / "tiny.yaml", "local", remote="someone@example.org", registry=reg)
        with pytest.raises(SchedulerError, match="cannot run job arrays"):
            submit_runs(env / "tiny.yaml", "local", array="train.lr=0.1,0.2", registry=reg)
        assert reg.list_runs() == []  # refused before anything was registered


def test_failed_start_is_recorded_as_failed(env: Path) -> None:
    (env / "runs").write_text("a file where the run root should be a directory")
    with RunRegistry() as reg:
        with pytest.raises(HpctrainError):
            submit_runs(env / "tiny.yaml", "local", registry=reg, command=["true"])
        (run,) = reg.list_runs()
        assert run.state == SUBMIT_FAILED
        (sub,) = reg.chain(run.run_id)
        assert not sub.ok and sub.job_id is None and sub.error


def test_fit_error_registers_nothing(env: Path) -> None:
    out = _cli("submit", "tiny.yaml", "--site", "ci-slurm", "--nodes", "9", env_dir=env)
    assert out.returncode == 2 and "hpctrain: error:" in out.stderr and "Traceback" not in out.stderr
    assert json.loads(_cli("runs", "--json", env_dir=env).stdout) == []


def _interpreter_without_torch(root: Path) -> Path:
    """A real interpreter that imports hpctrain (this checkout) and everything this one does, except torch: a
    throwaway venv whose .pth names the checkout and a folder of links to this venv's packages, torch's left out."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    shadow = root / "packages"
    shadow.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("torch", "functorch", "hpctrain", "__editable__")):
            (shadow / entry.name).symlink_to(entry)
    (purelib / "checkout.pth").write_text(f"{REPO}\n{shadow}\n")
    return python


@pytest.mark.processes
def test_a_local_job_whose_interpreter_lacks_torch_is_refused_before_it_starts(env: Path) -> None:
    """A laptop install without the training stack: ``submit --site local`` (and ``--dry-run``) asks the interpreter
    that will run the job first and refuses with one line naming it and the install command; nothing is registered.
    A yes is remembered, so the next submission starts no process to ask again."""
    from hpctrain.config.job import load_job
    from hpctrain.config.site import load_site
    from hpctrain.submission.interpreter import check_interpreter

    python = _interpreter_without_torch(env)
    environ = dict(os.environ)
    environ.pop("PYTHONPATH", None)  # the venv's .pth alone puts hpctrain on its path
    for dry in ([], ["--dry-run"]):
        out = subprocess.run([str(python), "-m", "hpctrain", "submit", "tiny.yaml", "--site", "local", *dry],
                             capture_output=True, text=True, timeout=120, cwd=env, env=environ,
                             stdin=subprocess.DEVNULL)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith(f"hpctrain: error: the job's interpreter {python} on this machine cannot "
                                   "import torch"), lines[0]
        assert f"{python} -m pip install '{REPO}[train,local]'" in lines[0], lines[0]
    assert json.loads(_cli("runs", "--json", env_dir=env).stdout) == []
    assert not (env / "runs").exists() and not (env / "home" / "dry-run").exists()
    # this interpreter has them: asked once, then remembered
    job, site = load_job(env / "tiny.yaml"), load_site("local")
    assert check_interpreter(LocalTransport(), job, site, python=sys.executable) is True
    assert check_interpreter(LocalTransport(), job, site, python=sys.executable) is False


def test_local_runs_go_through_the_transport_like_any_scheduler(env: Path) -> None:
    """The local back-end is a back-end: submit, status and cancel are argv lists (the local controller's
    submit/status/cancel) run through the transport, and a poll is ONE batched call."""
    calls: list[list[str]] = []

    class Counting(LocalTransport):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def]
            calls.append(as_recorded(argv, kw))
            return super().run(argv, **kw)

    pool = TransportPool(lambda remote, cfg: Counting())
    controller = "hpctrain.submission.schedulers.local_controller"
    with RunRegistry() as reg:
        done = submit_runs(env / "tiny.yaml", "local", registry=reg, pool=pool, command=["sleep", "30"])
        submitted = [c for c in calls if controller in c]
        assert len(submitted) == 1 and submitted[0][:2] == ["env", "-C"] and "submit" in submitted[0]
        calls.clear()
        (view,) = poll_runs(reg, done.runs, pool)
        assert view.state == "running" and len(calls) == 1
        assert calls[0][:2] == ["sh", "-c"] and f"{controller} status" in calls[0][-1]
        calls.clear()
        assert RunHandle(view.run_id, pool=pool).cancel().sent
        assert [c[-3:] for c in calls if controller in c and "cancel" in c] == [["--", done.job_ids[0],
                                                                                done.runs[0].run_dir]]


@pytest.mark.processes
def test_eight_processes_submit_and_poll_at_once(env: Path) -> None:
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for i in range(8):
        args = (["submit", "tiny.yaml", "--site", "local", "--command", "true"] if i % 2 == 0 else
                ["submit", "tiny.yaml", "--site", "local", "--command", "true", "--set", f"train.seed={i}"])
        procs.append(subprocess.Popen([sys.executable, "-m", "hpctrain", *args], cwd=env, env=environ,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        procs.append(subprocess.Popen([sys.executable, "-m", "hpctrain", "status", "--json"], cwd=env,
                                      env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [(p.args, *p.communicate(timeout=120), p.returncode) for p in procs]
    for args, _out, err, rc in results:
        assert rc == 0, f"{args}: {err}"
        assert "locked" not in err
    submitted = {line.split()[0] for args, out, _, _ in results if "submit" in args for line in out.splitlines()}
    assert len(submitted) == 8
    with RunRegistry() as reg:
        runs = reg.list_runs()
        assert {r.run_id for r in runs} == submitted
        assert all(len(reg.chain(r.run_id)) == 1 and reg.chain(r.run_id)[0].ok for r in runs)


def _ended(state: str, reason: str, code: int | None):  # noqa: ANN202 - (chain, run) for why_it_ended
    from hpctrain.submission.registry_rows import Run, Submission

    run = Run("r-1", "r", "local", None, "h", None, "/tmp/r", "now", state, reason, None, None, [])
    chain = [Submission("r-1", 1, "7", "submit", "now", True, None, state, reason, code, 0, None)]
    return chain, run


@pytest.mark.parametrize("state,reason,code,want", [
    # ended at its time limit: the scheduler's signal is not the user's exit code
    ("timeout", "walltime of 12 s reached", -15, "walltime of 12 s reached"),
    ("timeout", "", 0, "its walltime ran out"),
    ("timeout", "DUE TO TIME LIMIT; exit code 0", 0, "DUE TO TIME LIMIT; its walltime ran out"),
    ("timeout", "DUE TO TIME LIMIT; killed by signal 15 (SIGTERM), exit status 143", 0,
     "DUE TO TIME LIMIT; its walltime ran out"),
    ("failed", "", -9, "killed by signal 9 (SIGKILL), exit status 137"),
    ("failed", "", 137, "killed by signal 9 (SIGKILL), exit status 137"),
    # a reason an earlier hpctrain recorded keeps its words; the death is said once, in full
    ("failed", "the script exited with code 140", 140,
     "the script exited with code 140; killed by signal 12 (SIGUSR2), exit status 140"),
    ("failed", "killed by signal 9", 0, "killed by signal 9"),
    ("failed", "rank 1: DataError: no dataset 'image'", 1, "rank 1: DataError: no dataset 'image'; exit code 1"),
    # the ranks' note names the rank: srun's 137 is the peers it killed after it, said as the log says it
    ("failed", "rank 0 failed: RuntimeError: a bug", 137, "rank 0 failed: RuntimeError: a bug; exit status 137"),
    ("failed", "rank 1 killed by SIGKILL", 137, "rank 1 killed by SIGKILL; exit status 137"),
])
def test_why_a_run_ended_says_the_walltime_and_signals_in_words(state: str, reason: str, code: int,
                                                                  want: str) -> None:
    from hpctrain.submission.views import why_it_ended

    assert why_it_ended(*_ended(state, reason, code)) == want


KILLED = "killed by signal 9 (SIGKILL), exit status 137"  # what the job log's "launcher exited with status 137" is


def _slurm_line(job: str, state: str, exit_code: str, reason: str) -> str:
    return f"{job}|ffn-local|{state}|{exit_code}|{reason}|00:00:41|2026-11-20T10:01:10|2026-11-20T10:01:51|nid000016"


def _local_record(code: int) -> str:
    from hpctrain.submission.schedulers.local_controller import final_state

    state, reason = final_state(code, cancelled=False, timed_out=False, walltime_s=60, max_requeues=0)
    return json.dumps({"job": "7", "state": state, "exit_code": code, "reason": reason, "restarts": 0})


def _shapes() -> dict[str, JobStatus]:
    """One job killed by SIGKILL as each back-end reports it, parsed by that back-end's own parser."""
    from hpctrain.submission.schedulers.local import parse_controller_status
    from hpctrain.submission.schedulers.pbs import parse_pbs_qstat_json
    from hpctrain.submission.schedulers.slurm.status import parse_sacct

    pbs = {"Jobs": {"9.pbs": {"job_state": "F", "Exit_status": 137, "comment": "Job run at ... and finished"}}}
    return {
        # the batch shell itself killed: Slurm keeps the signal, exit code 0
        "slurm 0:9": parse_sacct(_slurm_line("201", "FAILED", "0:9", "None"))["201"],
        # the shell exited with srun's 128 + 9 for a killed task
        "slurm 137:0": parse_sacct(_slurm_line("202", "FAILED", "137:0", "NonZeroExitCode"))["202"],
        # the local controller's script: killed itself (-9), or exited with the local launcher's 137
        "local -9": parse_controller_status(_local_record(-9))["7"],
        "local 137": parse_controller_status(_local_record(137))["7"],
        "pbs 137": parse_pbs_qstat_json(json.dumps(pbs))["9.pbs"],
    }


@pytest.mark.parametrize("shape", ["slurm 0:9", "slurm 137:0", "local -9", "local 137", "pbs 137"])
def test_a_death_by_signal_reads_the_same_from_every_back_end(shape: str) -> None:
    """Whatever shape the scheduler reports a SIGKILL in, the run's reason names the signal and the exit status
    the job log prints (137), once, and never an exit code of 9 or 0."""
    from hpctrain.submission.views import why_it_ended

    status = _shapes()[shape]
    assert status.state is JobState.FAILED
    reason = why_it_ended(*_ended(status.state.value, status.reason_text, status.exit_code))
    assert reason.count(KILLED) == 1 and not re.search(r"exit code -?\d", reason), reason
    assert reason.count("signal") == 1, reason
