"""``hpctrain report`` and ``status`` under hostile run files: every run file goes through one reader (regular files
only, each capped, JSON nesting bounded), a long run's metrics are sampled, ``-o`` and RUN are checked as ``render``
checks its ``-o``, the served mode is quiet when clients reset and stops on a file it refuses, a remote run's files
are streamed to disk and copied again only when they changed, and no control character of a file reaches the page.
Each refusal is one line and a non-zero exit: never a traceback, a hang or a file read into memory whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.errors import TransportError
from hpctrain.report import collect as collect_module
from hpctrain.report import figures
from hpctrain.report import source as source_module
from hpctrain.report.build import report_data
from hpctrain.report.collect import RunFacts, collect
from hpctrain.report.html import page
from hpctrain.report.serve import HOST, ReportServer
from hpctrain.report.source import fetch, open_source
from hpctrain.run_files import RunFileError
from hpctrain.submission.marked_sections import split_marked_sections
from hpctrain.submission.tracking import POLL_MARK, batch_script, last_json_record
from hpctrain.submission.transport import LocalTransport, SSHTransport
from hpctrain.text import JSONTooDeep, json_lines, json_value
from tests.conftest import TinyJob

REPO = Path(__file__).resolve().parent.parent
DEEP = "[" * 100_000
RUN_FILES = ("metrics.jsonl", "attempts.jsonl", "rank_times.jsonl", "profile.json", "scores.json", "failure.txt",
             "checkpoints/manifest.json", "ranks/node-00000.txt")
JSON_FILES = ("metrics.jsonl", "attempts.jsonl", "rank_times.jsonl", "profile.json", "scores.json",
              "checkpoints/manifest.json")
MB = 1 << 20


pytestmark = pytest.mark.usefixtures("isolated_home")  # no registry of the user's: a run directory is a bare one


def write_run(d: Path, steps: range = range(1, 11), *, final: bool = False) -> Path:
    """A run directory with every file the report reads, each small and well formed."""
    (d / "ranks").mkdir(parents=True, exist_ok=True)
    (d / "checkpoints").mkdir(exist_ok=True)
    lines = [json.dumps({"time": 1000.0 + s, "step": s, "loss": 2.0 / s, "per_rank_rate": 10.0, "ranks": 2})
             for s in steps]
    if final:
        lines.append(json.dumps({"time": 2000.0, "step": steps[-1], "final": True, "test_loss": 0.5}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (d / "attempts.jsonl").write_text(json.dumps({"time": 999.0, "step": 0}) + "\n")
    (d / "rank_times.jsonl").write_text("".join(json.dumps({"step": s, "busy_s": [0.25, 0.5]}) + "\n" for s in steps))
    (d / "profile.json").write_text(json.dumps({"ranks": 2, "ranks_per_node": 2}))
    (d / "scores.json").write_text(json.dumps({"ffn": {"voi": 1.25}}))
    (d / "failure.txt").write_text("rank 1: data file missing\n")
    (d / "checkpoints" / "manifest.json").write_text(json.dumps({"checkpoints": [{"step": 5, "files": []}]}))
    (d / "ranks" / "node-00000.txt").write_text("rank 0 pid 1 host n0 parent 1\nrank 1 pid 2 host n0 parent 1\n")
    return d


def hostile(path: Path, kind: str) -> None:
    """Replace ``path`` by a FIFO, a link to /dev/zero, or a line nested 100,000 deep."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(DEEP + "\n")


