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
LAYER = {"errors": 0, "exit_codes": 0, "text": 0, "files": 0, "run_files": 0, "launch_env": 0, "job_environment": 0,
         "node_lists": 0, "user_frame": 0, "config": 0, "memory_budget": 0,
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


def test_checkpoint_does_not_import_runtime() -> None:
    """The checkpoint store and session are handed the runtime's pieces (combiner, counts) through protocols."""
    bad = [f"{m} -> {d}" for m, deps in _imports().items() if _part(m) == "checkpoint"
           for d in deps if _part(d) == "runtime"]
    assert not bad, "\n".join(sorted(bad))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (imports for annotations never run)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)
    return out


def _submission_graph() -> dict[str, set[str]]:
    """Which submission modules each submission module imports when it runs (function-level imports included;
    ``from pkg import mod`` names ``pkg.mod``)."""
    root = PACKAGE / "submission"
    names = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        deps: set[str] = set()
        for node in _run_time_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in names:
                subs = {f"{node.module}.{a.name}" for a in node.names} & names.keys()
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & names.keys()
        graph[module] = deps - {module}
    return graph


def test_no_import_circle_in_submission() -> None:
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the check itself finds a circle
    graph = _submission_graph()
    assert len(graph) > 40
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


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


def test_no_import_circle_in_submission_counting_annotations() -> None:
    """The circle check again with the imports made for annotations only (``if TYPE_CHECKING:``): a module that
    imports another at run time is not imported back even for its types (discovery's probe is handed the
    back-ends instead of finding them)."""
    root = PACKAGE / "submission"
    names = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in names:
                deps |= {f"{node.module}.{a.name}" for a in node.names} & names.keys() or {node.module}
        graph[module] = deps - {module}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
