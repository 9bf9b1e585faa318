"""Hostile text in every string field of a site profile and a job spec, on every scheduler (issue 11).

The fields are found by walking the pydantic models (``string_fields``), so a field added later is covered
without touching this file; ``environment.setup`` and ``environment.collectives.setup`` are left out: they are
the site admin's own shell, run as written (docs/rendering.md). For each example a site profile and a job spec
are written as YAML with the text in one field. Either loading or rendering refuses it with ONE line naming the
file and the key, or the script passes ``bash -n``, holds no directive line beyond its own, and, run with
recording stand-ins for the launchers, schedulers, ``module`` and the compute nodes' Python on PATH (they only
write their argv to a file), never creates the canary file and hands every value through unchanged. No real
launcher or scheduler runs here: the stand-ins are the point (what the script would execute is what they record).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import stat
import subprocess
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.site import Network, SiteProfile, load_site_file
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submission.render import render_script

Path_ = tuple[str | int, ...]
KEY, VALUE = "<key>", "<value>"  # a mapping's key, or the value under its (first) key
# The fields that are shell by design: the site admin's own lines, run as written.
TRUSTED = {("environment", "setup", 0), ("environment", "collectives", "setup", 0)}

CANARY = "CANARY"  # replaced by a real path per example
TEMPLATES = [
    'x"; touch CANARY; echo "',
    "'; touch CANARY; echo '",
    "$(touch CANARY)",
    "`touch CANARY`",
    "a\ntouch CANARY\n",
    "\n#SBATCH --wrap='touch CANARY'\n",
    "\n#PBS -W x\n#COBALT -q y\ntouch CANARY",
    "${IFS}$(touch${IFS}CANARY)",
    "a;touch CANARY;#",
    "ünï\u2028touch CANARY\u2029✓",
    "\r\ntouch CANARY\r\n",
    "~/$(touch CANARY)",
    "$HOME/`touch CANARY`",
    "A" * 3000 + "$(touch CANARY)",
    "x' \"$(touch CANARY)\" '",
    "\\'; touch CANARY; \\'",
    "CRAY MPICH') $(touch CANARY) ('",
    "\x00$(touch CANARY)",
    "x\x85touch CANARY",
]
# Text hypothesis draws besides the templates: every shell, YAML and line-breaking character, and plain words.
ALPHABET = list("\n\r\t\x00\x0b\x0c\x1b\x7f'\"`$(){}[];|&<>*?~#!\\ =:,@/%+.-_\u2028\u2029\x85éü✓aZ09")

SCHEDULERS: dict[str, dict[str, Any]] = {
    "slurm": {"scheduler": "slurm", "launcher": "srun"},
    "pbs": {"scheduler": "pbs", "launcher": "mpiexec", "filesystems": ["home"]},
    "cobalt": {"scheduler": "cobalt", "launcher": "aprun", "filesystems": ["home"]},
    "local": {"scheduler": "local", "launcher": "mpiexec"},
}
DIRECTIVE_PREFIX = {"slurm": "#SBATCH", "pbs": "#PBS", "cobalt": "#COBALT", "local": "#LOCAL"}
STANDINS = ("srun", "aprun", "mpiexec", "module", "qsub", "qdel", "sbatch", "scontrol", "scancel", "python3")
STANDIN = """#!/bin/bash
printf '%s\\0' "$@" >> "$RECORD_DIR/NAME.argv"
printf '%s' "${HOSTILE-}" > "$RECORD_DIR/NAME.env"
exit 0
"""


# ------------------------------------------------------------------------------------------- the fields


def string_fields(model: type[BaseModel], prefix: Path_ = ()) -> list[Path_]:
    """Every place in ``model`` a text value can go: str fields (names, words, walltimes), Literal choices,
    list elements, mapping keys and values, and the free-form ``model_args``/``data`` mappings."""
    found: list[Path_] = []
    for name, field in model.model_fields.items():
        found += _walk(field.annotation, (*prefix, name))
    return [f for f in dict.fromkeys(found) if f not in TRUSTED]


def _walk(annotation: Any, path: Path_) -> list[Path_]:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [p for arg in typing.get_args(annotation) if arg is not type(None) for p in _walk(arg, path)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return string_fields(annotation, path)
    if origin is dict:
        _, value = typing.get_args(annotation)
        return [(*path, KEY), *_walk(value, (*path, VALUE))]
    if origin is list:
        return _walk(typing.get_args(annotation)[0], (*path, 0))
    if annotation is str or annotation is Any:
        return [path]
    if origin is typing.Literal and any(isinstance(a, str) for a in typing.get_args(annotation)):
        return [path]
    return []


SITE_FIELDS = string_fields(SiteProfile)
JOB_FIELDS = string_fields(JobSpec)
FIELDS = [("site", f) for f in SITE_FIELDS] + [("job", f) for f in JOB_FIELDS]


def test_the_field_walk_finds_every_text_field() -> None:
    """The walk is what makes the property test cover "every string field": it must see these."""
    for field in [("name",), ("mpi", "expected_library"), ("filesystems", 0), ("queues", KEY),
                  ("queues", VALUE, "directives", VALUE), ("environment", "env", KEY), ("environment", "venv")]:
        assert field in SITE_FIELDS, field
    for field in [("name",), ("description",), ("env", VALUE), ("resources", "walltime"), ("checkpoint", "dir"),
                  ("model_args", VALUE), ("data", KEY)]:
        assert field in JOB_FIELDS, field
    assert ("environment", "setup", 0) not in SITE_FIELDS
    assert ("environment", "collectives", "setup", 0) not in SITE_FIELDS
    assert ("environment", "collectives", "env", KEY) in SITE_FIELDS
    assert len(SITE_FIELDS) + len(JOB_FIELDS) >= 60


# ------------------------------------------------------------------------------------------- documents


def base_documents(scheduler: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A site and a job that render on ``scheduler``, with every mapping and list the fields reach filled."""
    note = "notify" if scheduler == "cobalt" else "comment"  # a text option on each scheduler's allow-list
    network: dict[str, Any] = {"topology": "dragonfly"}
    network.update({k: 1.0 for k, f in Network.model_fields.items() if f.is_required()})
    site: dict[str, Any] = {
        "name": "hostile", **copy.deepcopy(SCHEDULERS[scheduler]),
        "node": {"cores": 4, "memory_gb": 4, "cpu": "x86"},
        "queues": {"q": {"max_nodes": 1, "max_walltime": "01:00:00", "node": {"cpu": "x86"},
                         "directives": {note: "q"}, "source": "a page, read today",
                         "walltime_by_nodes": [{"min_nodes": 1, "max_nodes": 1, "max_walltime": "01:00:00"}]}},
        "default_queue": "q", "directives": {note: "site"}, "guessed": ["node.cores"],
        "launcher_args": [], "environment": {"modules": ["gcc/12"], "env": {"SITE_VAR": "1"}},
        "network": network, "mpi": {"modules": ["mpich"], "expected_library": "MPICH"},
    }
    job: dict[str, Any] = {
        # A plug-in with no schema: its model_args and data are not checked before the ranks start, so
        # hostile values there reach the renderer (the built-in models' schemas refuse most of them first).
        "name": "hostile-job", "model": "hostile_plugin:build", "model_args": {"text": "t"}, "data": {"text": "t"},
        "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1, "combiner": {"name": "mean", "bin_len": {"conv": 50}}},
        "resources": {"nodes": 1, "ranks_per_node": 2, "walltime": "00:05:00"},
        "env": {"HOSTILE": "benign"},
    }
    if scheduler != "local":  # the local scheduler takes no per-job directives: the base job must render
        job["resources"]["directives"] = {note: "job"}
    return site, job


