"""Which test modules share the serial ``slurm`` xdist group (tests/conftest.py): those with a test that uses the
real Slurm, through the ``slurm`` fixture or the ``slurm`` marker, and not those that only name sbatch or srun."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import group_modules

pytest_plugins = ("pytester",)

CONFTEST = """
import pytest

@pytest.fixture(scope="session")
def slurm():
    return "cluster"

@pytest.fixture
def submitted(slurm):
    return slurm
"""


def test_only_modules_that_use_the_slurm_share_its_group(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    slurm: uses Slurm\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_names_srun='def test_render():\n    assert "srun -n 2" and "#SBATCH --requeue" and "scontrol"\n',
        test_fixture="def test_a(slurm):\n    pass\n\ndef test_b():\n    pass\n",
        test_through_fixture="def test_b():\n    pass\n\ndef test_a(submitted):\n    pass\n",
        test_marked="import pytest\n\npytestmark = pytest.mark.slurm\n\ndef test_a():\n    pass\n",
        test_plain="def test_a():\n    pass\n",
    )
    items, _ = pytester.inline_genitems()
    groups = {Path(p).stem: g for p, g in group_modules(items).items()}
    assert groups == {"test_names_srun": "test_names_srun", "test_fixture": "slurm",
                      "test_through_fixture": "slurm", "test_marked": "slurm", "test_plain": "test_plain"}


@pytest.mark.processes
def test_under_loadgroup_a_module_runs_on_one_worker_with_its_group_in_the_test_id(pytester: pytest.Pytester) -> None:
    """Two real xdist workers: every test id carries its group (``@slurm``, ``@MODULE``), so ``--dist loadgroup``
    keeps each module on one worker and the Slurm modules one after another."""
    pytester.makeini("[pytest]\nmarkers =\n    slurm: uses Slurm\n")
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n" + CONFTEST)
    pytester.makepyfile(
        test_fixture="def test_a(slurm):\n    pass\n\ndef test_b():\n    pass\n",
        test_plain="def test_a():\n    pass\n\ndef test_b():\n    pass\n",
    )
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-rA", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    passed = {line.split()[-1] for line in result.outlines if line.startswith("PASSED ")}
    assert passed == {"test_fixture.py::test_a@slurm", "test_fixture.py::test_b@slurm",
                      "test_plain.py::test_a@test_plain", "test_plain.py::test_b@test_plain"}
