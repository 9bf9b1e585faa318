"""The torch-free manifest reader against hand-made checkpoint directories (issue 11, item 8).

Real files with real digests, written the way the store writes them; no torch: this is what the laptop reads.
A manifest entry may never name a directory outside its own step directory, an unknown checksum falls back to
the previous checkpoint with a reason, and a missing marker is named in the fallback message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.checkpoint.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MARKER,
    SHARED,
    file_digest,
    newest_shared_file,
    newest_step,
    parse_manifest,
    read_entries,
    step_dirname,
)
from hpctrain.errors import CheckpointError


def _entry(root: Path, step: int, payload: bytes, checksum: str = "sha256") -> dict:
    sdir = root / step_dirname(step)
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / SHARED).write_bytes(payload)
    size, digest = file_digest(sdir / SHARED, "sha256")
    entry = {"step": step, "dir": sdir.name, "world_size": 1, "format_version": FORMAT_VERSION,
             "checksum": checksum, "created": "2026-11-23T00:00:00Z",
             "files": [{"name": SHARED, "bytes": size, "digest": digest, "rank": None}]}
    (sdir / MARKER).write_text(json.dumps(entry))
    return entry


def _manifest(root: Path, entries: list[dict]) -> None:
    (root / MANIFEST).write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION,
                                             "checkpoints": entries}))


def _three(root: Path) -> list[dict]:
    entries = [_entry(root, step, f"state at {step}".encode()) for step in (10, 20, 30)]
    _manifest(root, entries)
    return entries


def test_a_good_directory_gives_its_newest_checkpoint(tmp_path: Path) -> None:
    _three(tmp_path)
    path, problems = newest_shared_file(tmp_path)
    assert path == tmp_path / step_dirname(30) / SHARED and problems == []


def test_an_entry_naming_another_directory_is_refused_and_the_markers_used(tmp_path: Path) -> None:
    """The issue's case: ``"dir": "../outside/step-x"`` loaded another step's data as step 30."""
    entries = _three(tmp_path)
    outside = tmp_path.parent / "outside"
    _entry(outside, 99, b"someone else's model")
    entries[2] = {**entries[2], "dir": f"../outside/{step_dirname(99)}"}
    _manifest(tmp_path, entries)
    with pytest.raises(ValueError, match="not its own"):
        parse_manifest((tmp_path / MANIFEST).read_text(), tmp_path)
    path, problems = newest_shared_file(tmp_path)
    assert path == tmp_path / step_dirname(30) / SHARED  # its own step-30, rebuilt from the marker
    assert path.read_bytes() == b"state at 30"
    assert "manifest" in problems[0] and "not its own" in problems[0] and "rebuilt" in problems[0]
    for other in (f"{step_dirname(20)}", "step-00000030/../step-00000020", "/tmp/step-00000030"):
        entries[2] = {**entries[2], "dir": other}
        _manifest(tmp_path, entries)
        with pytest.raises(ValueError):
            parse_manifest((tmp_path / MANIFEST).read_text(), tmp_path)


def test_a_marker_describing_another_step_is_skipped(tmp_path: Path) -> None:
    entries = _three(tmp_path)
    (tmp_path / MANIFEST).unlink()
    (tmp_path / step_dirname(30) / MARKER).write_text(json.dumps({**entries[2], "dir": "../outside"}))
    path, problems = newest_shared_file(tmp_path)
    assert path.parent.name == step_dirname(20)
    assert any(step_dirname(30) in p and "unreadable" in p for p in problems)


@pytest.mark.parametrize("checksum", ["sha2r6", "shake_128", ""])
def test_an_unknown_checksum_falls_back_with_the_reason(tmp_path: Path, checksum: str) -> None:
    entries = _three(tmp_path)
    entries[2] = {**entries[2], "checksum": checksum}
    _manifest(tmp_path, entries)
    path, problems = newest_shared_file(tmp_path)
    assert path.parent.name == step_dirname(20)
    assert problems == [f"step 30 skipped: step 30 uses checksum {checksum!r}, which this Python's hashlib does "
                        "not know: its files cannot be verified"]
    unverified, _ = newest_shared_file(tmp_path, verify=False)
    assert unverified.parent.name == step_dirname(30)  # sizes alone do not need the hash


def test_a_missing_newest_marker_is_named_in_the_fallback_message(tmp_path: Path) -> None:
    _three(tmp_path)
    (tmp_path / MANIFEST).unlink()
    (tmp_path / step_dirname(30) / MARKER).unlink()
    path, problems = newest_shared_file(tmp_path)
    assert path.parent.name == step_dirname(20)
    assert problems[0].startswith(f"manifest {tmp_path / MANIFEST} is missing; rebuilt from")
    assert f"skipped {step_dirname(30)} has no {MARKER} (its save did not finish)" in problems


@pytest.mark.parametrize("text", [
    '{"format": "hpctrain-checkpoint", "checkpoints": [{"step": 1e999}]}',
    '{"format": "hpctrain-checkpoint", "checkpoints": [{"step": Infinity, "dir": "x"}]}',
    '{"format": "hpctrain-checkpoint", "checkpoints": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"format": "hpctrain-checkpoint", "checkpoints": [{"step": 1, "dir": "step-00000001", "world_size": 0,'
    ' "files": [], "checksum": "sha256", "created": ""}]}',
    '{"format": "hpctrain-checkpoint", "checkpoints": [{"step": 1, "dir": "step-00000001", "world_size": 1,'
    ' "files": {"a": 1}, "checksum": "sha256", "created": ""}]}',
    '{"format": "hpctrain-checkpoint", "checkpoints": [7]}',
    '["not", "a", "manifest"]',
])
def test_malformed_manifests_are_value_errors_only(tmp_path: Path, text: str) -> None:
    """``hpctrain resume`` reads a manifest over ssh and catches ValueError: nothing else may escape."""
    with pytest.raises(ValueError):
        newest_step(text, tmp_path)
    (tmp_path / MANIFEST).write_text(text)
    entries, problems = read_entries(tmp_path)
    assert entries == [] and problems == []  # no step directories: nothing to rebuild, nothing to warn
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        newest_shared_file(tmp_path)


def test_an_empty_manifest_hides_no_committed_step(tmp_path: Path) -> None:
    """``{"format": ..., "checkpoints": []}`` is a valid manifest that names nothing: the markers of the steps
    still show them complete, and they are used, with a warning that says so."""
    _three(tmp_path)
    _manifest(tmp_path, [])
    entries, problems = read_entries(tmp_path)
    assert [c.step for c in entries] == [10, 20, 30]
    assert problems == [f"manifest {tmp_path / MANIFEST} names 0 checkpoint(s) but not step(s) 10, 20, 30, which "
                        f"their {MARKER} markers show complete; added from the markers"]
    path, _ = newest_shared_file(tmp_path)
    assert path == tmp_path / step_dirname(30) / SHARED


def test_a_manifest_naming_fewer_steps_than_the_markers_show_is_completed_from_them(tmp_path: Path) -> None:
    entries = _three(tmp_path)
    _manifest(tmp_path, entries[:1])  # a stale manifest, or a save whose marker was written and manifest not
    (tmp_path / step_dirname(40)).mkdir()  # a save still being written (no marker yet): left out, no warning
    listed, problems = read_entries(tmp_path)
    assert [c.step for c in listed] == [10, 20, 30]
    assert len(problems) == 1 and "not step(s) 20, 30" in problems[0]
    _manifest(tmp_path, entries)
    assert read_entries(tmp_path) == (listed, [])  # a manifest naming every marked step: no warning


def test_an_empty_manifest_and_no_step_directory_say_there_is_no_checkpoint(tmp_path: Path) -> None:
    _manifest(tmp_path, [])
    with pytest.raises(CheckpointError, match=f"neither {MANIFEST} nor a step directory's {MARKER} names one"):
        newest_shared_file(tmp_path)