def put(doc: dict[str, Any], field: Path_, payload: str) -> None:
    """Write ``payload`` at ``field`` of ``doc``: a mapping's key is renamed (the queue the default points
    at stays the default), a mapping's value replaces the one under its first key, a list gets one element (a
    list of mappings gets its first mapping, created where the base document has none)."""
    node: Any = doc
    parents: list[tuple[Any, Any]] = []
    for i, part in enumerate(field[:-1]):
        key = next(iter(node)) if part == VALUE else part
        empty = [] if isinstance(field[i + 1], int) else {}
        if isinstance(node, list):  # an element inside a list (a queue's walltime bins): the list grows to it
            node.extend(type(empty)() for _ in range(key + 1 - len(node)))
        elif key not in node:
            node[key] = empty
        parents.append((node, key))
        node = node[key]
    last = field[-1]
    if last in (KEY, VALUE) and not node:  # a mapping the base document leaves empty gets one entry
        node["k"] = "v"
    if last == KEY:
        old = next(iter(node))
        node[payload] = node.pop(old)
        if field == ("queues", KEY):
            doc["default_queue"] = payload
    elif last == VALUE:
        node[next(iter(node))] = payload
    elif isinstance(last, int):
        node[:] = [payload]
    else:
        node[last] = payload


# ------------------------------------------------------------------------------------------- running


