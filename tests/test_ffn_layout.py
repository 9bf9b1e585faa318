"""The FFN package reads as modules with one job each: none over 600 lines, no import circle between them
(function-level imports included), no block of six lines written twice, and the inference settings declared once.
Read statically from the source."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import hpctrain

FFN = Path(hpctrain.__file__).resolve().parent / "ffn"
MAX_LINES = 600
BLOCK = 6


def _modules() -> dict[str, Path]:
    """Every module of the FFN package by its dotted name under ``hpctrain.ffn`` (``inference.canvas``)."""
    return {".".join(path.relative_to(FFN).with_suffix("").parts): path for path in sorted(FFN.rglob("*.py"))
            if path.stem != "__init__"}


def test_no_ffn_module_is_over_600_lines() -> None:
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules: {long}"


def _ffn_imports(path: Path) -> set[str]:
    """The FFN modules ``path`` imports, by dotted name under ``hpctrain.ffn`` (``from pkg import mod`` names
    ``pkg.mod``); a sub-package's name stands for its ``__init__``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpctrain.ffn."):
            module = node.module.removeprefix("hpctrain.ffn.")
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "hpctrain.ffn":
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("hpctrain.ffn.") for a in node.names if a.name.startswith("hpctrain.ffn."))
    return found


def test_no_import_circle_in_ffn() -> None:
    modules = _modules()
    graph = {name: _ffn_imports(path) & set(modules) for name, path in modules.items()}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        for dep in graph[name]:
            if dep in trail:
                cycles.append(" -> ".join([*trail[trail.index(dep):], dep]))
            elif dep not in done:
                visit(dep, [*trail, dep])
        done.add(name)

    done: set[str] = set()
    for name in graph:
        if name not in done:
            visit(name, [name])
    assert not cycles, "import circles:\n" + "\n".join(sorted(set(cycles)))


def test_training_and_inference_do_not_import_each_other() -> None:
    """Training (``ffn/training/``) and inference (``ffn/inference/``) share only what sits beside them (the model,
    volumes, label clean-up, FOV movement): neither imports the other (function-level imports included)."""
    apart = {"training": "inference", "inference": "training"}
    bad = [f"{name} -> {dep}" for name, path in _modules().items() if name.split(".")[0] in apart
           for dep in _ffn_imports(path) if dep.split(".")[0] == apart[name.split(".")[0]]]
    assert not bad, "\n".join(sorted(bad))


def test_the_checks_see_a_circle_and_a_repeated_block(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from hpctrain.ffn.b import x\nfrom hpctrain.ffn.inference import canvas\n")
    assert {"b", "inference.canvas"} <= _ffn_imports(tmp_path / "a.py")
    text = "\n".join(f"value_{i} = {i} * 2" for i in range(BLOCK))
    assert _repeated({"one.py": text, "two.py": "y = 1\n" + text})


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are code: no blanks, comments, imports or docstring quotes."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "import ", "from ", '"""')):
            out.append((number, stripped))
    return out


def _repeated(texts: dict[str, str]) -> list[str]:
    seen: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, text in texts.items():
        lines = _code_lines(text)
        for k in range(len(lines) - BLOCK + 1):
            seen[tuple(line for _, line in lines[k:k + BLOCK])].append(f"{name}:{lines[k][0]}")
    return [", ".join(where) for where in seen.values() if len(where) > 1]


def test_no_block_of_six_lines_is_written_twice_in_ffn() -> None:
    repeated = _repeated({str(path.relative_to(FFN)): path.read_text() for path in _modules().values()})
    assert not repeated, "blocks written twice (give them one home):\n" + "\n".join(repeated)


def test_the_inference_settings_are_declared_once() -> None:
    """Every inference setting has one declaration: a field of one stage group of ``InferenceConfig``. The job's
    flat ``data.eval.inference`` schema is derived from those groups (same keys, same descriptions, unset = the
    group's default), and no module under ``hpctrain/`` declares a setting's name as a field anywhere else."""
    from hpctrain.config.plugins.ffn_inference import STAGE_OF, STAGES, InferenceConfig, InferenceSettings

    assert set(InferenceConfig.model_fields) == set(STAGES)
    assert list(InferenceSettings.model_fields) == list(STAGE_OF)
    for key, stage in STAGE_OF.items():
        declared = STAGES[stage].model_fields[key]
        assert InferenceSettings.model_fields[key].description == declared.description, key
        assert InferenceSettings.model_fields[key].default is None, key
    assert InferenceConfig.from_mapping(InferenceSettings().model_dump(exclude_none=True)) == InferenceConfig()

    # Names other schemas own with another meaning: the model's geometry and normalisation (the checkpoint's, which
    # inference copies), the thresholds a tuning grid lists candidates of, and any runtime's device and precision.
    shared = {"fov", "deltas", "image_mean", "image_stddev", "move_threshold", "segment_threshold",
              "agglomerate_threshold", "device", "precision"}
    settings = set(STAGE_OF) - shared
    home = Path(hpctrain.__file__).resolve().parent / "config" / "plugins" / "ffn_inference.py"
    elsewhere = []
    for path in sorted(Path(hpctrain.__file__).resolve().parent.rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                fields = {t.target.id for t in node.body
                          if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
                if len(fields & settings) >= 2:
                    elsewhere.append(f"{path.name}: class {node.name} declares {sorted(fields & settings)}")
    assert not elsewhere, "inference settings declared a second time:\n" + "\n".join(elsewhere)


SCHEMAS = Path(hpctrain.__file__).resolve().parent / "config" / "plugins"


def _top_level_names(path: Path) -> set[str]:
    """Functions, classes and variables ``path`` defines at module level (loggers and ``__all__`` aside)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names - {"log", "__all__"}


def _defined_twice(paths: list[Path]) -> list[str]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for name in _top_level_names(path):
            where[name].append(path.name)
    return sorted(f"{name}: {', '.join(sorted(files))}" for name, files in where.items() if len(files) > 1)


def test_the_ffn_schemas_write_each_rule_once_and_import_without_a_circle() -> None:
    """The FFN's schema modules (``config/plugins/ffn*.py``) define each validator and type once, and import each
    other without a circle (function-level imports included: a deferred import only hides one)."""
    paths = sorted(SCHEMAS.glob("ffn*.py"))
    assert len(paths) >= 3
    assert not _defined_twice(paths), "defined twice:\n" + "\n".join(_defined_twice(paths))
    names = {f"hpctrain.config.plugins.{p.stem}": p for p in paths}
    graph = {name: {n.module for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
             & set(names) for name, path in names.items()}
    done: set[str] = set()

    def circle(name: str, trail: list[str]) -> list[str] | None:
        for dep in graph[name]:
            if dep in trail:
                return [*trail[trail.index(dep):], dep]
            if dep not in done and (found := circle(dep, [*trail, dep])):
                return found
        done.add(name)
        return None

    for name in graph:
        found = circle(name, [name])
        assert found is None, "import circle: " + " -> ".join(found or [])


def test_no_name_is_defined_in_two_ffn_modules() -> None:
    """One home per name in the FFN package: a helper (``logit``, ``clear_dust``) or an alias (``Position``) is
    defined once and imported where it is used."""
    paths = list(_modules().values())
    assert not _defined_twice(paths), "defined twice:\n" + "\n".join(_defined_twice(paths))
