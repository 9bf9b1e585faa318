"""Before a job waits in a queue or starts here: can its interpreter, in the site's environment, import what the
ranks need?

The batch script prepares the job's shell (modules, the site's setup lines, exports, the venv) and starts
``PYTHON -m hpctrain run``; a profile without ``environment.venv`` starts the login node's ``python3``, which
usually has no hpctrain, and the job would end "FAILED exit code 1" after its wait. On a site without a scheduler
(``local``) ``PYTHON`` is the submitting interpreter itself, and a laptop install without the training stack
would fail at start with ``ModuleNotFoundError: torch``. ``check_interpreter`` runs the script's own environment
lines and then the job's interpreter where the job will run (the login node over the submission's transport, or
this machine), from a directory that is not the caller's (the job starts in its run directory), and asks it
(``importlib.util.find_spec``, nothing imported) for hpctrain and the modules the ranks import. A yes is cached
per machine, interpreter and environment (``interpreters.json`` in the user's cache directory, for
``CACHE_TTL_S``), so the next submission starts no process; a no refuses before anything is registered or queued,
naming the interpreter, what is missing and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.staging import effective
from hpctrain.errors import ConfigError
from hpctrain.files import write_atomic
from hpctrain.submission.module_probe import MARKER, parse_answer, probe_argv
from hpctrain.submission.shell import quote, quote_path

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import SiteProfile
    from hpctrain.submission.transport import Transport

PROBE_TIMEOUT_S = 120.0
CACHE_TTL_S = 24 * 3600  # an environment changes rarely; a day bounds how long a removed venv goes unnoticed
CACHE_FILE = "interpreters.json"
# What `hpctrain run` imports on every rank of a built-in model (setup.cfg: the base install and [train]).
BASE_MODULES = ("hpctrain", "pydantic", "yaml", "numpy", "torch")
# The pip requirement that provides each module, for the fix; hpctrain[train] brings the training stack with it.
_PIP_NAMES = {"hpctrain": "'hpctrain[train]'", "yaml": "PyYAML"}
_WITH_HPCTRAIN = {"pydantic", "yaml", "numpy", "torch", "h5py"}
_HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf")



def runtime_modules(job: JobSpec, backend: str) -> list[str]:
    """The modules the job's ranks import: hpctrain and its training stack, mpi4py for the mpi backend, the
    reader of the data files (h5py, zarr)."""
    from hpctrain.submission.staging import job_data_paths

    modules = list(BASE_MODULES)
    if backend == "mpi":
        modules.append("mpi4py")
    paths = list((job_data_paths(job) or {}).values())
    if any(p.lower().endswith(_HDF5_SUFFIXES) for p in paths):
        modules.append("h5py")
    if any(p.rstrip("/").endswith(".zarr") for p in paths):
        modules.append("zarr")
    return modules


def probe_script(environment: list[str], python: str, modules: list[str], workdir: str | None = None) -> str:
    """The batch script's environment lines under its ``set -eo pipefail``, then the interpreter asked for
    ``modules`` (from ``workdir``, where given), in a subshell; the script always ends with one JSON line carrying
    MARKER (the answer, or the exit status of the line that failed) and exits 0."""
    ask = " ".join(["exec", quote_path(python), *(quote(a) for a in probe_argv(modules)), "2>&1"])
    move = [f"cd {quote_path(workdir)}"] if workdir is not None else []
    return "\n".join(["(", "set -eo pipefail", *move, *environment, ask, ")",
                      f"status=$?; [ \"$status\" -eq 0 ] || printf '{{\"{MARKER}\": \"failed\", \"status\": %s}}\\n' "
                      '"$status"'])


def cache_path() -> Path:
    """``$HPCTRAIN_HOME/cache/interpreters.json``, else ``interpreters.json`` in the user's cache directory."""
    if os.environ.get("HPCTRAIN_HOME"):
        return Path(os.environ["HPCTRAIN_HOME"]).expanduser() / "cache" / CACHE_FILE
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpctrain" / CACHE_FILE