def _standins(root: Path) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in STANDINS:
        exe = bin_dir / name
        exe.write_text(STANDIN.replace("NAME", name))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _read_argv(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").split("\0")[:-1]


def _activate_path(venv: str, home: Path) -> Path:
    for prefix in ("$HOME/", "${HOME}/", "~/"):
        if venv.startswith(prefix):
            return home / venv[len(prefix):].lstrip("/") / "bin" / "activate"
    return Path(venv.rstrip("/")) / "bin" / "activate"


def _home_path(path: str, home: Path) -> Path:
    """``path`` as the batch shell resolves it with HOME=home (``~``, ``$HOME``, ``${HOME}`` lead)."""
    for prefix in ("$HOME", "${HOME}", "~"):
        if path == prefix or path.startswith(prefix + "/"):
            return home / path[len(prefix):].lstrip("/")
    return Path(path)


def _as_shell_reads(word: str, home: Path) -> str:
    """A word written by ``quote_path`` as bash reads it back: a leading ``~``/``$HOME``/``${HOME}`` is ``home``."""
    match = re.match(r"(?:~|\$HOME|\$\{HOME\})(?=/|$)", word)
    if not match:
        return word
    rest = word[match.end():].lstrip("/")
    return f"{home}/{rest}" if rest else str(home)


def _make_venv(venv: str, home: Path) -> bool:
    """Create <venv>/bin/activate where the script will source it, if that lies under the temp home."""
    try:
        activate = _activate_path(venv, home)
        if not activate.resolve().is_relative_to(home.resolve()):
            return False
        activate.parent.mkdir(parents=True, exist_ok=True)
        activate.write_text("ACTIVATED=yes\n")
        return True
    except (OSError, ValueError):
        return False


def check_example(root: Path, scheduler: str, side: str, field: Path_, payload: str) -> str:
    """Load, render and run one example; returns what happened (for hypothesis' statistics)."""
    canary = root / "pwned"
    payload = payload.replace(CANARY, str(canary))
    home, run_dir = root / "home", root / "run"
    home.mkdir()
    run_dir.mkdir()
    site_doc, job_doc = base_documents(scheduler)
    put(site_doc if side == "site" else job_doc, field, payload)
    site_file, job_file = root / "site.yaml", root / "job.yaml"
    site_file.write_text(yaml.safe_dump(site_doc, allow_unicode=True), encoding="utf-8")
    job_file.write_text(yaml.safe_dump(job_doc, allow_unicode=True), encoding="utf-8")
    bin_dir = _standins(root)
    try:
        site = load_site_file(site_file)
        job = load_job(job_file)
        rendered = render_script(job, site, run_dir=str(run_dir), spec_path=str(run_dir / "job.yaml"),
                                 python=str(bin_dir / "python3"))
    except HpctrainError as exc:
        assert isinstance(exc, ConfigError), f"{type(exc).__name__} is not a configuration error: {exc}"
        text = str(exc)
        assert "\n" not in text and text == text.strip(), f"not one line: {text!r}"
        mine = str(site_file if side == "site" else job_file)
        # A job that no longer fits the changed site is the job's error: either file may be named then.
        assert exc.path in (mine, str(job_file), str(site_file)), f"names no file: {text!r}"
        assert text.startswith(f"{exc.path}:") and exc.key, f"names no key: {text!r}"
        return f"refused ({exc.path.rsplit('/', 1)[-1]})"
    assert not canary.exists()
    text = rendered.text

    syntax = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr

    prefix = DIRECTIVE_PREFIX[scheduler]
    lines = text.splitlines()
    own = [ln for ln in lines[1:] if ln.startswith(prefix + " ")]
    assert lines[1 : 1 + len(own)] == own, "directive lines must all come first"
    rest = lines[1 + len(own):]
    assert not any(ln.lstrip().startswith(tuple(DIRECTIVE_PREFIX.values())) for ln in rest), "a directive moved"
    assert not any("--wrap" in ln or "touch" in ln for ln in own)

    venv = site.environment.venv
    if venv:
        _make_venv(venv, home)
    script = root / "job.sh"
    script.write_text(text, encoding="utf-8")
    records = root / "records"
    records.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "RECORD_DIR": str(records), "LANG": "C.UTF-8"}
    run = subprocess.run(["bash", str(script)], capture_output=True, timeout=60, env=env, cwd=root)
    assert not canary.exists(), f"the payload ran: {payload!r}"
    launcher = rendered.launch_argv[0]
    if venv and not _activate_path(venv, home).is_file():
        assert run.returncode != 0 and not (records / f"{launcher}.argv").exists()
        return "stopped at a venv that cannot exist here"
    workdir = job.resources.workdir
    if workdir is not None and not _home_path(workdir, home).is_dir():
        assert run.returncode != 0 and not (records / f"{launcher}.argv").exists()
        return "stopped at a working directory that does not exist"
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    # Every launch word is written as a path: a leading ~ or $HOME is the batch shell's home (a venv under it).
    assert _read_argv(records / f"{launcher}.argv") == [_as_shell_reads(w, home) for w in rendered.launch_argv[1:]]
    modules = [*site.environment.modules, *site.mpi.modules]
    assert _read_argv(records / "module.argv") == [w for m in modules for w in ("load", m)]
    want = job.env.get("HOSTILE", site.environment.env.get("HOSTILE", ""))
    assert (records / f"{launcher}.env").read_bytes().decode("utf-8") == want
    return "ran to the launcher"


