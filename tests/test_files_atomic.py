"""``files.atomic_path``, the one rule for a file written whole or not at all, and ``write_atomic`` through it:
what a failed writer leaves (nothing new), what a finished one leaves (the new file, no temporary), how many
fsyncs each durability asks for, and that no module of hpctrain renames a written file by hand.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

import hpctrain
from hpctrain import files
from hpctrain.files import atomic_path, write_atomic

PACKAGE = Path(hpctrain.__file__).resolve().parent


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_an_exception_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    dest = tmp_path / "seg.h5"
    dest.write_bytes(b"old")
    with pytest.raises(ValueError, match="half"), atomic_path(dest) as tmp:
        tmp.write_bytes(b"half of the new")
        raise ValueError("half written")
    assert dest.read_bytes() == b"old"
    assert _names(tmp_path) == ["seg.h5"]


def test_a_writer_that_never_wrote_leaves_the_old_file(tmp_path: Path) -> None:
    dest = tmp_path / "plan.json"
    dest.write_text("old")
    with pytest.raises(FileNotFoundError), atomic_path(dest):
        pass  # nothing at the temporary path: there is nothing to rename
    assert dest.read_text() == "old" and _names(tmp_path) == ["plan.json"]


def test_success_replaces_through_a_hidden_unique_name_beside_it(tmp_path: Path) -> None:
    dest = tmp_path / "out" / "plot.png"
    dest.parent.mkdir()
    dest.write_bytes(b"old")
    seen = []
    for content in (b"first", b"second"):
        with atomic_path(dest, mode=0o640) as tmp:
            # a program that needs a path (a compiler's -o, a download) writes it
            subprocess.run(["sh", "-c", f"printf {content.decode()} > \"$1\"", "sh", str(tmp)], check=True)
            seen.append(tmp)
            assert tmp.parent == dest.parent and tmp.name.startswith(".plot.png.tmp-")
            assert not tmp.name.endswith(".png")  # a reader's *.png never sees a file being written
            assert dest.read_bytes() != content  # not yet published
        assert dest.read_bytes() == content
    assert seen[0] != seen[1]
    assert (dest.stat().st_mode & 0o777) == 0o640
    assert _names(dest.parent) == ["plot.png"]


@pytest.mark.parametrize(("durable", "sync_dir", "fsyncs"), [(True, False, 1), (True, True, 2), (False, False, 0),
                                                            (False, True, 1)])
def test_durable_fsyncs_the_file_and_sync_dir_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           durable: bool, sync_dir: bool, fsyncs: int) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    dest = tmp_path / "state.json"
    with atomic_path(dest, durable=durable, sync_dir=sync_dir) as tmp:
        tmp.write_text("new")
    assert dest.read_text() == "new"
    assert len(synced) == fsyncs
    synced.clear()
    write_atomic(dest, "newer", durable=durable, sync_dir=sync_dir)
    assert dest.read_text() == "newer" and len(synced) == fsyncs


def test_write_atomic_opens_the_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The written file is fsynced through the descriptor that wrote it: a checkpoint's or counter's file costs one
    open on the shared file system, not a second one by its path to fsync it (scale.py counts opens per step)."""
    opened: list[str] = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (opened.append(str(path)), real(path, *a, **k))[1])
    dest = tmp_path / "manifest.json"
    write_atomic(dest, "{}", durable=True)
    assert dest.read_text() == "{}"
    assert [p for p in opened if Path(p).parent == tmp_path and Path(p) != tmp_path] == []


def test_a_failed_fsync_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    dest = tmp_path / "ckpt.pt"
    dest.write_bytes(b"old")
    with pytest.raises(OSError, match="No space"):
        write_atomic(dest, b"new")
    assert dest.read_bytes() == b"old" and _names(tmp_path) == ["ckpt.pt"]


def test_exclusive_never_replaces_an_existing_file(tmp_path: Path) -> None:
    dest = tmp_path / "site.yaml"
    with atomic_path(dest, exclusive=True) as tmp:
        tmp.write_text("mine")
    assert dest.read_text() == "mine" and _names(tmp_path) == ["site.yaml"]
    with pytest.raises(FileExistsError), atomic_path(dest, exclusive=True) as tmp:
        tmp.write_text("theirs")
    assert dest.read_text() == "mine" and _names(tmp_path) == ["site.yaml"]


def test_exclusive_without_hard_links_checks_then_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    dest = tmp_path / "registry.db"
    with atomic_path(dest, exclusive=True) as tmp:
        tmp.write_text("first")
    assert dest.read_text() == "first"
    with pytest.raises(FileExistsError), atomic_path(dest, exclusive=True) as tmp:
        tmp.write_text("second")
    assert dest.read_text() == "first" and _names(tmp_path) == ["registry.db"]


# Renames that are not "a written file published whole": each keeps its own with a reason in the code.
OWN_RENAMES = {
    "files.py": 2,  # the rule itself: os.replace in _publish, twice (rename, or after a refused link)
    "submission/envpack.py": 1,  # a symbolic link swapped into place
    "submission/stage_tree.py": 1,  # carried as text into the batch script: the standard library only
}


def _renames(path: Path) -> int:
    """``os.replace``/``os.rename``, a ``Path.rename``, and a ``.replace`` of a temporary path in one module."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, attr = ast.unparse(node.func.value), node.func.attr
            if attr == "rename" or (attr == "replace" and (owner == "os" or "tmp" in owner or "partial" in owner)):
                count += 1
    return count


def test_no_module_renames_a_written_file_by_hand() -> None:
    found = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := _renames(p))}
    assert found == OWN_RENAMES, "use files.atomic_path (or write_atomic) for a file written whole or not at all"
    assert files.temp_name(Path("a/b.h5")).parent == Path("a")
