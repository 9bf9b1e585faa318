"""A normal (not editable) install works: the wheel built from this tree, installed into a fresh venv, lists
the shipped site profiles, shows one, runs a 2-rank job on the default ``local`` site to completion and runs
submitit's README example through the ``hpctrain`` executor — all from a directory outside the repository.

Reinstalling torch into the fresh venv would cost ~900 MB, so the fresh venv sees the project venv's
third-party packages through a ``.pth`` path line placed after its own site-packages. A path line adds the
directory only: the editable install's finder, which a ``.pth`` *import* line in that directory starts, never
runs. The first test checks that the wheel's hpctrain, not the repository's, is the one imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.config import site as site_module
from hpctrain.config.site import embedded_local_site, load_site, load_site_file
from hpctrain.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
# What a checkout of hpctrain holds for a build (setup.cfg, pyproject.toml, the instruments beside the package);
# the wheel is built from a copy of these so that the build writes nothing into the shared working tree (build/,
# hpctrain.egg-info).
SOURCE_ENTRIES = ("hpctrain", "hpctrain_bench", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in")
# The smallest real training job: the digits CNN (data bundled with scikit-learn), 2 ranks, 2 steps.
TINY_JOB = """name: tiny
model: resnet
model_args: {channels: 4, blocks: 1}
train: {steps: 2, batch_per_rank: 2, lr: 0.01, log_every: 1}
resources: {nodes: 1, ranks_per_node: 2, threads_per_rank: 1, walltime: "00:10:00"}
"""
# submitit's README example, with the executor docs/submitit.md names (cluster="hpctrain", default site local).
SUBMITIT_EXAMPLE = """import submitit

def add(a, b):
    return a + b

