"""YAML files found by name on a search path: an environment variable's directories, one under the user's config
home, then the directory shipped in the package; first match wins. Site profiles and job specs are found so."""

from __future__ import annotations

import os
from pathlib import Path

SUFFIXES = (".yaml", ".yml")


def search_path(variable: str, kind: str, shipped: Path) -> list[Path]:
    """``$variable``'s directories, ``$XDG_CONFIG_HOME/hpctrain/kind`` (``~/.config`` by default), ``shipped``."""
    dirs = [Path(p).expanduser() for p in os.environ.get(variable, "").split(os.pathsep) if p]
    config_home = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    dirs.append(config_home / "hpctrain" / kind)
    dirs.append(shipped)
    return dirs


def named_files(dirs: list[Path]) -> dict[str, Path]:
    """Every ``NAME.yaml`` (or ``.yml``) in ``dirs`` by NAME, the first directory's first; an unreadable or missing
    directory hides nothing else."""
    found: dict[str, Path] = {}
    for directory in dirs:
        try:
            paths = sorted(p for p in directory.glob("*.y*ml") if p.suffix in SUFFIXES) if directory.is_dir() else []
        except OSError:
            continue
        for path in paths:
            found.setdefault(path.stem, path)
    return found


def is_file(path: Path) -> bool:
    """``path.is_file()``, False where the OS refuses to look (a name too long, a permission)."""
    try:
        return path.is_file()
    except OSError:
        return False