@pytest.mark.processes
@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scheduler=st.sampled_from(sorted(SCHEDULERS)), where=st.sampled_from(FIELDS),
       payload=st.one_of(st.sampled_from(TEMPLATES),
                         st.text(alphabet=st.sampled_from(ALPHABET), max_size=24),
                         st.tuples(st.text(alphabet=st.sampled_from(ALPHABET), max_size=6),
                                   st.sampled_from(TEMPLATES)).map("".join)))
def test_any_text_in_any_field_is_refused_in_one_line_or_inert(scheduler: str, where: tuple[str, Path_],
                                                              payload: str) -> None:
    side, field = where
    root = Path(tempfile.mkdtemp(prefix="hpctrain-hostile-"))
    try:
        outcome = check_example(root, scheduler, side, field, payload)
        event(f"{side}: {outcome}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("payload", [p for p in TEMPLATES if "\x00" not in p and "A" * 100 not in p])
def test_expected_library_is_data(tmp_path: Path, scheduler: str, payload: str) -> None:
    """Issue 11, item 1: ``mpi.expected_library`` ran code on every scheduler; now it is quoted data."""
    assert check_example(tmp_path, scheduler, "site", ("mpi", "expected_library"), payload) == "ran to the launcher"


def test_the_harness_detects_an_injection(tmp_path: Path) -> None:
    """The canary check can fail: an unquoted payload in a script does create the file."""
    canary = tmp_path / "pwned"
    payload = f"$(touch {canary})"
    subprocess.run(["bash", "-c", f"export X={payload}"], check=True, timeout=10, env={"PATH": os.environ["PATH"]})
    assert canary.exists()


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("field", [("resources", "workdir"), ("resources", "reservation"),
                                   ("resources", "directives", KEY), ("resources", "directives", VALUE)])
@pytest.mark.parametrize("payload", ['x"; touch CANARY; echo "', "$(touch CANARY)", "a\ntouch CANARY\n",
                                     "/w/$(touch CANARY)", "/w'; touch CANARY; '", "~/`touch CANARY`",
                                     "/w\n#SBATCH --wrap='touch CANARY'", "$HOME/w x"])
def test_per_job_scheduler_options_are_refused_or_inert(tmp_path: Path, scheduler: str, field: Path_,
                                                       payload: str) -> None:
    """Issue 14: the job's own scheduler options (working directory, reservation, directives) on every scheduler,
    each with text that would run code if it reached a script unquoted."""
    outcome = check_example(tmp_path, scheduler, "job", field, payload)
    if field == ("resources", "workdir") and payload.startswith(("/", "~/", "$HOME/")) and "\n" not in payload:
        # Absolute text is a valid directory name: quoted, it is only a directory that does not exist.
        assert outcome == "stopped at a working directory that does not exist"
    else:
        assert outcome.startswith("refused"), outcome
