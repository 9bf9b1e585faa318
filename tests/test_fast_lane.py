"""What ``pytest --fast`` (``scripts/test.sh --fast``) leaves out: every test marked for a real process and every
test that asks for a fixture starting one, itself or through another fixture (tests/conftest.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import REAL_PROCESS_MARKERS

pytest_plugins = ("pytester",)

REPO = Path(__file__).resolve().parents[1]
CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import pytest
from tests.conftest import pytest_addoption, pytest_collection_modifyitems  # noqa: F401

@pytest.fixture(scope="session")
def slurm():
    return "cluster"

@pytest.fixture(scope="session")
def sshd():
    return "login"

@pytest.fixture
def cluster_tmp():
    return "shared"

@pytest.fixture
def submitted(slurm):
    return slurm
"""
MODULES = {
    "test_plain": "def test_a(tmp_path):\n    pass\n",
    "test_names_srun": 'def test_render():\n    assert "srun -n 2" and "#SBATCH --requeue"\n',
    "test_marked": "import pytest\n\n"
                   "@pytest.mark.slurm\ndef test_slurm():\n    pass\n\n"
                   "@pytest.mark.sshd\ndef test_sshd():\n    pass\n\n"
                   "@pytest.mark.mpi\ndef test_mpi():\n    pass\n\n"
                   "@pytest.mark.slow\ndef test_slow():\n    pass\n\n"
                   "def test_unmarked():\n    pass\n",
    "test_module_marked": "import pytest\n\npytestmark = pytest.mark.sshd\n\ndef test_a():\n    pass\n",
    "test_fixtures": "def test_slurm(slurm):\n    pass\n\ndef test_sshd(sshd):\n    pass\n\n"
                     "def test_cluster(cluster_tmp):\n    pass\n\ndef test_through(submitted):\n    pass\n",
}


def _collected(pytester: pytest.Pytester, *args: str) -> set[str]:
    pytester.makeini("[pytest]\nmarkers =\n" + "".join(f"    {m}: real\n" for m in REAL_PROCESS_MARKERS))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**MODULES)
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return {line for line in result.outlines if "::" in line}


@pytest.mark.processes
def test_fast_keeps_only_the_tests_that_need_no_real_process(pytester: pytest.Pytester) -> None:
    assert _collected(pytester, "--fast") == {"test_plain.py::test_a", "test_names_srun.py::test_render",
                                              "test_marked.py::test_unmarked"}


@pytest.mark.processes
def test_without_fast_every_test_is_collected(pytester: pytest.Pytester) -> None:
    assert len(_collected(pytester)) == 12


def test_every_marker_of_the_project_is_one_the_fast_lane_leaves_out() -> None:
    """A marker added to pyproject.toml is for a real process or a slow test: the fast lane must know it."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {line.split(":", 1)[0].strip() for line in declared} == set(REAL_PROCESS_MARKERS)