def _cache_key(host: str, ssh_config: str | None, python: str, environment: Any, modules: list[str]) -> str:
    text = json.dumps([host, ssh_config, python, environment, sorted(modules)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cached(key: str, now: float) -> bool:
    entry = _read_cache(cache_path()).get(key)
    return isinstance(entry, dict) and isinstance(entry.get("checked_at"), int | float) and \
        0 <= now - entry["checked_at"] < CACHE_TTL_S


def _remember(key: str, now: float, host: str, python: str) -> None:
    path = cache_path()
    entries = {k: v for k, v in _read_cache(path).items()
               if isinstance(v, dict) and isinstance(v.get("checked_at"), int | float)
               and now - v["checked_at"] < CACHE_TTL_S}
    entries[key] = {"checked_at": now, "host": host, "python": python}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(entries, indent=1, sort_keys=True))
    except OSError:
        pass  # no cache here: the next submission asks again


def check_interpreter(transport: Transport, job: JobSpec, site: SiteProfile, *, python: str | None = None,
                      now: float | None = None) -> bool:
    """Refuse (ConfigError) when the job's interpreter where the job runs (the transport's login node, or this
    machine for a site without a scheduler), after the site's environment setup, cannot import what the ranks
    need. ``python``: the submitting interpreter, which a profile without ``environment.python`` or ``venv`` runs
    the job with on this machine. Returns True when it asked the interpreter, False when the cache (or a
    container, whose interpreter is inside the image) answered."""
    from hpctrain.submission.render import environment_lines, launch_plan, python_for
    from hpctrain.submission.schedulers.base import get_scheduler, place

    if effective(site.staging, job.staging).environment == "container":
        return False
    here = get_scheduler(site.scheduler).runs_here
    placement = place(job, site)
    python = python_for(site, python)
    modules = runtime_modules(job, placement.backend)
    env = site.environment
    mpi_modules = list(site.mpi.modules) if placement.backend == "mpi" else []
    key = _cache_key(transport.host, getattr(transport, "ssh_config", None), python,
                     [env.model_dump(mode="json"), mpi_modules, job.env], modules)
    now = time.time() if now is None else now
    if _cached(key, now):
        return False
    plan = launch_plan(job, site, placement, python)
    # here, the job starts in its run directory: the caller's (a checkout, say) is not on its path
    script = probe_script(environment_lines(job, site, placement, plan, python), python, modules,
                          workdir="/" if here else None)
    done = transport.run(["bash", "-c", script], timeout=PROBE_TIMEOUT_S, check=False)
    answer = parse_answer(done.stdout)
    where = f"{python} on {transport.host}"
    fix = _fix_here if here else _fix
    if answer is None or answer.get(MARKER) == "failed":
        output = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip() and MARKER not in ln]
        detail = output[-1].strip() if output else "no output"
        status = answer.get("status") if answer else done.returncode
        raise ConfigError(f"the job's interpreter {where} did not run after the environment setup of site "
                          f"{site.name!r} (exit status {status}: {detail})",
                          key=None if here else "environment.venv", hint=fix(site, python, ["hpctrain"]))
    missing = [str(m) for m in answer.get("missing") or []]
    if missing:
        raise ConfigError(f"the job's interpreter {where} cannot import {', '.join(missing)} after the "
                          f"environment setup of site {site.name!r}: the ranks would fail as they start",
                          key=None if here else "environment.venv", hint=fix(site, python, missing))
    _remember(key, now, transport.host, python)
    return True


def install_source() -> str:
    """What ``pip install`` names for hpctrain: the checkout this hpctrain was installed from (README: hpctrain is
    installed from a checkout), else the project's name."""
    root = Path(__file__).resolve().parents[2]
    return str(root) if (root / "setup.cfg").is_file() else "hpctrain"


def _fix_here(site: SiteProfile, python: str, missing: list[str]) -> str:
    """The fix on this machine: the training stack (and the one-machine MPI) for the interpreter the job runs."""
    requirement = quote(f"{install_source()}[train,local]")
    extra = [_PIP_NAMES.get(m, m) for m in missing if m not in _WITH_HPCTRAIN and m not in ("hpctrain", "mpi4py")]
    chosen = ("environment.python" if site.environment.python else "environment.venv" if site.environment.venv
              else None)
    where = f" (site {site.name!r} names it in {chosen})" if chosen else ""
    return f"install the training stack for it{where}: {python} -m pip install " + " ".join([requirement, *extra])


def _fix(site: SiteProfile, python: str, missing: list[str]) -> str:
    env = site.environment
    if "hpctrain" in missing:
        missing = [m for m in missing if m not in _WITH_HPCTRAIN]
    packages = " ".join(_PIP_NAMES.get(m, m) for m in missing)
    if env.venv is None and env.python is None:
        return (f"set environment.venv in site {site.name!r} to a virtual environment on the login node's shared "
                f"file system where hpctrain is installed (python3 -m venv DIR && DIR/bin/pip install "
                f"{packages}), or environment.python to such an interpreter")
    mpi = (" (mpi4py built against the site's MPI: docs/runtime.md, 'Building mpi4py against the site MPI')"
           if "mpi4py" in missing else "")
    return f"install them for that interpreter: {python} -m pip install {packages}{mpi}"