def unblocked(call: Callable[[], object], fifos: list[Path]) -> object:
    """What ``call`` returns or raises; should it block on one of ``fifos`` (a hang guard, not a timing), their
    writing ends are opened so that it returns, and the test fails."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001 - the caller inspects it
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    if worker.is_alive():
        deadline = time.monotonic() + 60
        while worker.is_alive() and time.monotonic() < deadline:  # every reader that waits, one after the other
            for fifo in fifos:
                with contextlib.suppress(OSError):  # ENXIO: nobody waits on this one now
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            worker.join(0.1)
        pytest.fail(f"blocked reading one of {fifos}")
    return result[0]


# Runs a command, its address space capped at 2 GiB (a file read whole fails at once instead of filling this
# machine's memory), and writes its peak resident memory to a file, in KiB. Measured through this small process:
# a child forked from the test process would count the test process's own memory as its peak.
MEASURE = ("import resource, subprocess, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
           "done = subprocess.run(sys.argv[2:]); "
           "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
           "sys.exit(done.returncode)")


def measured(argv: list[str], cwd: Path, env: dict[str, str] | None = None
             ) -> tuple[subprocess.CompletedProcess[str], float]:
    """``argv`` run to its end (MEASURE), and its peak resident MB."""
    peak = cwd / "peak-kib"
    proc = subprocess.Popen([sys.executable, "-c", MEASURE, str(peak), *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env or {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        out, err = proc.communicate(timeout=300)  # a hang guard: the command ends long before
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the command too, not only the process measuring it
        proc.communicate()
        pytest.fail(f"{argv} hung")
    kib = int(peak.read_text())
    peak.unlink()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), kib / 1024


def cli(*args: str, cwd: Path) -> tuple[int, str, float]:
    """(exit status, stderr, peak resident MB) of ``hpctrain ARGS`` in its own process."""
    done, mb = measured([sys.executable, "-m", "hpctrain", *args], cwd)
    return done.returncode, done.stderr, mb


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-2000:]
    assert err.startswith("hpctrain: error: "), err[:300]
    return err.strip()


# --- JSON nesting ---------------------------------------------------------------------------------------------


def test_deep_json_is_one_value_error_and_json_lines_skip_it() -> None:
    with pytest.raises(JSONTooDeep, match="nested deeper than 64 levels"):
        json_value(DEEP)
    assert json_value("[" * 64 + "]" * 64) is not None
    with pytest.raises(JSONTooDeep):
        json_value("[" * 65 + "]" * 65)
    assert json_value('{"a": "' + "[{" * 1000 + '"}') == {"a": "[{" * 1000}  # brackets in a string do not nest
    assert json_lines(f'{{"step": 1}}\n{DEEP}\n{{"step": 2}}\n') == [{"step": 1}, {"step": 2}]
    # status reads the last line of metrics.jsonl: a deep one is no record, the poll goes on
    assert last_json_record(f'{{"step": 1}}\n{DEEP}') == {"step": 1}


@pytest.mark.parametrize("name", JSON_FILES)
def test_a_deep_line_in_a_run_file_is_named_in_one_error(tmp_path: Path, name: str) -> None:
    d = write_run(tmp_path / "run")
    hostile(d / name, "deep")
    with pytest.raises(RunFileError) as info:
        report_data(open_source(str(d)))
    assert f"{d / name}: " in str(info.value) and "nested deeper than 64 levels" in str(info.value)


@pytest.mark.timeout(300)
def test_status_of_a_run_whose_last_metrics_line_is_deep(tmp_path: Path, tiny_job: TinyJob) -> None:
    from hpctrain.submission.api import RunHandle, submit_runs
    from hpctrain.submission.registry import RunRegistry

    spec = tiny_job(checkpoint=None)
    write_deep = ["python3", "-c", f"open('metrics.jsonl', 'w').write('{{\"step\": 1}}\\n' + '[' * {len(DEEP)})"]
    with RunRegistry() as registry:
        run = submit_runs(spec, "local", command=write_deep, registry=registry).runs[0]
    assert RunHandle(run.run_id).wait(timeout=240, poll_s=0.5).state == "completed"
    code, err, _ = cli("status", run.run_id, cwd=tmp_path)
    assert code == 0 and "Traceback" not in err, err[-2000:]


# --- what is not a regular file, what is too big --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", RUN_FILES)
def test_a_run_file_that_is_no_regular_file_is_refused_unread(tmp_path: Path, name: str, kind: str) -> None:
    d = write_run(tmp_path / "run")
    hostile(d / name, kind)
    got = unblocked(lambda: collect(d, RunFacts(title="run", where=str(d))), [d / name] if kind == "fifo" else [])
    assert isinstance(got, RunFileError), got
    assert str(d / name) in str(got) and ("FIFO" if kind == "fifo" else "character device") in str(got)


@pytest.mark.parametrize("kind,serve", [("fifo", False), ("fifo", True), ("dev-zero", False), ("deep", False)])
def test_the_reproductions_end_in_one_line_without_memory(tmp_path: Path, kind: str, serve: bool) -> None:
    d = write_run(tmp_path / "run")
    hostile(d / ("metrics.jsonl" if kind != "fifo" else "profile.json"), kind)
    code, err, rss = cli("report", str(d), "-o", str(tmp_path / "r.html"), *(["--serve"] if serve else []),
                         cwd=tmp_path)
    assert code != 0 and one_line(err)
    assert rss < 200, f"{rss:.0f} MB"
    assert not (tmp_path / "r.html").exists()


def test_a_file_above_its_cap_is_refused_with_the_cap_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = write_run(tmp_path / "run", range(1, 101))
    monkeypatch.setattr(collect_module, "LINES_CAP", 1000)
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: .*KiB, above the 1000 bytes that hpctrain reads"):
        collect(d, RunFacts(title="run", where=str(d)))
    monkeypatch.setattr(collect_module, "LINES_CAP", 1 << 30)
    monkeypatch.setattr(collect_module, "JSON_CAP", 10)
    with pytest.raises(RunFileError, match=r"profile\.json: .*above the 10 bytes"):
        collect(d, RunFacts(title="run", where=str(d)))


def test_a_line_longer_than_any_record_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain import run_files

    d = write_run(tmp_path / "run")
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "note": "' + "x" * 500 + '"}\n')
    monkeypatch.setattr(run_files, "MAX_LINE", 200)
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: line 11 is longer than 200 bytes"):
        collect(d, RunFacts(title="run", where=str(d)))


# --- a long run: sampled --------------------------------------------------------------------------------------


def test_a_long_run_keeps_an_even_sample_each_attempt_and_the_newest_record(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "run"
    d.mkdir()
    steps = [*range(1, 601), *range(551, 1001)]  # a resume from step 550 after step 600
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in steps))
    monkeypatch.setattr(collect_module, "MAX_RECORDS", 40)
    data = collect(d, RunFacts(title="run", where=str(d)))
    assert data.intervals == len(steps) and data.attempts == 2 and [m.step for m in data.marks] == [600]
    kept = [(r["attempt"], r["step"]) for r in data.records]
    assert len(kept) <= 40 + 2 + 1  # the sample, the first record of each attempt, the newest
    assert kept[-1] == (1, 1000) and (1, 551) in kept and kept[0] == (0, 1)
    first = [s for a, s in kept if a == 0]
    gaps = {b - a for a, b in zip(first, first[1:], strict=False)}
    assert len(gaps) == 1 and gaps.pop() > 1  # every k-th record
    summary = page(data).split('<section id="summary">')[1].split("</section>")[0]
    assert f"{len(steps)} logged; the figures draw an evenly spaced {len(kept)} of them" in summary


# --- -o and RUN -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("out", ["DIR", "/proc/version", "MISSING/x.html", ""])
def test_report_out_is_checked_as_render_checks_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, out: str) -> None:
    monkeypatch.chdir(tmp_path)
    d = write_run(tmp_path / "run")
    missing = tmp_path / "nonexistent"
    rc = main(["report", str(d), "-o", {"DIR": str(tmp_path), "MISSING/x.html": str(missing / "x.html")}.get(out, out)])
    words = one_line(capsys.readouterr().err)
    assert rc != 0 and not missing.exists()  # the directory is not created
    assert {"DIR": "is a directory", "/proc/version": "cannot write the report", "MISSING/x.html":
            f"directory {missing} does not exist", "": "an empty file name"}[out] in words
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no report, no temporary file


@pytest.mark.parametrize("ref", ["", "a" * 100_000])
def test_report_of_an_empty_or_endless_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, ref: str) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["report", ref])
    words = one_line(capsys.readouterr().err)
    assert rc != 0 and len(words) < 400 and not (tmp_path / "report.html").exists()


# --- served mode ----------------------------------------------------------------------------------------------


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def going_on(d: Path) -> Path:
    """``d`` as a run that goes on: no final record, no failure note (the served mode stops at either)."""
    (d / "failure.txt").unlink()
    return d


@pytest.mark.processes
def test_served_mode_says_nothing_when_clients_reset(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    d = going_on(write_run(tmp_path / "run"))  # it serves until stopped
    server = ReportServer(open_source(str(d)), refresh_s=60.0, linger_s=0.0)
    server.httpd.daemon_threads = False  # serve() then joins every request's thread: all they print is captured
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        for _ in range(20):
            client = socket.create_connection((HOST, server.port), timeout=60)
            client.sendall(f"GET /{server.token}/ HTTP/1.1\r\nHost: x".encode())  # a request cut short
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # linger 0: a reset, not a close
        assert status_of(server.url) == 200
    finally:
        server.stop()
        thread.join(120)
    assert not thread.is_alive()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err[-3000:]


def test_served_mode_stops_with_the_error_when_a_file_turns_hostile(tmp_path: Path) -> None:
    d = going_on(write_run(tmp_path / "run"))
    server = ReportServer(open_source(str(d)), refresh_s=0.2, linger_s=0.0)
    ended: list[object] = []
    thread = threading.Thread(target=lambda: ended.append(unblocked(server.serve, [d / "metrics.jsonl"])),
                              daemon=True)
    thread.start()
    assert status_of(server.url) == 200
    hostile(d / "metrics.jsonl", "fifo")
    thread.join(300)
    assert not thread.is_alive()
    assert isinstance(ended[0], RunFileError) and "FIFO" in str(ended[0]), ended


# --- a remote run's files -------------------------------------------------------------------------------------


class CountingTransport(LocalTransport):
    """This machine as the login node, counting the files copied."""

    def __init__(self) -> None:
        self.copied: list[str] = []

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        self.copied.append(Path(remote_path).name)
        super().get(remote_path, local_path)


def test_a_refresh_copies_only_what_changed_and_forgets_what_is_gone(tmp_path: Path) -> None:
    remote = write_run(tmp_path / "remote")
    os.mkfifo(remote / "x-segmentation.h5")  # listed by pattern, but no regular file: neither listed nor read
    cache, known, transport = tmp_path / "cache", {}, CountingTransport()
    cache.mkdir()
    first = unblocked(lambda: fetch(transport, str(remote), cache, known), [remote / "x-segmentation.h5"])
    assert sorted(first) == sorted(RUN_FILES) and len(transport.copied) == len(RUN_FILES)  # type: ignore[arg-type]
    transport.copied.clear()
    fetch(transport, str(remote), cache, known)
    assert transport.copied == []
    with open(remote / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"time": 2000.0, "step": 11, "loss": 0.1}) + "\n")
    (remote / "failure.txt").unlink()
    fetch(transport, str(remote), cache, known)
    assert transport.copied == ["metrics.jsonl"]
    assert (cache / "metrics.jsonl").read_bytes() == (remote / "metrics.jsonl").read_bytes()
    assert not (cache / "failure.txt").exists()  # a note that is gone there is not shown from the copy


def test_a_remote_file_above_its_cap_is_not_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = write_run(tmp_path / "remote")
    monkeypatch.setitem(source_module.FETCH_CAPS, "metrics.jsonl", 100)
    transport = CountingTransport()
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: .*above the 100 bytes"):
        fetch(transport, str(remote), tmp_path, {})
    assert transport.copied == []


@pytest.fixture
def fake_ssh(tmp_path: Path) -> dict[str, str]:
    """An ``ssh`` that runs its remote command on this machine: SSHTransport without a server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n')
    (bin_dir / "ssh").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}


