"""Files hpctrain reads are read only when regular; an extended profile never shows another file's text; the
registry, manifests and checkpoint files refuse FIFOs, devices, links that leave the run; output escapes
control characters; directives that choose code are the site's trusted ones only."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.checkpoint.manifest import MANIFEST, SHARED, read_entries
from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.config.job import load_job
from hpctrain.config.site import load_site, load_site_file
from hpctrain.config.yamlio import read_config_text
from hpctrain.errors import ConfigError, ConfigErrors, HpctrainError
from hpctrain.files import NotRegularFile, read_regular_bytes
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.render import render_script
from hpctrain.text import printable

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "hpctrain" / "jobs" / "resnet-local.yaml"
KINDS = ["fifo", "directory", "dev-null", "dev-zero", "loop", "missing", "regular"]


def make(kind: str, path: Path, text: str = "") -> Path:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind in ("dev-null", "dev-zero"):
        path.symlink_to(f"/dev/{kind[4:]}")
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "regular":
        path.write_text(text)
    return path


def unblocked(call: Callable[[], object], path: Path) -> object:
    """Run ``call``; should it block opening the FIFO at ``path``, open the FIFO's other end so it returns, and
    fail. Returns what ``call`` returned or raised."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # the caller inspects it
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join()
        pytest.fail(f"blocked reading {path}")
    return result[0]


OPENERS: dict[str, Callable[[Path], object]] = {
    "read_config_text": read_config_text,
    "load_site_file": load_site_file,
    "load_job": load_job,
    "read_regular_bytes": read_regular_bytes,
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), opener=st.sampled_from(sorted(OPENERS)), text=st.text(max_size=200))
def test_every_config_opener_refuses_what_is_not_a_regular_file(tmp_path_factory: pytest.TempPathFactory, kind: str,
                                                                opener: str, text: str) -> None:
    path = make(kind, tmp_path_factory.mktemp("f") / "x.yaml", text)
    got = unblocked(lambda: OPENERS[opener](path), path)
    if kind == "regular":
        assert not isinstance(got, BaseException) or isinstance(got, ConfigError | UnicodeDecodeError), got
        return
    assert isinstance(got, ConfigError | OSError), got
    assert str(path) in str(got) or kind in ("missing", "loop") and isinstance(got, OSError | ConfigError)
    if kind in ("fifo", "dev-null", "dev-zero", "directory") and isinstance(got, ConfigError):
        assert "not a regular file" in str(got)


def test_not_regular_file_is_an_oserror_naming_the_kind(tmp_path: Path) -> None:
    path = make("fifo", tmp_path / "p")
    got = unblocked(lambda: read_regular_bytes(path), path)
    assert isinstance(got, NotRegularFile) and isinstance(got, OSError) and "FIFO" in str(got)


SECRET = "private_token: hunter2-SECRET-VALUE\nother: [1, 2]\n"


@pytest.mark.parametrize("private", [SECRET, "".join(f"user{i}:$6$salt$hash{i}:19000:0:99999:7:::\n" for i in range(5)),
                                     "queues: {secret-queue-XYZZY: 1}\nnode: {cores: 4, memory_gb: 1}\n",
                                     "not: [valid\n"])
def test_an_extended_file_is_named_but_never_shown(tmp_path: Path, private: str) -> None:
    secret = tmp_path / "private.yaml"
    secret.write_text(private)
    victim = tmp_path / "victim.yaml"
    victim.write_text(f"name: victim\nextends: {secret}\n")
    with pytest.raises(ConfigError) as info:
        load_site_file(victim)
    text = str(info.value)
    assert str(secret) in text
    for leak in ("hunter2", "private_token", "hash1", "user1", "XYZZY", "secret-queue", "[valid"):
        assert leak not in text, text


