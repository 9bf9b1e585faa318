"""Where rank 0's metrics go besides ``metrics.jsonl``: TensorBoard event files and MLflow tracking, each turned on
by the job spec's ``metrics`` section (both off by default; docs/report.md, "TensorBoard and MLflow"). Every sink
receives the same records as ``metrics.jsonl`` and writes their numbers as scalars at the record's step.

A sink is a copy of what ``metrics.jsonl`` holds: one that cannot open (a tracking server that does not answer, a
directory that cannot be made) or fails later is one warning line, and training goes on without it. Only a sink's
package missing from the job's Python stops the run at start-up, on every rank.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hpctrain.config.metrics import is_uri
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.files import NotRegularFile, read_regular_bytes, write_atomic
from hpctrain.text import printable

log = logging.getLogger("hpctrain.metrics")

# Keys of a metrics record that are not measurements.
NOT_SCALARS = frozenset({"step", "time", "ranks", "final"})
# A requeued attempt logs into the MLflow run of the first attempt: its id is kept here.
MLFLOW_RUN_FILE = "mlflow-run-id"
# What MLflow accepts as a run id (its own check); a longer file is not one.
_RUN_ID = re.compile(r"[A-Za-z0-9][\w-]{0,255}", re.ASCII)
_RUN_ID_BYTES = 300
# The final record's numbers (evaluation scores and the last interval's loss) go under this prefix.
FINAL_PREFIX = "final/"
# MLflow's HTTP client waits 120 s for an answer and retries a failed request 7 times with growing pauses (four
# minutes for a refused connection), while every rank waits for rank 0 at start-up. These bound one request to
# about half a minute (3 tries of at most 10 s each, pauses of 0 and 2-3 s); a job's ``env:`` sets other values.
MLFLOW_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                      "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
_REASON_CHARS = 400


class SinkUnavailable(Exception):
    """A sink cannot be used; the message says why and what to do."""


class MetricsSink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers by name (booleans, counts of ranks and the step itself left out)."""
    out = {}
    prefix = FINAL_PREFIX if record.get("final") else ""
    for key, value in record.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[prefix + key] = float(value)
    return out