def test_ssh_get_streams_to_disk(tmp_path: Path, fake_ssh: dict[str, str], short_dir: Path) -> None:
    big = tmp_path / "big.h5"
    with open(big, "wb") as f:
        for _ in range(96):
            f.write(os.urandom(MB))
    back = tmp_path / "back.h5"
    code = ("import sys; from hpctrain.submission.transport import SSHTransport; "
            "SSHTransport('login', control_dir=sys.argv[3]).get(sys.argv[1], sys.argv[2])")
    done, mb = measured([sys.executable, "-c", code, str(big), str(back), str(short_dir)], tmp_path, fake_ssh)
    assert done.returncode == 0, done.stderr
    assert back.stat().st_size == big.stat().st_size and back.read_bytes() == big.read_bytes()
    assert mb < 64, f"{mb:.0f} MB for a 96 MB copy"


def test_ssh_get_refuses_what_is_no_regular_file(tmp_path: Path, fake_ssh: dict[str, str], short_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_ssh["PATH"])
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    got = unblocked(lambda: SSHTransport("login", control_dir=str(short_dir)).get(str(fifo), tmp_path / "back",
                                                                                     timeout=300), [fifo])
    assert isinstance(got, TransportError) and "not a regular file" in str(got), got
    assert not (tmp_path / "back").exists()