def test_thirty_thousand_unknown_keys_print_twenty_lines(tmp_path: Path) -> None:
    path = tmp_path / "j.yaml"
    path.write_text(JOB.read_text() + "".join(f"unknown_{i}: 1\n" for i in range(30)))
    with pytest.raises(ConfigErrors) as info:
        load_job(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 21 and lines[-1] == f"{path}: and 10 more errors"


@given(st.text())
def test_printable_leaves_no_control_character(text: str) -> None:
    assert all(c.isprintable() or c == " " for c in printable(text))


def test_control_characters_in_a_flag_are_escaped_in_the_message() -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(JOB), "--queue", "a\x1b[2Jb\nok"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "\x1b" not in done.stderr and "\\x1b" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["fifo", "dev-null", "dev-zero", "loop", "home-is-a-file"])
def test_a_registry_that_is_not_a_regular_file_is_an_error_naming_it(tmp_path: Path, kind: str) -> None:
    if kind == "home-is-a-file":
        (tmp_path / "home").write_text("x")
        path = tmp_path / "home" / "registry.db"
    else:
        path = make(kind, tmp_path / "registry.db")
    for readonly in (True, False):
        got = unblocked(lambda readonly=readonly: RunRegistry(path, readonly=readonly), path)
        assert isinstance(got, HpctrainError) and str(path) in str(got), got
    env = dict(os.environ, HPCTRAIN_REGISTRY=str(path))
    for args in (["runs"], ["runs", "--json"], ["runs", "--repair"]):
        done = subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=120)
        assert done.returncode != 0 and str(path) in done.stderr and "Traceback" not in done.stderr


def _store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "ckpt", keep=3)
    for step in (1, 2):
        store.save(step, {"step": step, "model": {"w": torch.full((3,), float(step))}})
    return store


class _Opaque:
    """An object ``weights_only`` refuses to unpickle (it only loads tensors and plain containers)."""


def test_a_step_weights_only_refuses_falls_back_to_the_previous(tmp_path: Path) -> None:
    store = _store(tmp_path)
    newest = store.latest_valid()
    assert newest is not None and newest.step == 2
    path = newest.path / SHARED
    torch.save({"step": 2, "model": _Opaque()}, path)  # same name; then make the manifest agree with the file
    manifest = store.directory / MANIFEST
    import hashlib
    import json
    data = json.loads(manifest.read_text())
    for entry in data["checkpoints"]:
        for rec in entry["files"]:
            if entry["step"] == 2 and rec["name"] == SHARED:
                rec["bytes"] = path.stat().st_size
                rec["digest"] = hashlib.new(entry.get("checksum", "sha256"), path.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(data))
    assert store.latest_valid().step == 2  # it passes every check
    with pytest.raises(HpctrainError) as info:
        store.load(store.latest_valid())
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)
    loaded = store.load_newest()
    assert loaded is not None and loaded[0].step == 1 and float(loaded[1]["model"]["w"][0]) == 1.0


def test_a_step_linked_outside_the_run_is_not_loaded(tmp_path: Path) -> None:
    store = _store(tmp_path)
    newest = store.latest_valid()
    outside = tmp_path / "elsewhere"
    newest.path.rename(outside)
    newest.path.symlink_to(outside, target_is_directory=True)
    chosen = store.latest_valid()
    assert chosen is not None and chosen.step == 1


def test_a_manifest_that_is_a_fifo_is_rebuilt_from_markers(tmp_path: Path) -> None:
    store = _store(tmp_path)
    manifest = store.directory / MANIFEST
    manifest.unlink()
    os.mkfifo(manifest)
    got = unblocked(lambda: read_entries(store.directory), manifest)
    assert not isinstance(got, BaseException)
    entries, problems = got
    assert [c.step for c in entries] == [1, 2] and "not a regular file" in problems[0]


@pytest.mark.parametrize(("site", "key", "value"), [
    ("polaris", "S", "/bin/evil"), ("polaris", "v", "LD_PRELOAD=/x.so"), ("polaris", "V", True),
    ("frontier", "export", "ALL"), ("frontier", "container", "evil"), ("frontier", "get-user-env", True),
])
def test_directives_that_choose_code_are_refused_in_jobs_and_profiles(tmp_path: Path, site: str, key: str,
                                                                      value: object) -> None:
    job = load_job(JOB, sets=["resources.account=a", f"resources.directives.{key}={value}"])
    with pytest.raises(ConfigError, match="trusted"):
        render_script(job, load_site(site), run_dir="/tmp/r", spec_path="/tmp/r/job.yaml")
    profile = tmp_path / "p.yaml"
    profile.write_text(f"name: p\nextends: {site}\ndirectives: {{{key}: {value}}}\n")
    with pytest.raises(ConfigError, match="trusted"):
        load_site_file(profile)
    trusted = tmp_path / "t.yaml"
    trusted.write_text(f"name: t\nextends: {site}\nenvironment: {{directives: {{{key}: {value}}}}}\n")
    text = render_script(load_job(JOB, sets=["resources.account=a", "resources.walltime=01:00:00"]),
                         load_site_file(trusted), run_dir="/tmp/r", spec_path="/tmp/r/job.yaml").text
    assert f"-{key}" in text or f"--{key}" in text


