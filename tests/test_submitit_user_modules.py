"""Callables from the user's own modules, submitted the way users run their code: a script run with
``python run.py`` beside ``mytools.py``, or code run from a directory holding ``mytools.py``.

Each user program is a separate Python process (its ``__main__`` and ``sys.path`` are what matter), submitting
to the ``local`` site: the job's Python is this one, so only where the job looks for modules differs. A
module the job would not find is refused before anything is registered or queued.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import submitit_support
from submitit_support import Places

from hpctrain.submission.registry import RunRegistry

places = submitit_support.places
fresh_watcher = submitit_support.fresh_watcher
pytestmark = pytest.mark.timeout(300)

MYTOOLS = textwrap.dedent("""
    import os


    def prepare(x):
        return {"value": x * 3, "module": __file__, "cwd": os.getcwd()}
""")
# The user's program: submits mytools.prepare and prints the outcome as one JSON line.
PROGRAM = textwrap.dedent("""
    import json, sys
    import submitit
    import mytools

    executor = submitit.AutoExecutor(sys.argv[1], cluster="hpctrain", hpctrain_run_root=sys.argv[2])
    executor.update_parameters(timeout_min=5)
    try:
        job = executor.submit(mytools.prepare, 14)
    except Exception as exc:
        print(json.dumps({"refused": f"{type(exc).__name__}: {exc}"}))
        raise SystemExit(0)
    try:
        print(json.dumps({"result": job.result()}))
    except Exception as exc:
        print(json.dumps({"job_error": f"{type(exc).__name__}: {exc}"}))
""")


def _user_program(places: Places, argv: list[str], cwd: Path) -> dict[str, object]:
    env = {**os.environ, "HPCTRAIN_HOME": str(places.home)}
    done = subprocess.run([sys.executable, *argv, str(places.folder), str(places.runs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _runs() -> list[object]:
    with RunRegistry() as reg:  # HPCTRAIN_HOME: the places fixture's, as the user program's
        return list(reg.list_runs())


@pytest.mark.processes
@pytest.mark.parametrize("started_in", ["project", "elsewhere"])
def test_a_module_beside_the_script_is_found_in_the_job(places: Places, started_in: str) -> None:
    """``python run.py`` with mytools.py beside it, started in its directory or another: the job puts the
    script's directory first on sys.path, as a submitit job started there has it, and the probe checked that."""
    project = places.root / "project"
    project.mkdir()
    (project / "mytools.py").write_text(MYTOOLS)
    (project / "run.py").write_text(PROGRAM)
    (places.root / "elsewhere").mkdir()
    outcome = _user_program(places, [str(project / "run.py")], places.root / started_in)
    assert "result" in outcome, outcome
    result = outcome["result"]
    assert isinstance(result, dict) and result["value"] == 42
    assert Path(str(result["module"])).resolve() == (project / "mytools.py").resolve()
    assert Path(str(result["cwd"])).parent == places.runs  # it ran in its run directory


@pytest.mark.processes
def test_a_module_found_only_in_the_submitters_directory_is_refused_before_anything_is_queued(
        places: Places) -> None:
    """Code run in a directory holding mytools.py (``python -c``, a notebook): this process imports mytools
    through its current directory, the job would not (it starts in its run directory). Refused at submit:
    nothing registered, no run directory, and the message says where mytools is and how to fix it."""
    work = places.root / "work"
    work.mkdir()
    (work / "mytools.py").write_text(MYTOOLS)
    outcome = _user_program(places, ["-c", PROGRAM], work)
    assert "refused" in outcome, outcome
    text = str(outcome["refused"])
    assert text.startswith("ConfigError: ") and "cannot import mytools, which the callable mytools.prepare needs" \
        in text
    assert "the job starts in its run directory" in text
    assert f"through the directory you submit from ({work.resolve()})" in text
    assert "cloudpickle.register_pickle_by_value(mytools)" in text
    assert _runs() == []
    assert not places.runs.exists()