# --- status reads only regular files --------------------------------------------------------------------------


def test_the_status_script_reads_no_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    note = tmp_path / "failure.txt"
    os.mkfifo(note)
    script = batch_script([], [str(fifo)], [str(fifo)], [str(note)])
    got = unblocked(lambda: LocalTransport().run(["sh", "-c", script], timeout=300, check=False), [fifo, note])
    assert not isinstance(got, BaseException), got
    sections = split_marked_sections(got.stdout, POLL_MARK)  # type: ignore[union-attr]
    assert "end" in sections and all(sections.get(s, {}).get("out", "") == "" for s in ("tail0", "rec0", "note0"))


# --- control characters ---------------------------------------------------------------------------------------


def test_no_control_character_of_a_run_file_reaches_the_page(tmp_path: Path) -> None:
    d = write_run(tmp_path / "run")
    (d / "failure.txt").write_text("rank 1: bad \x1b[2J\x07value\n")
    (d / "ranks" / "node-00000.txt").write_text("rank 0 pid 1 host n\x1b[31m0 parent 1\n")
    (d / "scores.json").write_text(json.dumps({"ffn\x1b]0;title\x07": {"voi": 1.0}}))
    text = page(collect(d, RunFacts(title="run\x1b[5m", where=str(d))))
    assert not any(c in text for c in "\x1b\x07\x9b"), [c for c in text if c in "\x1b\x07\x9b"]
    assert "\\x1b[2J\\x07value" in text and "ffn\\x1b]0;title\\x07" in text


