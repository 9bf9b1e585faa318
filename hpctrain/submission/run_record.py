"""What hpctrain keeps about a run beside the registry, so any later process can reach it again.

``<registry dir>/runs/RUN_ID/`` holds what was submitted — ``job.yaml``, ``job.sh``, the resolved site profile
``site.yaml`` (so ``resume``/``status``/``cancel`` never need the profile file or name again), ``submit.json``
(scheduler, ssh config, step count, requeue budget, spare nodes) — and ``progress.json``, the newest metrics record any
poll saw and whether it was read after the job ended (so ``hpctrain runs`` shows the progress of runs that have
ended).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain import files
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import Run

if TYPE_CHECKING:
    from hpctrain.config.site import SiteProfile

META_FILE = "submit.json"
SITE_FILE = "site.yaml"
PROGRESS_FILE = "progress.json"


def record_dir(registry: RunRegistry, run_id: str) -> Path:
    """Local directory beside the registry holding what was submitted for a run."""
    return Path(registry.path).parent / "runs" / run_id


def write_record_file(path: Path, text: str, mode: int = 0o644) -> None:
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
    spare_nodes: int = 0  # nodes asked for beyond the training nodes (a slow node can be left out then)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def read_meta(registry: RunRegistry, run: Run) -> RunMeta:
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


def run_site(registry: RunRegistry, run: Run) -> SiteProfile:
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


@dataclass(frozen=True)
class KeptProgress:
    """The newest metrics record any poll saw; ``after_end_of``: the job whose end that poll had seen before it
    read the record (the job's last record then: nobody needs to read it again), None when it was read while the
    job ran (or by an hpctrain that did not say)."""

    record: dict[str, Any]
    after_end_of: str | None = None


def kept_progress(registry: RunRegistry, run_id: str) -> KeptProgress | None:
    """What ``save_progress`` kept (None when no poll saw a record); a bare record is what older versions kept."""
    try:
        data = json.loads((record_dir(registry, run_id) / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    record, after_end_of = data.get("metrics"), data.get("after_end_of")
    if isinstance(record, dict) and "after_end_of" in data:
        return KeptProgress(record, after_end_of if isinstance(after_end_of, str) else None)
    return KeptProgress(data)


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _positions(a: dict[str, Any], b: dict[str, Any]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Where two records of a run's metrics.jsonl stand, comparable: by rank 0's time when both carry one (a
    resumed run starts again at an earlier step), then by step."""
    keys = ("time", "step") if _number(a, "time") is not None and _number(b, "time") is not None else ("step",)

    def position(r: dict[str, Any]) -> tuple[float, ...]:
        return tuple(-math.inf if (v := _number(r, k)) is None else v for k in keys)

    return position(a), position(b)


def newer_progress(new: KeptProgress, kept: KeptProgress | None) -> KeptProgress:
    """Of two observations of a run's metrics, the one to keep: the later record; the same record read again
    after its job's end becomes marked so."""
    if kept is None:
        return new
    new_at, kept_at = _positions(new.record, kept.record)
    if new_at > kept_at or (new_at == kept_at and new.after_end_of not in (None, kept.after_end_of)):
        return new
    return kept


def save_progress(registry: RunRegistry, run_id: str, record: dict[str, Any], *,
                  after_end_of: str | None = None) -> dict[str, Any]:
    """Keep ``record`` (a metrics record a poll read; ``after_end_of``: the job whose end that poll had seen first)
    unless a newer one is kept already, and return the record kept.

    Polls of several processes answer out of order (a record read while the job ran may come after one read
    after its end), so progress only moves forward; the compare and the write hold the registry's lock.
    """
    path = record_dir(registry, run_id) / PROGRESS_FILE
    new = KeptProgress(record, after_end_of)
    try:
        with registry.locked():
            kept = kept_progress(registry, run_id)
            chosen = newer_progress(new, kept)
            if chosen is not kept:
                write_record_file(path, json.dumps({"metrics": chosen.record, "after_end_of": chosen.after_end_of},
                                              sort_keys=True))
            return chosen.record
    except HpctrainError:
        # progress is a convenience: a full disk or a busy registry must not fail a status poll
        return newer_progress(new, kept_progress(registry, run_id)).record


def saved_progress(registry: RunRegistry, run_id: str) -> dict[str, Any] | None:
    """The metrics record kept by ``save_progress`` (None when no poll saw one)."""
    kept = kept_progress(registry, run_id)
    return kept.record if kept else None
