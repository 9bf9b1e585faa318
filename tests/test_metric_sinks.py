"""The ``metrics:`` sinks under bad input: a tracking server that refuses the connection is one warning line and the
run trains on; paths stay inside the run directory unless absolute; a run-id file that is not a regular file, not an
id or not the store's, and a store that fails while training, are one readable warning line each, never a hang or a
traceback. (The sinks' scalars and the requeued run's TensorBoard and MLflow records: test_report*.py.)
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpctrain.config.job import load_job
from hpctrain.errors import ConfigError
from hpctrain.runtime.metric_sinks import MLFLOW_RUN_FILE, open_sinks, tracking_uri

REPO = Path(__file__).resolve().parent.parent
# A hang guard only: rank 0 reaches its first step in seconds once the sinks stop waiting on the server.
GUARD_S = 180
WARNING = re.compile(r"WARNING hpctrain\.metrics: (.*)")


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A local port that is bound but not listening: every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables the MLflow sink sets in rank 0's process are set (or not) in this test only."""
    for name in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def spec_file(tmp_path: Path, metrics: str, steps: int = 4) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: sinks
        model: tests.mp_helpers.trainer_models:logged
        model_args: {{log_dir: {tmp_path / 'log'}, batch_per_rank: 4, seed: 0}}
        train: {{steps: {steps}, batch_per_rank: 4, lr: 0.01, optimizer: sgd, lr_scaling: none, log_every: 2,
                collective_timeout_s: 20, seed: 0}}
        metrics: {metrics}
        """))
    return spec


def sinks_wanted(tensorboard_dir: str | None = None, tracking: str | None = None) -> SimpleNamespace:
    mlflow = SimpleNamespace(tracking_uri=tracking, experiment=None) if tracking else None
    return SimpleNamespace(tensorboard=tensorboard_dir is not None, tensorboard_dir=tensorboard_dir or "tensorboard",
                           mlflow=mlflow)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hpctrain.metrics"]


# --- a tracking server that refuses ---------------------------------------------------------------------------


@pytest.mark.processes
def test_a_refused_tracking_server_is_one_warning_and_the_run_trains(tmp_path: Path, refused_port: int) -> None:
    spec = spec_file(tmp_path, f"{{mlflow: {{tracking_uri: 'http://127.0.0.1:{refused_port}'}}}}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "run", str(spec), "--run-dir", str(tmp_path / "run"),
                             "--backend", "none"], cwd=REPO, env=env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    guard = threading.Timer(GUARD_S, lambda: os.killpg(proc.pid, signal.SIGKILL))
    guard.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the event waited for: rank 0's first interval record
            lines.append(line.rstrip("\n"))
            if line.startswith("step 2/4"):
                break
        out = "\n".join(lines)
        assert lines and lines[-1].startswith("step 2/4"), f"no training step (hang guard {GUARD_S} s?):\n{out}"
        rest, _ = proc.communicate()
    finally:
        guard.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "\n".join(lines) + "\n" + rest
    assert proc.returncode == 0, out
    warned = [m.group(1) for m in map(WARNING.search, out.splitlines()) if m]
    assert warned == [f"metrics.mlflow (http://127.0.0.1:{refused_port}): Connection refused; training goes on "
                      "without it (metrics.jsonl keeps every record)"], out
    assert "Traceback" not in out and "Retrying" not in out, out
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2


# --- where the sinks write --------------------------------------------------------------------------------------


def write(tmp_path: Path, metrics: str) -> Path:
    path = tmp_path / "j.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: j
        model: resnet
        train: {{steps: 10, batch_per_rank: 2, lr: 0.1}}
        metrics:
          {metrics}
        """))
    return path


@pytest.mark.parametrize("metrics, key", [
    ("tensorboard_dir: ../../x", "metrics.tensorboard_dir"),
    ("tensorboard_dir: tb/../../x", "metrics.tensorboard_dir"),
    ("mlflow: {tracking_uri: ../../x}", "metrics.mlflow.tracking_uri"),
    ("mlflow: {tracking_uri: ..}", "metrics.mlflow.tracking_uri"),
])
def test_a_relative_path_out_of_the_run_directory_is_refused_naming_line_and_key(
        tmp_path: Path, metrics: str, key: str) -> None:
    path = write(tmp_path, metrics)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    text = str(info.value)
    assert text.startswith(f"{path}:5: {key}: "), text
    assert "leads out of the run directory" in text and "give an absolute path" in text and "\n" not in text


def test_a_relative_file_uri_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "mlflow: {tracking_uri: 'file:../mlruns'}")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert str(info.value).startswith(f"{path}:5: metrics.mlflow.tracking_uri: 'file:../mlruns' is a relative file:")


