"""Names that once had several homes in the package have one: a reader who meets ``write_atomic`` or ``Registry``
knows which one it is without looking at the import."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import hpctrain

PACKAGE = Path(hpctrain.__file__).resolve().parent
# name -> the one module that defines it at top level
ONE_HOME = {
    "write_atomic": "hpctrain/files.py",  # atomic_path's rule; the checkpoint's hashed write is write_hashed
    "Registry": "hpctrain/config/backends.py",  # the plug-in registry; the run registry is RunRegistry
    "Checkpoint": "hpctrain/checkpoint/manifest.py",  # the run registry's record of one is CheckpointRecord
    "split_marked_sections": "hpctrain/submission/marked_sections.py",  # the status poll's and the probe's
}


def _top_level_definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found[node.name].append(path.relative_to(PACKAGE.parent).as_posix())
    return found


def test_each_name_is_defined_in_one_module() -> None:
    found = _top_level_definitions()
    assert {name: found.get(name, []) for name in ONE_HOME} == {name: [home] for name, home in ONE_HOME.items()}


def test_names_of_removed_duplicates_are_gone() -> None:
    """``split_sections`` (two readers of one format) and ``merge_status`` (a merge production did not use)."""
    found = _top_level_definitions()
    assert not found.get("split_sections") and not found.get("merge_status")
