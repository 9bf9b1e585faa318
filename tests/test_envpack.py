"""submission/envpack.py and the node step that unpacks its archive (templates/stage_node.tmpl), on a real venv.

A small venv made here with ``python -m venv`` holds one package installed the way ``pip install -e`` does it (a
``.pth`` pointing at a source tree, and a dist-info that says it is editable). Packed, unpacked by the node script
into another directory, and with the source tree moved away, its interpreter starts and imports that package without
opening a file outside the unpacked copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE_SCRIPT = ROOT / "hpctrain" / "submission" / "schedulers" / "templates" / "stage_node.tmpl"
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def make_venv(tmp: Path) -> tuple[Path, Path]:
    """A venv with an editable install of ``stagetoy`` (source under tmp/src); returns (venv, source dir)."""
    venv = tmp / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    src = tmp / "src"
    (src / "stagetoy").mkdir(parents=True)
    (src / "stagetoy" / "__init__.py").write_text("VALUE = 42\n")
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    info = site / "stagetoy-0.1.dist-info"
    info.mkdir()
    (site / "__editable__.stagetoy-0.1.pth").write_text(f"{src}\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stagetoy\nVersion: 0.1\n")
    (info / "top_level.txt").write_text("stagetoy\n")
    (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{src}"}))
    (info / "RECORD").write_text("__editable__.stagetoy-0.1.pth,,\nstagetoy-0.1.dist-info/METADATA,,\n")
    return venv, src


def pack(venv: Path, cache: Path, name: str = "env-test") -> dict:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "hpctrain.submission.envpack", "--cache", str(cache),
                          "--name", name], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def node_step(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The node script as the launcher runs it: ``bash -c SCRIPT hpctrain-stage ARGS...``."""
    return subprocess.run(["bash", "-c", NODE_SCRIPT.read_text(), "hpctrain-stage", *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("envpack")
    venv, src = make_venv(tmp)
    return venv, src, pack(venv, tmp / "cache")


@pytest.mark.processes
def test_unpacked_environment_runs_without_the_original(packed: tuple[Path, Path, dict], tmp_path: Path) -> None:
    venv, src, info = packed
    assert not info["reused"] and Path(info["pointer"]).resolve() == Path(info["archive"])
    names = tarfile.open(info["archive"]).getnames()
    assert "venv/bin/python" in names and not any("__editable__" in n for n in names)
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert f"base/lib/{py}/os.py" in names and not any(n.startswith(f"base/lib/{py}/test/") for n in names)
    dest = tmp_path / "node"
    run = node_step("check", str(dest), "1", str(tmp_path), "--", "unpack", str(dest), info["pointer"])
    assert run.returncode == 0, run.stderr
    moved = src.with_name("src-moved")
    src.rename(moved)  # the shared copy is gone: only the unpacked one can serve the import
    try:
        code = ("import sys, os\n"
                "opened = []\n"
                "sys.addaudithook(lambda e, a: opened.append(str(a[0])) if e == 'open' and isinstance(a[0], str) "
                "else None)\n"
                "import stagetoy, json, email.parser\n"
                "print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix, 'toy': stagetoy.__file__,"
                " 'os': os.__file__, 'opened': opened, 'value': stagetoy.VALUE}))\n")
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(dest / "env" / "libpython")}
        out = subprocess.run([str(dest / "env" / "venv" / "bin" / "python"), "-c", code], capture_output=True,
                             text=True, timeout=60, env=env, cwd=dest, check=True)
    finally:
        moved.rename(src)
    seen = json.loads(out.stdout)
    local = str(dest / "env")
    assert seen["value"] == 42
    assert seen["prefix"] == f"{local}/venv" and seen["base"] == f"{local}/base"
    assert seen["toy"].startswith(f"{local}/venv/lib/") and seen["os"].startswith(f"{local}/base/lib/")
    assert seen["opened"] and all(p.startswith(local) for p in seen["opened"]), seen["opened"]
    cfg = (dest / "env" / "venv" / "pyvenv.cfg").read_text()
    assert cfg.startswith(f"home = {local}/base/bin\n") and "include-system-site-packages = false" in cfg


@pytest.mark.processes
def test_the_archive_is_reused_until_the_environment_changes(tmp_path: Path) -> None:
    venv, src = make_venv(tmp_path)
    cache = tmp_path / "cache"
    first = pack(venv, cache)
    again = pack(venv, cache)
    assert again["reused"] and again["hash"] == first["hash"]
    time.sleep(0.01)
    (src / "stagetoy" / "extra.py").write_text("X = 1\n")  # the editable source changed: a new archive
    second = pack(venv, cache)
    assert not second["reused"] and second["hash"] != first["hash"]
    assert os.readlink(cache / "env-test.tar") == Path(second["archive"]).name
    (src / "stagetoy" / "__pycache__").mkdir()
    (src / "stagetoy" / "__pycache__" / "x.pyc").write_bytes(b"")  # bytecode caches do not count
    assert pack(venv, cache)["reused"]
    (venv / "lib" / "extra.txt").write_text("x")
    third = pack(venv, cache)
    # Two archives per environment are kept: the newest and the one a running job may still be reading.
    assert sorted(p.name for p in cache.glob("env-test-*.tar")) == sorted(
        [Path(second["archive"]).name, Path(third["archive"]).name])


def test_check_fails_on_a_full_node_with_its_name(tmp_path: Path) -> None:
    """The free-space check reads ``df``; a stand-in reports a nearly full file system."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                                "echo '/dev/x 1000000 990000 10240 99% /'\n")
    (bin_dir / "df").chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    ok = node_step("check", str(tmp_path / "local"), "10000", str(run_dir), env=env)
    assert ok.returncode == 0 and (tmp_path / "local" / "data").is_dir()
    full = node_step("check", str(tmp_path / "local"), str(2 * 1024 * 1024), str(run_dir), env=env)
    host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    want = f"staging failed on {host}: {tmp_path / 'local'} has 10 MB free, staging needs 2048 MB"
    assert full.returncode == 1 and full.stderr.strip() == f"hpctrain: {want}"
    assert (run_dir / "failure.txt").read_text() == want + "\n"
    assert [p.name for p in run_dir.iterdir()] == ["failure.txt"]  # no temporary note left behind
    again = node_step("check", str(tmp_path / "local"), str(4 * 1024 * 1024), str(run_dir), env=env)
    assert again.returncode == 1 and (run_dir / "failure.txt").read_text() == want + "\n"  # the first note stays


def test_copy_and_unknown_steps(tmp_path: Path) -> None:
    (tmp_path / "in.h5").write_bytes(b"\x89HDF")
    (tmp_path / "vol.zarr").mkdir()
    (tmp_path / "vol.zarr" / ".zarray").write_text("{}")
    dest = tmp_path / "node"
    run = node_step("check", str(dest), "1", str(tmp_path), "--", "copy", str(tmp_path / "in.h5"),
                    str(dest / "data" / "0-in.h5"), "--", "copy", str(tmp_path / "vol.zarr"),
                    str(dest / "data" / "1-vol.zarr"))
    assert run.returncode == 0, run.stderr
    assert (dest / "data" / "0-in.h5").read_bytes() == b"\x89HDF"
    assert (dest / "data" / "1-vol.zarr" / ".zarray").read_text() == "{}"
    bad = node_step("unzip", "x")
    assert bad.returncode == 1 and "unknown staging step unzip" in bad.stderr