def test_a_directive_off_the_allow_list_is_refused(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\nextends: frontier\ndirectives: {wait: true}\n")
    with pytest.raises(ConfigError, match="not one a profile or job may set"):
        load_site_file(profile)


@pytest.mark.parametrize("where", ["queue", "submit_as", "qos"])
def test_a_comma_in_a_queue_name_is_refused(tmp_path: Path, where: str) -> None:
    if where == "queue":
        with pytest.raises(ConfigError, match="holds no ','"):
            load_job(JOB, queue="batch,debug")
        return
    profile = tmp_path / "p.yaml"
    profile.write_text(f"name: p\nextends: frontier\nqueues: {{batch: {{{where}: 'a,b'}}}}\n")
    with pytest.raises(ConfigError, match="holds no ','"):
        load_site_file(profile)


def test_an_output_name_the_system_refuses_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(JOB), "-o", str(tmp_path / ("x" * 5000))],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "File name too long" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_the_name_of_the_written_script_is_escaped(tmp_path: Path) -> None:
    out = tmp_path / "a\u202eb\x1b[2J.sh"
    done = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(JOB), "-o", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and out.is_file()
    assert "\u202e" not in done.stderr and "\x1b" not in done.stderr and "\\u202e" in done.stderr


@pytest.mark.parametrize("opener", ["job", "site"])
def test_a_file_of_other_lines_is_never_repeated_as_unknown_keys(tmp_path: Path, opener: str) -> None:
    other = tmp_path / "shadow"
    other.write_text("".join(f"user{i}:$6$salt$hash{i}:19000:0:99999:7:::\n" for i in range(5)))
    with pytest.raises(ConfigError) as info:
        (load_job if opener == "job" else load_site_file)(other)
    text = str(info.value)
    assert "not a plain word; not repeated here" in text and f"{other}:1:" in text
    assert "hash" not in text and "user" not in text and "$6$" not in text, text


def test_a_mistyped_key_is_still_named() -> None:
    with pytest.raises(ConfigError) as info:
        load_job(JOB, sets=["trian.lr=0.1"])
    assert "trian: unknown key; did you mean 'train'?" in str(info.value)


@pytest.mark.parametrize("ref", ["a" * 300, "/a" * 3000, "/tmp/\udcff\udcfe", "FIFO-RUN"])
def test_plan_from_a_path_the_system_refuses_is_one_line(tmp_path: Path, ref: str) -> None:
    if ref == "FIFO-RUN":  # a run directory whose profile is a named pipe: refused, not waited on
        ref = str(tmp_path / "run")
        Path(ref).mkdir()
        os.mkfifo(Path(ref) / "profile.json")
    done = subprocess.run([sys.executable, "-m", "hpctrain", "plan", str(JOB), "--from", ref], capture_output=True,
                          cwd=REPO, timeout=120, env={**os.environ, "HPCTRAIN_HOME": str(tmp_path / "home")})
    err = done.stderr.decode(errors="replace")
    assert done.returncode != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("hpctrain: error:") and ("FIFO" in err or "--from" in err), err


@pytest.mark.parametrize("name", ["a\nb\nc" * 400, "missing-dir\nhpctrain: ok/job.sh"])
def test_an_output_name_with_line_breaks_is_one_line(tmp_path: Path, name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(JOB), "-o", str(tmp_path / name)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "\\x0a" in done.stderr, done.stderr[:300]


def test_write_atomic_replaces_whole_or_leaves_the_old_file(tmp_path: Path) -> None:
    from hpctrain.files import write_atomic

    target = tmp_path / "state.json"
    write_atomic(target, "old\n", mode=0o640)
    assert target.read_text() == "old\n" and (target.stat().st_mode & 0o777) == 0o640

    def half_then_fail(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left behind
    write_atomic(target, b"new", sync_dir=True)
    assert target.read_bytes() == b"new"
