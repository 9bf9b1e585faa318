"""Where rank 0's metrics go besides ``metrics.jsonl``: TensorBoard event files and MLflow tracking, each turned on
by the job spec's ``metrics`` section (both off by default; docs/report.md, "TensorBoard and MLflow"). Every sink
receives the same records as ``metrics.jsonl`` and writes their numbers as scalars at the record's step.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from hpctrain.errors import ConfigError

# Keys of a metrics record that are not measurements.
NOT_SCALARS = frozenset({"step", "time", "ranks", "final"})
# A requeued attempt logs into the MLflow run of the first attempt: its id is kept here.
MLFLOW_RUN_FILE = "mlflow-run-id"
# The final record's numbers (evaluation scores and the last interval's loss) go under this prefix.
FINAL_PREFIX = "final/"


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


def tracking_uri(given: str, run_dir: Path) -> str:
    """A URI as MLflow takes it: a plain path (relative to the run directory) becomes a ``file:`` URI."""
    if "://" in given or given.startswith("file:"):
        return given
    path = Path(os.path.expanduser(given))
    return (path if path.is_absolute() else run_dir / path).resolve().as_uri()


class MlflowSink:
    """Metrics of one MLflow run per hpctrain run (an experiment named after the job); a requeued attempt goes on
    logging into the same MLflow run."""

    def __init__(self, uri: str, experiment: str, run_dir: Path) -> None:
        if uri.startswith("file:"):
            # MLflow refuses its file store unless asked: a directory is what a compute node can always write.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ConfigError(f"metrics.mlflow is set but MLflow cannot be imported ({exc})", key="metrics.mlflow",
                              hint="pip install mlflow-skinny in the job's Python") from None
        self._metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        id_file = run_dir / MLFLOW_RUN_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else ""
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            id_file.write_text(run_id + "\n", encoding="utf-8")
        self.run_id = run_id

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        stamp = int(float(record.get("time", time.time())) * 1000)
        metrics = [self._metric(key, value, stamp, step) for key, value in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


def open_sinks(metrics: Any, run_dir: Path, job_name: str) -> list[MetricsSink]:
    """The sinks the job spec's ``metrics`` section asks for (rank 0 only)."""
    sinks: list[MetricsSink] = []
    if metrics.tensorboard:
        sinks.append(TensorBoardSink(run_dir / metrics.tensorboard_dir))
    if metrics.mlflow is not None:
        sinks.append(MlflowSink(tracking_uri(metrics.mlflow.tracking_uri, run_dir),
                                metrics.mlflow.experiment or job_name, run_dir))
    return sinks
