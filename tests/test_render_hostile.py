"""Hostile strings in every text field a user controls: refused by the config layer, or rendered inertly.

For each example a site profile and a job spec are written as YAML with the payload in one field. Either
loading/rendering raises a ConfigError, or the script passes ``bash -n``, holds no directive line beyond its
own, and running it (fake ``srun``/``aprun``/``mpiexec``/``module`` on PATH that only record what they
receive) creates no canary file and hands every value through unchanged.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hpctrain.config.job import load_job
from hpctrain.config.site import load_site_file
from hpctrain.errors import ConfigError
from hpctrain.submission.render import render_script

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
]
FIELDS = ["name", "description", "env_value", "data_path", "model_args", "queue", "account", "directive",
          "venv", "module", "site_env_value"]

SITES: dict[str, dict[str, Any]] = {
    "slurm": {"scheduler": "slurm", "launcher": "srun"},
    "pbs": {"scheduler": "pbs", "launcher": "mpiexec", "filesystems": ["home"]},
    "cobalt": {"scheduler": "cobalt", "launcher": "aprun"},
}
FAKE = """#!/bin/bash
printf '%s\\0' "$@" >> "$RECORD_DIR/NAME.argv"
printf '%s' "${HOSTILE-}" > "$RECORD_DIR/NAME.env"
exit 0
"""


def _fake_bin(root: Path) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("srun", "aprun", "mpiexec", "module"):
        exe = bin_dir / name
        exe.write_text(FAKE.replace("NAME", name))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _documents(scheduler: str, field: str, payload: str, venv_home: Path) -> tuple[dict, dict]:
    site: dict[str, Any] = {
        "name": "hostile", **SITES[scheduler],
        "node": {"cores": 4, "memory_gb": 4},
        "queues": {"q": {"max_nodes": 1, "max_walltime": "01:00:00"}}, "default_queue": "q",
        "environment": {"modules": ["gcc/12"], "env": {"SITE_VAR": "1"}},
    }
    # A plug-in with no schema: its model_args and data are not checked before start, so hostile values there
    # reach the renderer (the built-in models' schemas would refuse most of them first).
    job: dict[str, Any] = {
        "name": "hostile-job", "model": "hostile_plugin:build",
        "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1},
        "resources": {"nodes": 1, "ranks_per_node": 2, "walltime": "00:05:00"},
        "env": {"HOSTILE": "benign"},
    }
    if field == "name":
        job["name"] = payload
    elif field == "description":
        job["description"] = payload
    elif field == "env_value":
        job["env"]["HOSTILE"] = payload
    elif field == "data_path":
        job["data"] = {"train": {"image": payload, "labels": payload + ":labels"}}
    elif field == "model_args":
        job["model_args"] = {"comment": payload, "list": [payload]}
    elif field == "queue":
        site["queues"] = {payload: {"max_nodes": 1, "max_walltime": "01:00:00"}}
        site["default_queue"] = payload
        job["resources"]["queue"] = payload
    elif field == "account":
        job["resources"]["account"] = payload
    elif field == "directive":
        site["directives"] = {"constraint": payload}
    elif field == "venv":
        site["environment"]["venv"] = payload
    elif field == "module":
        site["environment"]["modules"] = [payload]
    elif field == "site_env_value":
        site["environment"]["env"] = {"HOSTILE": payload}
        job["env"] = {}
    return site, job


def _read(path: Path) -> str:
    """A recorded file's exact text (no newline translation: payloads hold \\r)."""
    return path.read_bytes().decode("utf-8")


def _make_venv(venv: str, home: Path) -> None:
    """Create <venv>/bin/activate at the literal path the script will source, where the OS allows it."""
    path = str(home) + venv[len("$HOME"):] if venv.startswith("$HOME/") else \
        str(home) + venv[1:] if venv.startswith("~/") else venv
    try:
        target = Path(path) / "bin"
        if not target.resolve().is_relative_to(home.resolve()):
            return
        target.mkdir(parents=True, exist_ok=True)
        (target / "activate").write_text("ACTIVATED=yes\n")
    except (OSError, ValueError):
        pass


