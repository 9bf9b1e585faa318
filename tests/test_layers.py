"""The package layout is the architecture: no module imports from a layer above it, and the two sides
(laptop/login node in ``hpctrain.submission``; inside the allocation in runtime/checkpoint/models/ffn) never
import each other. Read statically from the source (every import statement, function-level ones included).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import hpctrain

PACKAGE = Path(hpctrain.__file__).resolve().parent

# Layer of each top-level part of hpctrain; a module may import its own layer's parts only where listed.
LAYER = {"errors": 0, "exit_codes": 0, "text": 0, "files": 0, "run_files": 0, "launch_env": 0, "job_environment": 0,
         "node_lists": 0, "nodes": 0, "user_frame": 0, "config": 0, "memory_budget": 0,
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


@cache
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


def test_checkpoint_does_not_import_runtime() -> None:
    """The checkpoint store and session are handed the runtime's pieces (combiner, counts) through protocols."""
    bad = [f"{m} -> {d}" for m, deps in _imports().items() if _part(m) == "checkpoint"
           for d in deps if _part(d) == "runtime"]
    assert not bad, "\n".join(sorted(bad))


def _module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, not ``pkg.__init__``)."""
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PACKAGE.rglob("*.py")}


def _imported_modules(module: str, path: Path, names: dict[str, Path]) -> set[str]:
    """The package's modules ``module`` imports: every import statement, function-level ones and those under
    ``if TYPE_CHECKING:`` included (an import for annotations only still makes the two modules know each other);
    relative imports resolved; ``from pkg import mod`` names ``pkg.mod``; importing ``a.b.c`` also runs the
    packages ``a.b`` above it, except the ones ``module`` itself sits in (they are already being imported)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    direct: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([target] if target else []))
            if target in names:
                direct |= ({f"{target}.{a.name}" for a in node.names} & names.keys()) or {target}
        elif isinstance(node, ast.Import):
            direct |= {a.name for a in node.names} & names.keys()
    found = set(direct)
    for dep in direct:
        parts = dep.split(".")
        for end in range(2, len(parts)):
            above = ".".join(parts[:end])
            if above in names and module != above and not module.startswith(above + "."):
                found.add(above)
    return found - {module}


@cache
def _package_graph() -> dict[str, set[str]]:
    """Which of the package's modules each module imports (``_imported_modules``)."""
    names = _module_names()
    return {module: _imported_modules(module, path, names) for module, path in names.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module: each is one or more import circles."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in order:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], order[dep])
        if low[node] == order[node]:
            part: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def test_the_circle_finder_finds_circles_through_packages_and_annotations(tmp_path: Path) -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "hpctrain"
    (pkg / "p").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "p" / "__init__.py").write_text("from hpctrain.p.b import B\n")
    (pkg / "p" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from hpctrain.q import Q\n")
    (pkg / "q.py").write_text("def f():\n    from .p import b\n")
    names = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
             for p in pkg.rglob("*.py")}
    graph = {module: _imported_modules(module, path, names) for module, path in names.items()}
    assert graph["hpctrain.q"] == {"hpctrain.p", "hpctrain.p.b"}
    assert graph["hpctrain.p.b"] == {"hpctrain.q"}
    assert _circles(graph) == [["hpctrain.p", "hpctrain.p.b", "hpctrain.q"]]


def test_no_import_circle_in_the_package() -> None:
    """Not one, at any depth: a deferred (function-level) import or an annotation-only one does not hide it."""
    graph = _package_graph()
    assert len(graph) > 200
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_discovery_imports_no_concrete_backend() -> None:
    """Generic discovery asks the back-ends through the contract (schedulers/base.py): a back-end's reader lives in
    its own module or package, and nothing in submission/discovery/ imports one (function-level imports too)."""
    allowed = {"hpctrain.submission.schedulers.base", "hpctrain.submission.schedulers.state",
               "hpctrain.submission.schedulers.status_parsers"}
    imports = _imports()
    discovery = [m for m in imports if m.startswith("hpctrain.submission.discovery")]
    assert len(discovery) >= 7
    bad = [f"{m} -> {d}" for m in discovery for d in imports[m]
           if d.startswith("hpctrain.submission.schedulers") and d not in allowed]
    assert not bad, "\n".join(sorted(bad))
    readers = [m for m in imports if m.startswith("hpctrain.submission.schedulers.") and m.endswith(".discovery")]
    assert {"hpctrain.submission.schedulers.slurm.discovery", "hpctrain.submission.schedulers.pbs.discovery",
            "hpctrain.submission.schedulers.cobalt.discovery"} <= set(readers)


def test_config_imports_only_config_and_the_lowest_layer() -> None:
    bad = [f"{m} -> {d}" for m, deps in _imports().items() if _part(m) == "config"
           for d in deps if _part(d) not in ("config", "errors", "exit_codes", "text", "files", "launch_env",
                                             "job_environment", "node_lists", "user_frame", "")]
    assert not bad, "\n".join(sorted(bad))


def test_modules_read_on_both_sides_import_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import " + ", ".join(sorted(READ_ON_BOTH_SIDES)) +
            "; heavy = [m for m in ('torch', 'numpy', 'mpi4py') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_package_does_not_import_its_measuring_instruments() -> None:
    """hpctrain_bench is not in the wheel: nothing in hpctrain may import it."""
    bad = [f"{m} -> {d}" for m, deps in _imports().items() for d in deps if d.split(".")[0] == "hpctrain_bench"]
    assert not bad, "\n".join(sorted(bad))


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
LONG_REASON = "# longer than 80 lines:"


def oversized(source: str, name: str) -> list[str]:
    """What in one module's ``source`` is over the size limits: the module itself, and each function whose
    ``def`` (or first decorator) is not preceded by a ``# longer than 80 lines: REASON`` comment."""
    lines = source.splitlines()
    found = [f"{name}: {len(lines)} lines"] if len(lines) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            reason = lines[first - 2].strip().startswith(LONG_REASON) if first >= 2 else False
            if length > MAX_FUNCTION_LINES and not reason:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_the_size_check_finds_a_long_function_and_takes_a_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def long():\n{body}", "m.py") == ["m.py:1 long: 81 lines"]
    assert oversized(f"{LONG_REASON} one table, read top to bottom\ndef long():\n{body}", "m.py") == []
    assert oversized("x = 1\n" * (MAX_MODULE_LINES + 1), "m.py") == [f"m.py: {MAX_MODULE_LINES + 1} lines"]


def test_no_module_over_600_lines_and_no_function_over_80() -> None:
    """Small modules with one job: a module that grows past 600 lines is split by concern, a function past 80
    lines is split into its steps, or says beside it why it reads better whole."""
    found = [problem for path in sorted(PACKAGE.rglob("*.py"))
             for problem in oversized(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "\n".join(found)