def test_figures_show_run_file_text_as_written_and_the_page_warns_nothing(tmp_path: Path) -> None:
    """A host name with ESC reached a figure's label: matplotlib warned of the missing glyph on the terminal, the
    raw ESC in its message; a host name between dollar signs was parsed as TeX (and a bad one lost the figure)."""
    d = write_run(tmp_path / "run")
    (d / "ranks" / "node-00000.txt").write_text("rank 0 pid 1 host n\x1b[31m0 parent 1\n"
                                                "rank 1 pid 2 host $\\frac$ parent 1\n")
    (d / "profile.json").write_text(json.dumps({"ranks": 2, "ranks_per_node": 2, "sample_unit": "img\x07",
                                                "compute_s": {"mean": 0.03}}))
    data = collect(d, RunFacts(title="run", where=str(d)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        heat, rate = figures.heatmap_figure(data.ranks), figures.throughput_figure(data)  # type: ignore[arg-type]
        text = page(data)
    assert [str(w.message) for w in caught] == []
    assert "rank 0 (n\\x1b[31m0)" in heat and "rank 1 ($\\frac$)" in heat and "img\\x07/s" in rate
    assert not any(c in heat + rate + text for c in "\x1b\x07")


def test_a_profile_without_step_timings_is_said_not_drawn(tmp_path: Path) -> None:
    """A profile.json with no timed part drew an empty bar and matplotlib warned of a legend without entries."""
    d = write_run(tmp_path / "run")  # its profile.json: ranks only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = page(collect(d, RunFacts(title="run", where=str(d))))
    assert [str(w.message) for w in caught] == []
    step = text.split('<section id="step-time">')[1].split("</section>")[0]
    assert "profile.json holds no step timings" in step and "<svg" not in step


def test_attempts_without_a_number_for_the_loss_draw_no_empty_legend(tmp_path: Path) -> None:
    d = write_run(tmp_path / "run")
    (d / "attempts.jsonl").unlink()  # the attempts are then told by the step going back
    steps = [*range(1, 6), *range(3, 8)]  # a resume after step 5 from step 2: two attempts
    (d / "metrics.jsonl").write_text("".join(json.dumps({"time": 1000.0 + i, "step": s, "loss": None}) + "\n"
                                             for i, s in enumerate(steps)))
    data = collect(d, RunFacts(title="run", where=str(d)))
    assert data.attempts == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page(data)
    assert [str(w.message) for w in caught] == []
