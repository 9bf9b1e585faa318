"""The scheduler back-end contract (hpctrain/submission/schedulers/base.py): every back-end is one module, found
by name in the registry; nothing outside the back-ends knows a scheduler by name; a new back-end's status probes
are polled by tracking.py without any change there; the local back-end reads its own directives.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

import hpctrain.submission
from hpctrain.config.backends import SCHEDULERS
from hpctrain.errors import ConfigError, FitError, SchedulerError
from hpctrain.submission.schedulers import base, local_controller
from hpctrain.submission.schedulers.base import Scheduler, StatusProbe, get_scheduler, known_schedulers
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus
from hpctrain.submission.tracking import poll_scheduler
from hpctrain.submission.transport import LocalTransport

SUBMISSION = Path(hpctrain.submission.__file__).resolve().parent
TEMPLATES = SUBMISSION / "schedulers" / "templates"
NAMES = frozenset({"cobalt", "local", "pbs", "slurm"})


def test_every_backend_is_one_module_and_one_template_serves_them_all() -> None:
    assert set(known_schedulers()) == NAMES == set(SCHEDULERS.builtin)
    assert sorted(p.name for p in TEMPLATES.glob("*.tmpl")) == [
        "job.tmpl", "launch.tmpl", "prologue.tmpl", "stage_node.tmpl"]
    for name in NAMES:
        scheduler = get_scheduler(name)
        assert scheduler.name == name and scheduler.template == "job.tmpl"
        assert type(scheduler).__module__ == f"hpctrain.submission.schedulers.{name}"
        assert scheduler.log_names("12") and scheduler.launcher_for.__self__ is scheduler
        assert scheduler.script_note.startswith("# ") and scheduler.title
    text = (TEMPLATES / "job.tmpl").read_text()
    assert all(f"${{{piece}}}" in text for piece in ("directives", "header", "note", "prologue", "launch"))
    with pytest.raises(ConfigError, match="no scheduler back-end named 'lsf'.*known: cobalt, local, pbs, slurm"):
        get_scheduler("lsf")
    with pytest.raises(ConfigError):
        get_scheduler("status_parsers")  # a helper module is not a back-end


def test_the_contract_is_abstract() -> None:
    class Half(Scheduler):
        name, template, job_id_variable = "half", "half.tmpl", "HALF_ID"

        def parse_job_id(self, stdout: str) -> str:
            return stdout

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="does not set job_id_variable"):
        type("Nameless", (Scheduler,), {"name": "x"})


_SCHEDULER_WORDS = {"slurm", "pbs", "cobalt", "local"}
PACKAGE = SUBMISSION.parent


def _about_a_scheduler(side: ast.expr) -> bool:
    """``site.scheduler``, ``scheduler``, ``facts.name``, ``findings.scheduler.name``: what names a scheduler (a
    launcher, a site profile's file name or an environment variable compared with "local" does not)."""
    text = ast.unparse(side)
    return "scheduler" in text or text.endswith(".name") or text == "name"


def _names_compared(path: Path, root: Path = PACKAGE) -> list[str]:
    """``x == "slurm"``, ``x in ("pbs", ...)`` and ``{"cobalt": ...}`` in a module: scheduler facts by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        constants: list[ast.expr] = []
        if isinstance(node, ast.Compare) and any(map(_about_a_scheduler, [node.left, *node.comparators])):
            for side in [node.left, *node.comparators]:
                constants += side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
        elif isinstance(node, ast.Dict):
            constants += [k for k in node.keys if k is not None]
        for c in constants:
            if isinstance(c, ast.Constant) and c.value in _SCHEDULER_WORDS:
                found.append(f"{path.relative_to(root)}:{c.lineno}: {c.value!r}")
    return found


@pytest.mark.processes
def test_no_scheduler_is_known_by_name_outside_its_backend(tmp_path: Path) -> None:
    # the check itself finds the branches it is for, and not a launcher's or a profile file's "local"
    (tmp_path / "x.py").write_text('if site.scheduler != "slurm" or facts.name in ("pbs", "x"):\n    pass\n'
                                   'if launcher == "local" or name_or_path == "local":\n    pass\n')
    assert [h.split(": ")[-1] for h in _names_compared(tmp_path / "x.py", tmp_path)] == ["'slurm'", "'pbs'"]
    modules = [p for p in PACKAGE.rglob("*.py") if "schedulers" not in p.relative_to(PACKAGE).parts]
    assert len(modules) > 100
    found = [hit for path in modules for hit in _names_compared(path)]
    assert not found, "scheduler facts by name outside the back-ends:\n" + "\n".join(found)


class Echo(Scheduler):
    """A made-up scheduler whose status command is ``sh -c 'echo ...'`` (fallback after a missing command)."""

    name, template, job_id_variable = "echo", "echo.tmpl", "ECHO_JOB"

    def render_directives(self, job: object, site: object, placement: object, options: object) -> list[str]:
        return []

    def submit_argv(self, script_path: str, **kw: object) -> list[str]:
        return ["sh", script_path]

    def parse_job_id(self, stdout: str) -> str:
        return stdout.strip()

    def status_probes(self, jobs: Mapping[str, str]) -> list[list[StatusProbe]]:
        lines = "".join(f"{job} {'done' if run_dir.endswith('a') else 'busy'}\\n" for job, run_dir in jobs.items())
        return [[StatusProbe("echoq-missing", "live", ["hpctrain-no-such-echoq"], self.parse),
                 StatusProbe("echoq", "live", ["sh", "-c", f"printf '{lines}'"], self.parse)]]

    @staticmethod
    def parse(text: str) -> dict[str, JobStatus]:
        states = {"done": JobState.COMPLETED, "busy": JobState.RUNNING}
        return {job: JobStatus(job, states[word]) for job, word in (ln.split() for ln in text.splitlines())}

    def cancel_argv(self, job_id: str, run_dir: str) -> list[str]:
        return ["true"]

    def log_names(self, job_id: str) -> list[str]:
        return ["echo.out"]


def test_a_new_backend_is_found_and_polled_without_changes_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SCHEDULERS.loaded, "echo", Echo())  # as an installed package's entry point loads it
    echo = get_scheduler("echo")
    answer = poll_scheduler(LocalTransport(), echo, {"7": "/runs/a", "8": "/runs/b"})
    assert answer.sources == ("echoq",)  # the missing command was skipped along the chain
    assert answer.statuses is not None
    assert answer.statuses["7"].state is JobState.COMPLETED and answer.statuses["8"].state is JobState.RUNNING


def test_backend_facts_refuse_what_the_scheduler_cannot_do() -> None:
    local, cobalt, slurm = get_scheduler("local"), get_scheduler("cobalt"), get_scheduler("slurm")
    with pytest.raises(SchedulerError, match="local has no job arrays"):
        local.submit_argv("job.sh", array="0-1")
    with pytest.raises(SchedulerError, match="local cannot start a job afterok another"):
        local.submit_argv("job.sh", dependency=("afterok", "12"))
    with pytest.raises(SchedulerError, match=r"cobalt cannot start a job afternotok another \(it supports"):
        cobalt.submit_argv("job.sh", dependency=("afternotok", "12"))
    assert slurm.submit_argv("/r/job.sh", array="0-2", array_dir="/r/base") == [
        "sbatch", "--parsable", "--array=0-2", "--output=/r/base_%a/slurm-%A_%a.out",
        "--error=/r/base_%a/slurm-%A_%a.out", "/r/job.sh"]
    assert get_scheduler("pbs").launcher_for.__func__ is base.Scheduler.launcher_for


def test_local_limits_are_the_backends(tmp_path: Path) -> None:
    from hpctrain.config.job import load_job
    from hpctrain.config.site import SiteProfile, load_site

    repo = Path(__file__).resolve().parent.parent
    with pytest.raises(FitError, match="4 nodes requested but site 'local' \\(local\\) runs on at most 1"):
        base.place(load_job(repo / "jobs/ffn-local.yaml", nodes=4), load_site("local"))
    srun_here = SiteProfile(name="odd", scheduler="local", launcher="srun", node={"cores": 2, "memory_gb": 1})
    with pytest.raises(ConfigError, match="scheduler local starts ranks with local or mpiexec, not 'srun'"):
        base.place(load_job(repo / "jobs/ffn-local.yaml"), srun_here)


def test_the_local_controller_reads_the_scripts_directives(tmp_path: Path) -> None:
    from hpctrain.config.job import load_job
    from hpctrain.config.site import load_site
    from hpctrain.submission.render import render_script
    from hpctrain.submission.schedulers.local_controller import read_directives

    repo = Path(__file__).resolve().parent.parent
    job = load_job(repo / "jobs/ffn-local.yaml", walltime="00:03:00",
                   sets=["checkpoint.signal=TERM", "checkpoint.signal_lead_s=20", "checkpoint.max_requeues=4"])
    script = tmp_path / "job.sh"
    script.write_text(render_script(job, load_site("local"), run_dir=str(tmp_path),
                                    spec_path=str(tmp_path / "job.yaml")).text)
    opts = read_directives(script)
    assert (opts.walltime_s, opts.signal, opts.lead, opts.max_requeues) == (180, "TERM", 20, 4)
    script.write_text("#!/bin/bash\necho hi\n#LOCAL --walltime-s=5\n")  # after the first command: not read
    with pytest.raises(SystemExit):
        read_directives(script)


def test_a_zombie_supervisor_has_ended(tmp_path: Path) -> None:
    """Where PID 1 reaps no orphans (a CI container whose first process is a shell), an ended supervisor stays a
    zombie with its pid and start time: a continuation in its run directory must not be refused as 'still runs'.
    A real zombie: a child of this test that has exited and is not waited for yet."""
    import subprocess as sp

    child = sp.Popen(["sleep", "0.2"])
    started = local_controller._process_start_time(child.pid)
    assert started is not None
    (tmp_path / local_controller.PID_FILE).write_text(json.dumps({"pid": child.pid, "start_time": started}))
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert local_controller._process_start_time(child.pid) is None  # still in /proc, but ended
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    job = local_controller.start(script, tmp_path, walltime_s=60)
    assert job != str(child.pid)
    child.wait()
