"""runtime/counting/counters.py: the audit-hook count of files a rank opens, node-local versus shared.

Counts are checked exactly on known work (a file opened a known number of times in each place, a module imported
from a known directory), between two marks so that the interpreter's own start-up does not enter them; ranks are
real processes started by the MPICH wheel's mpiexec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.runtime.counting import counters

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = ROOT / ".venv" / "bin" / "mpiexec"

KNOWN_WORK = """
import os, sys
from hpctrain.runtime.counting import counters
from hpctrain.launch_env import detect_launch_env

shared_file, local_file, module_dir, run_dir = sys.argv[1:5]
counters.mark("before")
for _ in range(7):
    with open(shared_file, encoding="utf-8") as f:
        f.read()
for _ in range(3):
    fd = os.open(local_file, os.O_RDONLY)
    os.close(fd)
for _ in range(2):
    with open("/proc/self/status", encoding="utf-8") as f:
        f.read()
sys.dont_write_bytecode = True
sys.path.insert(0, module_dir)
import known_module  # a bytecode-cache lookup and the source on the shared path, one listing of its directory
os.listdir(local_file.rsplit("/", 1)[0])
counters.mark("after")
env = detect_launch_env(os.environ)
print(counters.write_record(run_dir, env.rank, env.size))
"""


def _setup(tmp_path: Path) -> tuple[Path, Path, Path, Path, Path]:
    shared, local, modules, run_dir = (tmp_path / d for d in ("shared", "local", "modules", "run"))
    for d in (shared, local, modules, run_dir):
        d.mkdir()
    (shared / "known.txt").write_text("x\n")
    (local / "known.bin").write_bytes(b"\0")
    (modules / "known_module.py").write_text("VALUE = 1\n")
    script = tmp_path / "work.py"
    script.write_text(KNOWN_WORK)
    return shared / "known.txt", local / "known.bin", modules, run_dir, script


def _env(local: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "PMI_", "MPI_", "SLURM_"))}
    env.update({"HPCTRAIN_COUNTERS": "1", "HPCTRAIN_COUNTERS_LOCAL": str(local), **extra})
    return env


def _delta(record: dict, what: str) -> dict[str, int]:
    before, after = record["marks"]["before"][what], record["marks"]["after"][what]
    return {k: after[k] - before[k] for k in after}


def test_counts_of_known_work_are_exact(tmp_path: Path) -> None:
    shared_file, local_file, modules, run_dir, script = _setup(tmp_path)
    out = subprocess.run([sys.executable, str(script), str(shared_file), str(local_file), str(modules), str(run_dir)],
                         env=_env(local_file.parent), capture_output=True, text=True, timeout=60, check=True)
    record = json.loads(Path(out.stdout.strip()).read_text())
    assert record["rank"] == 0 and record["size"] == 1
    # 7 opens of the shared file + the import's 2 (its __pycache__ file, tried and missing, then the source);
    # 3 node-local opens; 2 of /proc.
    assert _delta(record, "opens") == {"shared": 9, "node_local": 3, "system": 2}
    assert _delta(record, "listdirs") == {"shared": 1, "node_local": 1, "system": 0}
    assert record["marks"]["after"]["shared_code_opens"] - record["marks"]["before"]["shared_code_opens"] == 2
    # The run directory's own files do not count as reads outside it; the known file does.
    assert str(shared_file) in record["shared_examples"]
    assert record["node_local_prefixes"] == [str(local_file.parent) + "/"]


def test_counters_are_off_without_the_flag(tmp_path: Path) -> None:
    code = ("import sys, hpctrain; print('hpctrain.runtime.counting.counters' in sys.modules); "
            "from hpctrain.runtime.counting import counters; "
            "print(counters.enabled(), counters.write_record('x', 0, 1))")
    env = {k: v for k, v in os.environ.items() if k != counters.ENV_FLAG}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=True, cwd=tmp_path)
    assert out.stdout.split() == ["False", "False", "None"]
    assert not (tmp_path / "x").exists()
    out = subprocess.run([sys.executable, "-c", code], env={**env, counters.ENV_FLAG: "0"}, capture_output=True,
                         text=True, timeout=60, check=True, cwd=tmp_path)
    assert out.stdout.split() == ["False", "False", "None"]


@pytest.mark.mpi
def test_every_rank_of_four_writes_the_same_counts(tmp_path: Path) -> None:
    """A known N: 4 ranks under mpiexec each do the known work and write their own record."""
    shared_file, local_file, modules, run_dir, script = _setup(tmp_path)
    subprocess.run([str(MPIEXEC), "-n", "4", sys.executable, str(script), str(shared_file), str(local_file),
                    str(modules), str(run_dir)], env=_env(local_file.parent), capture_output=True, text=True,
                   timeout=120, check=True)
    records = counters.read_records(run_dir)
    assert [r["rank"] for r in records] == [0, 1, 2, 3] and {r["size"] for r in records} == {4}
    for r in records:
        assert _delta(r, "opens") == {"shared": 9, "node_local": 3, "system": 2}


def test_classification_and_the_run_directory() -> None:
    c = counters.OpenCounter(("/nvme/job/",))
    for path in ("/nvme/job/env/python", "/lus/run/job.yaml", "/lus/venv/x.py", "/proc/self/maps", "/nvme/jobber"):
        c.hook("open", (path, "r", 0))
    c.hook("open", (3, "r", 0))  # a descriptor: not a path
    c.hook("os.listdir", ("/nvme/job/env",))
    c.hook("import", ("x", None))
    assert c.opens == {"node_local": 1, "shared": 3, "system": 1}
    assert c.listdirs == {"node_local": 1, "shared": 0, "system": 0}
    assert c.shared_code_opens == 1
    assert c.shared_outside("/lus/run") == (2, ["/lus/venv/x.py", "/nvme/jobber"])
    for _ in range(3):
        c.hook("open", ("/zz/hot.dat", "r", 0))
    # The most-opened path comes first whatever its name, so a hot file is never cut from the examples.
    assert c.shared_outside("/lus/run") == (5, ["/zz/hot.dat", "/lus/venv/x.py", "/nvme/jobber"])


def test_node_local_prefixes_come_from_the_environment() -> None:
    env = {counters.NODE_LOCAL_ENV: "/tmp/hpctrain-7/", counters.EXTRA_LOCAL_ENV: "/usr" + os.pathsep + "/opt/x"}
    assert counters.node_local_prefixes(env) == ("/tmp/hpctrain-7/", "/usr/", "/opt/x/")
    assert counters.node_local_prefixes({}) == ()


def test_write_record_is_atomic_and_readable(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        from hpctrain.runtime.counting import counters
        counters.enable(())
        counters.mark("startup")
        counters.write_record({str(tmp_path)!r}, 2, 4, messages={{"sent": 5}})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={k: v for k, v in os.environ.items() if k != counters.ENV_FLAG})
    [record] = counters.read_records(tmp_path)
    assert record["rank"] == 2 and record["messages"] == {"sent": 5}
    assert set(record["marks"]) == {"startup", "exit"}
    assert [p.name for p in (tmp_path / "counters").iterdir()] == ["rank-00002.json"]