@pytest.mark.parametrize("metrics", [
    "tensorboard_dir: tb/../board", "tensorboard_dir: /shared/tb/run-1", "tensorboard_dir: ~/tb",
    "mlflow: {tracking_uri: mlruns}", "mlflow: {tracking_uri: /shared/mlruns}", "mlflow: {tracking_uri: ~/mlruns}",
    "mlflow: {tracking_uri: 'file:///shared/mlruns'}", "mlflow: {tracking_uri: 'http://mlflow:5000'}",
])
def test_paths_inside_the_run_directory_and_absolute_ones_are_taken(tmp_path: Path, metrics: str) -> None:
    load_job(write(tmp_path, metrics))


def test_a_relative_path_is_under_the_run_directory_and_an_absolute_one_as_written(tmp_path: Path) -> None:
    from hpctrain.runtime.metric_sinks import local_dir

    run = tmp_path / "run"
    assert local_dir("tb", run) == run / "tb"
    assert local_dir("/shared/tb", run) == Path("/shared/tb")
    assert local_dir("~/tb", run) == Path.home() / "tb"
    assert tracking_uri("/shared/mlruns", run) == "file:///shared/mlruns"
    assert tracking_uri("file:///shared/mlruns", run) == "file:///shared/mlruns"


# --- sinks that cannot open or fail later ---------------------------------------------------------------------


@pytest.mark.timeout(120)  # a hang guard: the FIFO was opened for writing and waited for a reader for ever
def test_a_fifo_run_id_file_is_one_warning_not_a_hang(tmp_path: Path, mlflow_env: None,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    os.mkfifo(tmp_path / MLFLOW_RUN_FILE)
    with caplog.at_level(logging.WARNING):
        assert open_sinks(sinks_wanted(tracking="mlruns"), tmp_path, "j") == []
    assert warnings_of(caplog) == [
        f"metrics.mlflow (mlruns): {tmp_path / MLFLOW_RUN_FILE} is a FIFO (named pipe), not a regular file: remove "
        "it to start a new MLflow run; training goes on without it (metrics.jsonl keeps every record)"]


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe not text", "does not hold an MLflow run id: remove it to start a new MLflow run"),
    (b"0123456789abcdef0123456789abcdef\n", "the MLflow run 0123456789abcdef0123456789abcdef that {file} names cannot "
     "be continued (Run '0123456789abcdef0123456789abcdef' not found): remove the file to start a new MLflow run"),
])
def test_a_run_id_file_that_names_no_run_of_the_store_is_one_warning(
        tmp_path: Path, mlflow_env: None, caplog: pytest.LogCaptureFixture, content: bytes, why: str) -> None:
    id_file = tmp_path / MLFLOW_RUN_FILE
    id_file.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert open_sinks(sinks_wanted(tracking="mlruns"), tmp_path, "j") == []
    (text,) = warnings_of(caplog)
    assert why.format(file=id_file) in text and text.startswith("metrics.mlflow (mlruns): "), text


def test_a_sink_directory_that_cannot_be_made_is_one_warning_each(tmp_path: Path, mlflow_env: None,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "taken").write_text("a file where the directories would go\n")
    with caplog.at_level(logging.WARNING):
        assert open_sinks(sinks_wanted(tensorboard_dir="taken", tracking="taken"), tmp_path, "j") == []
    board, mlflow = warnings_of(caplog)
    assert board == (f"metrics.tensorboard: {tmp_path / 'taken'}: File exists; training goes on without it "
                     "(metrics.jsonl keeps every record)")
    assert re.fullmatch(rf"metrics\.mlflow \(taken\): {re.escape(str(tmp_path / 'taken'))}/\S+: Not a directory; "
                        r"training goes on without it \(metrics\.jsonl keeps every record\)", mlflow), mlflow


def test_a_store_that_fails_while_training_is_one_warning_and_then_left_out(
        tmp_path: Path, mlflow_env: None, caplog: pytest.LogCaptureFixture) -> None:
    (sink,) = open_sinks(sinks_wanted(tracking="mlruns"), tmp_path, "j")
    sink.write({"step": 1, "loss": 0.5})
    shutil.rmtree(tmp_path / "mlruns")
    (tmp_path / "mlruns").write_text("the store is gone\n")
    with caplog.at_level(logging.WARNING):
        for step in (2, 3):
            sink.write({"step": step, "loss": 0.25})
        sink.close()
    (text,) = warnings_of(caplog)
    assert text.startswith("metrics.mlflow (mlruns): writing failed: ") and text.endswith(
        "; training goes on without it from here on (metrics.jsonl keeps every record)"), text