class TensorBoardSink:
    """Event files in ``log_dir`` (one per attempt: TensorBoard joins the attempts of a requeued run by step)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(f"metrics.tensorboard is on but TensorBoard cannot be imported ({exc})",
                              key="metrics.tensorboard",
                              hint="pip install tensorboard in the job's Python (the train extra has it)") from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, record: dict[str, Any]) -> None:
        step, walltime = int(record.get("step", 0)), record.get("time")
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, step, walltime=walltime)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def local_dir(given: str, run_dir: Path) -> Path:
    """A directory of the spec on rank 0's node: relative to the run directory (the spec's check keeps it inside),
    or absolute (``~`` expanded)."""
    path = Path(os.path.expanduser(given))
    return path if path.is_absolute() else run_dir / path


def tracking_uri(given: str, run_dir: Path) -> str:
    """A URI as MLflow takes it: a plain path (relative to the run directory) becomes a ``file:`` URI."""
    return given if is_uri(given) else local_dir(given, run_dir).resolve().as_uri()


def remembered_run_id(id_file: Path) -> str:
    """The MLflow run an earlier attempt of this run logged into ('' when none did); read only from a regular
    file (a FIFO would hold rank 0 for ever)."""
    try:
        data = read_regular_bytes(id_file, limit=_RUN_ID_BYTES)
    except FileNotFoundError:
        return ""
    except NotRegularFile as exc:
        raise SinkUnavailable(f"{id_file} {exc.strerror}: remove it to start a new MLflow run") from None
    text = data.decode("utf-8", errors="replace").strip()
    if text and not _RUN_ID.fullmatch(text):
        raise SinkUnavailable(f"{id_file} does not hold an MLflow run id: remove it to start a new MLflow run")
    return text


class MlflowSink:
    """Metrics of one MLflow run per hpctrain run (an experiment named after the job); a requeued attempt goes on
    logging into the same MLflow run."""

    def __init__(self, uri: str, experiment: str, run_dir: Path) -> None:
        if uri.startswith("file:"):
            # MLflow refuses its file store unless asked: a directory is what a compute node can always write.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for name, value in MLFLOW_HTTP_LIMITS.items():
            os.environ.setdefault(name, value)
        retries = logging.getLogger("urllib3.connectionpool")
        if retries.level == logging.NOTSET:  # each retry is a warning line of its own; the sink's line tells the end
            retries.setLevel(logging.ERROR)
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ConfigError(f"metrics.mlflow is set but MLflow cannot be imported ({exc})", key="metrics.mlflow",
                              hint="pip install mlflow-skinny in the job's Python") from None
        self._metric = Metric
        id_file = run_dir / MLFLOW_RUN_FILE
        run_id = remembered_run_id(id_file)  # before any request: a bad file is told without waiting on a server
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        if run_id:
            try:
                self.client.update_run(run_id, status="RUNNING")
            except Exception as exc:
                raise SinkUnavailable(f"the MLflow run {run_id} that {id_file} names cannot be continued "
                                      f"({failure_reason(exc)}): remove the file to start a new MLflow run") from None
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            write_atomic(id_file, run_id + "\n")
        self.run_id = run_id

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        stamp = int(float(record.get("time", time.time())) * 1000)
        metrics = [self._metric(key, value, stamp, step) for key, value in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


class GuardedSink:
    """A sink whose failure is one warning line, after which it is left out: training never stops for a copy of
    what metrics.jsonl keeps."""

    def __init__(self, sink: MetricsSink, name: str) -> None:
        self.sink: MetricsSink | None = sink
        self.name = name

    def write(self, record: dict[str, Any]) -> None:
        if self.sink is None:
            return
        try:
            self.sink.write(record)
        except Exception as exc:
            # Not closed: closing a sink whose server has just failed would wait on it once more.
            self.sink = None
            _warn(self.name, f"writing failed: {failure_reason(exc)}; training goes on without it from here on")

    def close(self) -> None:
        if self.sink is None:
            return
        sink, self.sink = self.sink, None
        try:
            sink.close()
        except Exception as exc:
            _warn(self.name, f"closing failed: {failure_reason(exc)}")


def failure_reason(exc: BaseException) -> str:
    """One line saying why: an operating-system error as "path: reason", also where a library wraps one (MLflow's
    HTTP client over a refused connection); otherwise the exception's first line."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            name = current.filename
            text = f"{name}: {current.strerror}" if name else current.strerror
            break
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    else:
        lines = str(exc).strip().splitlines()
        text = lines[0] if lines else type(exc).__name__
    text = printable(text)
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def _warn(name: str, text: str) -> None:
    log.warning("%s: %s (metrics.jsonl keeps every record)", name, text)


def _opened(name: str, make: Callable[[], MetricsSink]) -> list[MetricsSink]:
    """``make()`` guarded, or nothing and one warning line when it fails (a missing package is the run's error)."""
    try:
        return [GuardedSink(make(), name)]
    except HpctrainError:
        raise
    except Exception as exc:
        _warn(name, f"{failure_reason(exc)}; training goes on without it")
        return []


def open_sinks(metrics: Any, run_dir: Path, job_name: str) -> list[MetricsSink]:
    """The sinks the job spec's ``metrics`` section asks for (rank 0 only)."""
    sinks: list[MetricsSink] = []
    if metrics.tensorboard:
        sinks += _opened("metrics.tensorboard", lambda: TensorBoardSink(local_dir(metrics.tensorboard_dir, run_dir)))
    if metrics.mlflow is not None:
        given = metrics.mlflow.tracking_uri
        sinks += _opened(f"metrics.mlflow ({printable(given)})",
                         lambda: MlflowSink(tracking_uri(given, run_dir), metrics.mlflow.experiment or job_name,
                                            run_dir))
    return sinks
