"""The package layout is the architecture: no module imports from a layer above it, and the two sides
(laptop/login node in ``hpctrain.submission``; inside the allocation in runtime/checkpoint/models/ffn) never
import each other. Read statically from the source (every import statement, function-level ones included).
"""

from __future__ import annotations

import ast
from pathlib import Path

import hpctrain

PACKAGE = Path(hpctrain.__file__).resolve().parent

# Layer of each top-level part of hpctrain; a module may import its own layer's parts only where listed.
LAYER = {"errors": 0, "exit_codes": 0, "text": 0, "files": 0, "launch_env": 0, "config": 0,
         "submission": 1, "runtime": 1, "checkpoint": 1, "models": 1, "ffn": 1,
         "planning": 2, "report": 2, "submitit_plugin": 2, "workflows": 2, "commands": 3, "cli": 4, "__main__": 5}
ALLOCATION_SIDE = {"runtime", "checkpoint", "models", "ffn"}
# planning reads runs through submission, never the allocation side; so does the submitit plug-in, whose
# in-job runner is torch-free (tests/test_submitit_plugin.py checks what it imports). workflows (the demo, a
# trained FFN segmenting and tuned on this machine) join the two sides, so they belong to neither.
LAPTOP_SIDE = {"submission", "planning", "report", "submitit_plugin"}
# Torch-free modules of the allocation side that the laptop reads too.
READ_ON_BOTH_SIDES = {"hpctrain.checkpoint.manifest"}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpctrain"):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("hpctrain"))
        out[module] = found
    return out


def test_every_top_level_part_has_a_layer() -> None:
    parts = {_part(m) for m in _imports()} - {""}
    assert parts <= set(LAYER), f"give these a layer in LAYER: {sorted(parts - set(LAYER))}"


def test_no_module_imports_from_a_layer_above_it() -> None:
    bad = []
    for module, deps in _imports().items():
        mine = _part(module)
        for dep in deps:
            theirs = _part(dep)
            if theirs and mine and LAYER[theirs] > LAYER[mine]:
                bad.append(f"{module} -> {dep}")
    assert not bad, "imports from a higher layer:\n" + "\n".join(sorted(bad))


def test_submission_side_and_allocation_side_do_not_import_each_other() -> None:
    bad = []
    for module, deps in _imports().items():
        mine = _part(module)
        for dep in deps:
            theirs = _part(dep)
            if dep in READ_ON_BOTH_SIDES:
                continue
            crosses = (mine in LAPTOP_SIDE and theirs in ALLOCATION_SIDE) or (
                mine in ALLOCATION_SIDE and theirs in LAPTOP_SIDE)
            if crosses:
                bad.append(f"{module} -> {dep}")
    assert not bad, "the two sides import each other:\n" + "\n".join(sorted(bad))


def test_config_imports_only_config_and_errors() -> None:
    bad = [f"{m} -> {d}" for m, deps in _imports().items() if _part(m) == "config"
           for d in deps if _part(d) not in ("config", "errors", "exit_codes", "text", "files", "")]
    assert not bad, "\n".join(sorted(bad))


def test_modules_read_on_both_sides_import_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import " + ", ".join(sorted(READ_ON_BOTH_SIDES)) +
            "; heavy = [m for m in ('torch', 'numpy', 'mpi4py') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
