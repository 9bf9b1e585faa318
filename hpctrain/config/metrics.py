"""The job spec's ``metrics`` section: TensorBoard and MLflow beside ``metrics.jsonl`` (docs/report.md, "TensorBoard
and MLflow"), and where their files may go: a relative path stays inside the run directory, an absolute (or ``~/``)
path is taken as written, for a store shared by many runs.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from hpctrain.config.common import Strict

MAX_PATH = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def is_uri(value: str) -> bool:
    """Whether a tracking URI names a scheme (``http://``, ``file:``, ``sqlite://``) rather than a directory."""
    return "://" in value or value.startswith("file:")


def is_absolute(path: str) -> bool:
    """Absolute or home-relative (``~``, ``~/...``, expanded on the node that writes)."""
    return path.startswith("/") or path == "~" or path.startswith("~/")


def _plain(value: str, what: str) -> str:
    if _CONTROL.search(value) or len(value) > MAX_PATH:
        raise ValueError(f"{what} holds a control character or is longer than {MAX_PATH} characters")
    return value


def _check_run_path(value: str, what: str) -> str:
    """A relative path that stays inside the run directory, or an absolute one."""
    _plain(value, what)
    if not is_absolute(value):
        normal = posixpath.normpath(value)
        if normal == ".." or normal.startswith("../"):
            raise ValueError(f"{what} {value!r} leads out of the run directory ('..'): a relative path stays inside "
                             "it; give an absolute path for a directory elsewhere")
    return value


def _check_tensorboard_dir(value: str) -> str:
    return _check_run_path(value, "the TensorBoard directory")


def _check_tracking_uri(value: str) -> str:
    if not is_uri(value):
        return _check_run_path(value, "the MLflow directory")
    _plain(value, "the tracking URI")
    if value.startswith("file:") and not urlsplit(value).path.startswith("/"):
        raise ValueError(f"{value!r} is a relative file: URI (relative to where rank 0 happens to start): write "
                         "file:///absolute/path, or a plain directory for one inside the run directory")
    return value


TensorBoardDir = Annotated[str, AfterValidator(_check_tensorboard_dir)]
TrackingUri = Annotated[str, AfterValidator(_check_tracking_uri)]


class MlflowConfig(Strict):
    tracking_uri: TrackingUri = Field(
        min_length=1, description="MLflow tracking URI, or a directory for MLflow's file store: relative to the run "
                                  "directory (and inside it), or absolute for a store shared by many runs")
    experiment: str | None = Field(None, min_length=1, description="Experiment name (default: the job's name)")


class MetricsConfig(Strict):
    tensorboard: bool = Field(False, description="Rank 0 also writes the metrics as TensorBoard event files")
    tensorboard_dir: TensorBoardDir = Field(
        "tensorboard", min_length=1,
        description="Where the event files go: relative to the run directory (and inside it), or absolute")
    mlflow: MlflowConfig | None = Field(None, description="Rank 0 also logs the metrics to this MLflow tracking URI")
