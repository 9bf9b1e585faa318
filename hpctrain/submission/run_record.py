"""What hpctrain keeps about a run beside the registry, so any later process can reach it again.

``<registry dir>/runs/RUN_ID/`` holds what was submitted — ``job.yaml``, ``job.sh``, the resolved site profile
``site.yaml`` (so ``resume``/``status``/``cancel`` never need the profile file or name again), ``submit.json``
(scheduler, ssh config, step count, requeue budget) — and ``progress.json``, the newest metrics record a
poll saw (so ``hpctrain runs`` shows the progress of runs that have ended).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain import files
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submission.registry import Registry, Run

if TYPE_CHECKING:
    from hpctrain.config.site import SiteProfile

META_FILE = "submit.json"
SITE_FILE = "site.yaml"
PROGRESS_FILE = "progress.json"


def record_dir(registry: Registry, run_id: str) -> Path:
    """Local directory beside the registry holding what was submitted for a run."""
    return Path(registry.path).parent / "runs" / run_id


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """``hpctrain.files.write_atomic`` with the parent made; a failure is an HpctrainError naming the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        files.write_atomic(path, text, mode=mode)
    except OSError as exc:
        raise HpctrainError(f"cannot write {path}: {exc.strerror}", hint="free space or check permissions") from None


@dataclass(frozen=True)
class RunMeta:
    """How to reach a run again from a later process (kept in ``submit.json``). ``no_requeue``: why the queue lets
    the job not requeue itself (it stops at its checkpoint), None where it may."""

    scheduler: str
    ssh_config: str | None = None
    total_steps: int | None = None
    max_requeues: int | None = None
    no_requeue: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def read_meta(registry: Registry, run: Run) -> RunMeta:
    """The run's submit.json; when it is gone, the scheduler of its recorded (or named) site profile."""
    try:
        data = json.loads((record_dir(registry, run.run_id) / META_FILE).read_text(encoding="utf-8"))
        return RunMeta(**{k: v for k, v in data.items() if k in RunMeta.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return RunMeta(scheduler=run_site(registry, run).scheduler)


def dump_site(site: SiteProfile) -> str:
    """The resolved profile as YAML that loads back to the same profile (``extends`` already applied)."""
    import yaml

    return yaml.safe_dump(site.model_dump(mode="json", exclude_none=True, exclude={"extends"}), sort_keys=False)


def run_site(registry: Registry, run: Run) -> SiteProfile:
    """The site profile a run was submitted with: its recorded copy, else the profile of that name today."""
    from hpctrain.config.site import load_site, load_site_file

    recorded = record_dir(registry, run.run_id) / SITE_FILE
    if recorded.is_file():
        return load_site_file(recorded)
    try:
        return load_site(run.site)
    except ConfigError as exc:
        raise ConfigError(f"run {run.run_id} has no recorded site profile ({recorded}) and the profile it names "
                          f"cannot be loaded: {exc}", key="site",
                          hint=f"put the profile of site {run.site!r} on the search path (`hpctrain sites list`)"
                          ) from None


def save_progress(registry: Registry, run_id: str, record: dict[str, Any]) -> None:
    """Keep the newest metrics record a poll saw (written only when it changed)."""
    path = record_dir(registry, run_id) / PROGRESS_FILE
    text = json.dumps(record, sort_keys=True)
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    try:
        write_atomic(path, text)
    except HpctrainError:
        pass  # progress is a convenience: a full disk must not fail a status poll


def saved_progress(registry: Registry, run_id: str) -> dict[str, Any] | None:
    """The metrics record kept by ``save_progress`` (None when no poll saw one)."""
    try:
        record = json.loads((record_dir(registry, run_id) / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
