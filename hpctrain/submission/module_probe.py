"""What an interpreter somewhere else can import: a few lines of Python run by that interpreter (on a login node,
in a job's directory) before anything is queued. ``find_spec`` imports nothing but the parents of dotted names."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from typing import Any

MARKER = "hpctrain-module-probe"

# argv[1]: a JSON list of directories put first on sys.path (as the job will have them); argv[2:]: module names.
# One JSON line answers: the interpreter, its version, the modules it cannot find.
FIND_MODULES = f"""import importlib.util, json, sys
sys.path[0:0] = json.loads(sys.argv[1])
missing = []
for name in sys.argv[2:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing.append(name)
print(json.dumps({{"{MARKER}": "answer", "python": sys.executable, "version": list(sys.version_info[:2]),
                  "missing": missing}}))
"""


def probe_argv(modules: Sequence[str], sys_path: Sequence[str] = ()) -> list[str]:
    """The arguments after ``PYTHON``: ``-c FIND_MODULES SYS_PATH_JSON MODULE...``."""
    return ["-c", FIND_MODULES, json.dumps(list(sys_path)), *modules]


def parse_answer(stdout: str) -> dict[str, Any] | None:
    """The newest line of ``stdout`` that carries MARKER, as a mapping; None when there is none or it is broken."""
    for line in reversed(stdout.splitlines()):
        if MARKER in line:
            try:
                answer = json.loads(line)
            except ValueError:
                return None
            return answer if isinstance(answer, dict) else None
    return None


def import_location(name: str) -> str | None:
    """Where ``import name`` finds the package (its directory) or module (its origin) in this process, without
    importing it; None where it is not found."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return next(iter(spec.submodule_search_locations))
    return spec.origin