@pytest.mark.parametrize("field", FIELDS)
@settings(max_examples=12, deadline=None)
@given(scheduler=st.sampled_from(sorted(SITES)),
       template=st.sampled_from(TEMPLATES), prefix=st.text(max_size=8), suffix=st.text(max_size=8),
       home_prefix=st.sampled_from(["", "$HOME/", "~/"]))
def test_hostile_text_is_refused_or_inert(scheduler: str, field: str, template: str, prefix: str, suffix: str,
                                          home_prefix: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="hpctrain-hostile-"))
    try:
        canary = root / "pwned"
        payload = prefix + template.replace(CANARY, str(canary)) + suffix
        if field == "venv":
            payload = home_prefix + payload
        home = root / "home"
        home.mkdir()
        run_dir = root / "run"
        run_dir.mkdir()
        site_doc, job_doc = _documents(scheduler, field, payload, home)
        (root / "site.yaml").write_text(yaml.safe_dump(site_doc, allow_unicode=True))
        (root / "job.yaml").write_text(yaml.safe_dump(job_doc, allow_unicode=True))
        try:
            site = load_site_file(root / "site.yaml")
            job = load_job(root / "job.yaml")
            rendered = render_script(job, site, run_dir=str(run_dir), spec_path=str(run_dir / "job.yaml"),
                                     command=["true"])
        except ConfigError:
            event(f"refused: {field}")
            return  # refused with a message: fine
        event(f"rendered: {field}")
        text = rendered.text
        prefix_of = {"slurm": "#SBATCH", "pbs": "#PBS", "cobalt": "#COBALT"}[scheduler]

        # 1. bash can parse it
        syntax = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=10)
        assert syntax.returncode == 0, syntax.stderr

        # 2. directive lines only in the leading block, and exactly the back-end's own
        lines = text.splitlines()
        own = [ln for ln in lines[1:] if ln.startswith(prefix_of)]
        assert lines[1 : 1 + len(own)] == own
        assert not any(ln.lstrip().startswith(("#SBATCH", "#PBS", "#COBALT")) for ln in lines[1 + len(own):])
        assert not any("--wrap" in ln or "touch" in ln for ln in own)

        # 3. run it with recording stand-ins for the launcher and `module`: nothing else may run
        if field == "venv" and site.environment.venv:
            _make_venv(site.environment.venv, home)
        script = root / "job.sh"
        script.write_text(text)
        bin_dir = _fake_bin(root)
        records = root / "records"
        records.mkdir()
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "RECORD_DIR": str(records), "LANG": "C.UTF-8"}
        run = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, env=env,
                             cwd=root)
        assert not canary.exists(), f"payload ran: {payload!r}"
        launcher = rendered.launch_argv[0]
        venv_missing = field == "venv" and run.returncode != 0 and not (records / f"{launcher}.argv").exists()
        if venv_missing:
            event("venv path not creatable: script stopped at activation")
            return  # activation failed (the venv path cannot exist on this file system) and stopped the script
        assert run.returncode == 0, run.stderr
        event(f"ran to the launcher: {field}")
        recorded = _read(records / f"{launcher}.argv").split("\0")[:-1]
        assert recorded == rendered.launch_argv[1:]
        modules = _read(records / "module.argv").split("\0")[:-1]
        assert modules == [w for m in site.environment.modules for w in ("load", m)]
        want_env = job.env.get("HOSTILE", site.environment.env.get("HOSTILE"))
        assert _read(records / f"{launcher}.env") == want_env
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_harness_detects_an_injection(tmp_path: Path) -> None:
    """The canary check can fail: an unquoted payload in a script does create the file."""
    canary = tmp_path / "pwned"
    payload = f"$(touch {canary})"
    subprocess.run(["bash", "-c", f"export X={payload}"], check=True, timeout=10, env={"PATH": os.environ["PATH"]})
    assert canary.exists()
