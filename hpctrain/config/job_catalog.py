"""Job specs by name: the examples shipped with hpctrain and the user's own, found as site profiles are.

Wherever a job spec is accepted (``render``, ``submit``, ``jobs validate``, ``plan``, ``hpctrain.submit``), an
existing file is read as given; a bare name (no ``/``, no ``.yaml``) is looked up as ``NAME.yaml`` in
``$HPCTRAIN_JOBS``, ``~/.config/hpctrain/jobs/`` and the shipped examples (``hpctrain/jobs/``, package data in
any installed copy; the checkout's top-level ``jobs/`` links to it). A path that names no file is an error that
lists the names, so ``jobs/ffn-theta.yaml`` outside a checkout says that ``ffn-theta`` is the shipped example.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from hpctrain.config.search_path import SUFFIXES, is_file, named_files, search_path
from hpctrain.config.yamlio import read_config_text
from hpctrain.errors import ConfigError
from hpctrain.files import write_atomic


def shipped_jobs_dir() -> Path:
    """The example job specs shipped with hpctrain (package data)."""
    return Path(__file__).resolve().parents[1] / "jobs"


def job_search_path() -> list[Path]:
    """Directories searched for ``NAME.yaml``, first match wins."""
    return search_path("HPCTRAIN_JOBS", "jobs", shipped_jobs_dir())


def available_jobs() -> dict[str, Path]:
    """Every job spec name on the search path, mapped to its file (first match wins)."""
    return named_files(job_search_path())


def is_bare_name(name_or_path: str) -> bool:
    """A name to look up, not a path: no directory separator and no YAML suffix."""
    return bool(name_or_path) and "/" not in name_or_path and os.sep not in name_or_path \
        and not name_or_path.endswith(SUFFIXES)


def _names_hint(jobs: dict[str, Path], wanted: str) -> str:
    guess = difflib.get_close_matches(wanted, list(jobs), n=1)
    names = ", ".join(sorted(jobs))
    lead = f"did you mean {guess[0]!r}? " if guess else ""
    return (f"{lead}job specs by name: {names} (`hpctrain jobs list`; `hpctrain jobs copy NAME` starts your own "
            "from one)")


def locate_job(name_or_path: str | Path) -> Path:
    """The file of the job spec ``name_or_path``: the file itself if it exists, else the spec of that name on the
    search path; neither is a ConfigError listing the names."""
    text = str(name_or_path)
    candidate = Path(text).expanduser()
    if is_file(candidate) or (not is_bare_name(text) and os.path.lexists(candidate)):
        return candidate  # something other than a file there is refused by its reader, naming what it is
    jobs = available_jobs()
    if is_bare_name(text):
        if text in jobs:
            return jobs[text]
        raise ConfigError(f"no job spec named {text!r} and no such file", hint=_names_hint(jobs, text))
    stem = candidate.stem
    if stem in jobs and candidate.suffix in SUFFIXES:
        raise ConfigError("file not found", path=text,
                          hint=f"the example {stem!r} ships with hpctrain: give its name ({stem}) or "
                               f"`hpctrain jobs copy {stem}` to edit a copy")
    raise ConfigError("file not found", path=text, hint=_names_hint(jobs, stem))


def copy_job(name: str, directory: Path, *, force: bool = False) -> Path:
    """Copy the job spec ``name`` into ``directory`` as ``NAME.yaml``, whole or not at all; an existing file there is
    kept (a ConfigError) unless ``force``."""
    source = locate_job(name)
    if not directory.is_dir():
        raise ConfigError("not a directory", path=str(directory), hint="create it first, or name another one")
    target = directory / f"{source.stem}.yaml"
    if target.exists() and not force:
        raise ConfigError("exists already; it is kept", path=str(target),
                          hint="edit it, copy into another directory, or --force to replace it")
    try:
        write_atomic(target, read_config_text(source))
    except OSError as exc:
        raise ConfigError(f"cannot write: {exc.strerror or exc}", path=str(target)) from None
    return target