executor = submitit.AutoExecutor(folder="log_test", cluster="hpctrain")
executor.update_parameters(timeout_min=5)
job = executor.submit(add, 5, 7)
output = job.result()
assert output == 12
print("submitit result:", output)
"""


@dataclass(frozen=True)
class FreshVenv:
    root: Path
    site_packages: Path
    cwd: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def hpctrain(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.root / "bin" / "hpctrain"), *args, timeout=timeout)


def _checked(out: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    assert out.returncode == 0, f"{what} exited {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    return out


def _build_wheel(work: Path) -> Path:
    src = work / "src"
    src.mkdir()
    for name in SOURCE_ENTRIES:
        entry = REPO / name
        if entry.is_dir():
            shutil.copytree(entry, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif entry.exists():
            shutil.copy2(entry, src / name)
    dist = work / "dist"
    _checked(subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                             "--no-index", "-w", str(dist), str(src)], cwd=work, capture_output=True, text=True,
                            timeout=300, stdin=subprocess.DEVNULL), "pip wheel")
    (wheel,) = dist.glob("hpctrain-*.whl")
    return wheel


def test_the_default_local_site_is_the_shipped_local_yaml() -> None:
    shipped = load_site_file(REPO / "site_configs" / "local.yaml")
    assert embedded_local_site() == shipped
    assert load_site(None) == shipped and load_site("local") == shipped
    assert shipped.launcher == "local"


def test_an_install_without_its_profiles_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_module, "shipped_sites_dir", lambda: tmp_path / "site_configs")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("HPCTRAIN_SITES", raising=False)
    with pytest.raises(ConfigError) as raised:
        load_site(None)
    assert str(raised.value) == (f"{tmp_path / 'site_configs' / 'local.yaml'}: hpctrain's shipped site profiles "
                                 "are missing (no local.yaml); reinstall hpctrain: its package data "
                                 "hpctrain/site_configs/*.yaml holds them")


def test_the_wheel_ships_the_package_and_not_its_measuring_instruments(tmp_path: Path) -> None:
    """hpctrain_bench (the wire interposer, the syscall tracer, the simulator, the published studies) sits beside
    the package in the checkout the wheel is built from, and stays out of the wheel."""
    assert (REPO / "hpctrain_bench" / "__init__.py").is_file()
    with zipfile.ZipFile(_build_wheel(tmp_path)) as wheel:
        names = wheel.namelist()
    assert "hpctrain/__init__.py" in names and "hpctrain/cli.py" in names
    tops = {name.split("/", 1)[0] for name in names}
    assert "hpctrain_bench" not in tops, sorted(tops)
    assert not [n for n in names if n.endswith(".c")], [n for n in names if n.endswith(".c")]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshVenv]:
    work = tmp_path_factory.mktemp("packaging")
    wheel = _build_wheel(work)
    root = work / "venv"
    _checked(subprocess.run([sys.executable, "-m", "venv", str(root)], capture_output=True, text=True,
                            timeout=300, stdin=subprocess.DEVNULL), "python -m venv")
    python = str(root / "bin" / "python")
    _checked(subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", f"{wheel}[submitit]"],
                            cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL),
             "pip install of the wheel")
    site_packages = Path(_checked(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True,
        text=True, timeout=60, stdin=subprocess.DEVNULL), "sysconfig").stdout.strip())
    # After the venv's own site-packages (path lines are appended in order): torch, pydantic, submitit, ...
    (site_packages / "zz-project-venv-packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    cwd = work / "user"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "HPCTRAIN_SITES",
                        "HPCTRAIN_REGISTRY")}
    env.update(PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(root),
               HPCTRAIN_HOME=str(work / "home"), HPCTRAIN_RUNS=str(cwd / "runs"),
               XDG_CONFIG_HOME=str(work / "config"), HPCTRAIN_COUNTERS="1")
    yield FreshVenv(root=root, site_packages=site_packages, cwd=cwd, env=env)


@pytest.mark.slow
def test_the_fresh_venv_imports_the_installed_wheel(fresh: FreshVenv) -> None:
    probe = ("import json, sys, hpctrain, importlib.metadata as md\n"
             "from hpctrain.config.site import shipped_sites_dir\n"
             "print(json.dumps({'file': hpctrain.__file__, 'path': sys.path, 'sites': str(shipped_sites_dir()),\n"
             "                  'dist': str(md.distribution('hpctrain').locate_file(''))}))")
    found = json.loads(_checked(fresh.run(fresh.python, "-c", probe), "import probe").stdout)
    assert Path(found["file"]).is_relative_to(fresh.site_packages), found["file"]
    assert Path(found["sites"]).is_relative_to(fresh.site_packages), found["sites"]
    assert Path(found["dist"]) == fresh.site_packages, found["dist"]
    path = [Path(p) if p else fresh.cwd for p in found["path"]]
    ahead = path[:path.index(fresh.site_packages)]
    assert not [p for p in ahead if p.is_relative_to(REPO)], found["path"]
    assert REPO not in path, found["path"]
    shipped = {p.name for p in (REPO / "hpctrain" / "site_configs").glob("*.yaml")}
    installed = fresh.site_packages / "hpctrain" / "site_configs"
    assert {p.name for p in installed.glob("*.yaml") if not p.is_symlink()} == shipped


@pytest.mark.slow
def test_sites_list_and_show_read_the_shipped_profiles(fresh: FreshVenv) -> None:
    listed = _checked(fresh.hpctrain("sites", "list"), "hpctrain sites list").stdout
    for name in ("perlmutter", "local", "polaris", "theta", "aurora", "frontier", "ci-slurm"):
        assert name in listed, listed
    shown = _checked(fresh.hpctrain("sites", "show", "perlmutter"), "hpctrain sites show perlmutter")
    assert "perlmutter" in shown.stdout and "slurm" in shown.stdout, shown.stdout
    assert "known sites" not in shown.stdout + shown.stderr


@pytest.mark.slow
def test_the_example_jobs_and_the_demo_job_ship_with_the_package(fresh: FreshVenv) -> None:
    probe = "from hpctrain.workflows.demo import DEMO_JOB; print(DEMO_JOB)"
    demo_job = Path(_checked(fresh.run(fresh.python, "-c", probe), "demo job probe").stdout.strip())
    assert demo_job.is_relative_to(fresh.site_packages) and demo_job.is_file(), demo_job
    installed = fresh.site_packages / "hpctrain" / "jobs"
    assert {p.name for p in installed.glob("*.yaml")} == {p.name for p in (REPO / "jobs").glob("*.yaml")}
    shown = _checked(fresh.hpctrain("jobs", "show", str(demo_job)), "hpctrain jobs show")
    assert "ffn-local" in shown.stdout, shown.stdout


@pytest.mark.slow
def test_a_two_rank_job_runs_to_completion_on_the_default_local_site(fresh: FreshVenv) -> None:
    (fresh.cwd / "tiny.yaml").write_text(TINY_JOB)
    _checked(fresh.hpctrain("submit", "tiny.yaml", "--wait", timeout=600), "hpctrain submit --wait")
    (run_dir,) = [p for p in (fresh.cwd / "runs").iterdir() if p.is_dir()]
    steps = [json.loads(line).get("step") for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if line.strip()]
    assert 2 in steps, steps
    records = sorted((run_dir / "counters").glob("rank-*.json"))
    assert len(records) == 2, records
    for record in records:
        modules = json.loads(record.read_text())["interpreter"]["modules"]
        assert Path(modules["hpctrain"]).is_relative_to(fresh.site_packages), modules


@pytest.mark.slow
def test_the_submitit_readme_example_runs_through_the_hpctrain_executor(fresh: FreshVenv) -> None:
    (fresh.cwd / "example.py").write_text(SUBMITIT_EXAMPLE)
    out = _checked(fresh.run(fresh.python, "example.py", timeout=600), "the submitit example")
    assert "submitit result: 12" in out.stdout


def readme_laptop_lines(readme: str) -> list[str]:
    """The commands of the README's first block under "Using it", comments and continuation lines dropped."""
    section = readme[readme.index("## Using it"):]
    block = section[section.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")]
    commands = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [c for c in commands if c and not c.startswith("#")]


def test_the_readme_block_is_read_line_by_line() -> None:
    lines = readme_laptop_lines((REPO / "README.md").read_text())
    assert lines[0] == "hpctrain sites list"
    assert all(line.startswith("hpctrain ") for line in lines), lines
    assert any(line.startswith("hpctrain plan ffn-theta") and "--set grad_bytes=" in line for line in lines)
    assert not [line for line in lines if "jobs/" in line], "a README line names a checkout path"


@pytest.mark.slow
def test_the_readme_laptop_commands_run_as_written_outside_the_checkout(fresh: FreshVenv) -> None:
    """Every line of the README's laptop block, in order, in the fresh venv from a directory outside the checkout;
    RUN is the run id the block's own `submit` printed."""
    run_id = None
    for line in readme_laptop_lines((REPO / "README.md").read_text()):
        if "RUN" in line.split():
            assert run_id is not None, f"{line!r} comes before the README's submit"
            line = " ".join(run_id if word == "RUN" else word for word in line.split())
        out = _checked(fresh.run("bash", "-c", line, timeout=600), line)
        if line.startswith("hpctrain submit"):
            run_id = out.stdout.split()[0]
        if line.startswith("hpctrain plan"):
            assert "2048" in out.stdout and "efficiency" in out.stdout, out.stdout
        if line.startswith("hpctrain jobs list"):
            assert "ffn-theta" in out.stdout and "resnet-local" in out.stdout, out.stdout
    assert run_id is not None, "the README's block submits nothing"
    runs = _checked(fresh.hpctrain("runs", "--json"), "hpctrain runs --json")
    (run,) = [r for r in json.loads(runs.stdout) if r["run_id"] == run_id]
    assert run["state"] == "completed", run
    assert (fresh.cwd / "resnet-local.yaml").is_file()
