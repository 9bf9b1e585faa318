"""The package ships the product: every top-level function and class in hpctrain/ is used by hpctrain itself.

A definition counts as used when its name appears anywhere in hpctrain/ outside its own body (a call, an import,
an attribute, a string naming it for a later import), in the package's data files (templates, YAML) or in
setup.cfg (entry points), or when a decorator registers it. What only tests and benchmarks use belongs in tests/
or hpctrain_bench/, not in what users install. Read statically, by name: a name used anywhere counts, so the
set found is what is certainly unused.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import hpctrain

PACKAGE = Path(hpctrain.__file__).resolve().parent
REPO = PACKAGE.parent
DATA_SUFFIXES = (".tmpl", ".yaml", ".yml", ".json", ".txt")
# Decorators that only shape a definition; any other decorator (a registry's) is a use.
SHAPING_DECORATORS = {"dataclass", "contextmanager", "lru_cache", "cache", "cached_property", "total_ordering",
                      "runtime_checkable", "final"}

# Unused by hpctrain itself on purpose, each with its reason (keyed by name: modules move).
EXCEPTIONS = {
    "__getattr__": "hpctrain/__init__.py's module __getattr__ (PEP 562): Python calls it for `hpctrain.X`",
    "read_records": "runtime/counting/counters.py: documented for users in docs/scaling.md (Counters API), the "
                    "reader of the per-rank records a run writes with HPCTRAIN_COUNTERS=1",
    "read_rank_nodes": "nodes/rank_nodes.py: the reader of rank-nodes.json for blame and the report (the ranks on "
                       "a blamed node); drop this line once they read it",
}


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _names(tree: ast.AST, skip: ast.AST | None = None) -> Counter[str]:
    """Every name ``tree`` mentions (names, attributes, imported names, words of strings), outside ``skip``."""
    found: Counter[str] = Counter()
    todo = [tree]
    while todo:
        node = todo.pop()
        if node is skip:
            continue
        if isinstance(node, ast.Name):
            found[node.id] += 1
        elif isinstance(node, ast.Attribute):
            found[node.attr] += 1
        elif isinstance(node, ast.alias):
            found[node.name.split(".")[-1]] += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(re.findall(r"\w+", node.value))
        todo += ast.iter_child_nodes(node)
    return found


def unused_in(trees: dict[str, ast.Module], data_words: set[str]) -> dict[str, list[str]]:
    """Name -> where it is defined (``file:line``), for every top-level function and class of ``trees`` (file ->
    module) that no module mentions outside its own body and no word of ``data_words`` names."""
    mentioned: Counter[str] = Counter()
    for tree in trees.values():
        mentioned += _names(tree)
    unused: dict[str, list[str]] = {}
    for where, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if any(_decorator_name(d) not in SHAPING_DECORATORS for d in node.decorator_list):
                continue  # registered by its decorator
            if mentioned[node.name] - _names(node)[node.name] <= 0 and node.name not in data_words:
                unused.setdefault(node.name, []).append(f"{where}:{node.lineno}")
    return unused


def unused_definitions() -> dict[str, list[str]]:
    """``unused_in`` over hpctrain/, its data files and setup.cfg."""
    trees = {str(path.relative_to(REPO)): ast.parse(path.read_text(encoding="utf-8"))
             for path in sorted(PACKAGE.rglob("*.py"))}
    data_words = set(re.findall(r"\w+", (REPO / "setup.cfg").read_text(encoding="utf-8")))
    for path in PACKAGE.rglob("*"):
        if path.suffix in DATA_SUFFIXES and path.is_file():
            data_words |= set(re.findall(r"\w+", path.read_text(encoding="utf-8", errors="replace")))
    return unused_in(trees, data_words)


def test_what_hpctrain_defines_hpctrain_uses() -> None:
    unused = unused_definitions()
    new = {name: where for name, where in unused.items() if name not in EXCEPTIONS}
    assert not new, ("used only outside the package (move to tests/ or hpctrain_bench/, delete, or add to "
                     f"EXCEPTIONS with a reason): {new}")
    stale = sorted(set(EXCEPTIONS) - set(unused))
    assert not stale, f"EXCEPTIONS names what hpctrain now uses or no longer defines: {stale}"


def test_the_check_finds_what_it_is_for() -> None:
    """Not vacuous: an unused function is found (a cached one too); one used by a call, an import in another
    module, a string, a registry or a data file is not."""
    mod = ("import functools\nREGISTRY = {}\ndef register(f):\n    REGISTRY[f.__name__] = f\n    return f\n"
           "def lonely():\n    return lonely\n"
           "def called():\n    return 1\nX = called()\n"
           "def imported():\n    return 2\n"
           "def named():\n    return 3\nNAME = 'pkg.mod:named'\n"
           "@register\ndef registered():\n    return 4\n"
           "@functools.lru_cache\ndef cached():\n    return cached()\n"
           "def in_a_template():\n    return 5\n")
    other = "from pkg.mod import imported\n"
    trees = {"pkg/mod.py": ast.parse(mod), "pkg/other.py": ast.parse(other)}
    assert unused_in(trees, {"in_a_template"}) == {"lonely": ["pkg/mod.py:6"], "cached": ["pkg/mod.py:20"]}
