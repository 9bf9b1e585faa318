"""Clearing away what never ran (``hpctrain runs --prune``): old failed or unsubmitted runs and dry-run folders.

Runs still ``created`` or ``submit_failed`` after a given age leave the registry with their local record
folder (``<registry dir>/runs/RUN_ID``), and ``--dry-run`` folders (``<registry dir>/dry-run/ID``) older
than that age are deleted. Nothing on a cluster and no run directory is touched.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hpctrain.errors import ConfigError
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.registry_rows import Run

_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_AGE = re.compile(r"([0-9]{1,6})([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DEFAULT_AGE = "7d"


def parse_age(text: str) -> timedelta:
    """``30m``, ``12h``, ``7d``, ``2w`` (a number and one unit) as a timedelta."""
    match = _AGE.fullmatch(text.strip())
    if not match:
        raise ConfigError(f"--older-than {text!r}: expected a number and a unit, like 12h, 7d or 2w",
                          key="--older-than")
    return timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])


@dataclass(frozen=True)
class PrunePlan:
    """What ``--prune`` removes: registry rows of runs that never ran, and local folders."""

    runs: list[Run]
    folders: list[Path]


def plan_prune(registry: RunRegistry, older_than: timedelta, *, now: datetime | None = None) -> PrunePlan:
    """What a prune would remove now (nothing is changed)."""
    from hpctrain.submission.api import dry_run_dir
    from hpctrain.submission.run_record import record_dir

    now = now or datetime.now(UTC)
    cutoff = now - older_than
    runs = registry.never_ran(cutoff)
    # A run id from a damaged registry ("../x") must not reach outside the records folder.
    folders = [record_dir(registry, r.run_id) for r in runs if _RUN_ID.fullmatch(r.run_id)]
    folders = [f for f in folders if f.is_dir() and not f.is_symlink()]
    dry_root = dry_run_dir(registry)
    if dry_root.is_dir():
        for child in sorted(dry_root.iterdir()):
            try:
                old = child.lstat().st_mtime < cutoff.timestamp()
            except OSError:
                continue
            if old and child.is_dir() and not child.is_symlink():
                folders.append(child)
    return PrunePlan(runs, folders)


def apply_prune(registry: RunRegistry, plan: PrunePlan) -> list[str]:
    """Remove what ``plan`` lists; returns the folders that could not be removed, with why."""
    registry.delete_runs(r.run_id for r in plan.runs)
    problems: list[str] = []
    for folder in plan.folders:
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{folder}: {exc.strerror or exc}")
    return problems


def age_text(created: str, now: float | None = None) -> str:
    """How long ago an ISO time was, roughly (``3d``, ``5h``)."""
    try:
        then = datetime.strptime(created[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return "?"
    seconds = max((now or time.time()) - then, 0)
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
