"""Staging: the Python environment and the input files copied once per node to node-local storage before the ranks
start, so that thousands of ranks do not read them from the shared file system (docs/scaling.md, "Staging").

A site profile says where its nodes' local storage is and how big (``staging.node_local_dir``, ``node_local_gb``)
and may choose a default; a job's ``staging:`` overrides the choice key by key. Both sides read this module (no
torch): the renderer writes the staging step, ``hpctrain run`` points the ranks at the node-local copies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from hpctrain.config.common import FieldProblem, Strict, Word
from hpctrain.errors import ConfigError
from hpctrain.launch_env import NODE_LOCAL_ENV

EnvironmentStaging = Literal["none", "archive", "container"]
ContainerRuntime = Literal["apptainer", "podman-hpc", "shifter"]

# The variables a node-local directory may name: the user (Frontier's /mnt/bb/$USER) and the scheduler's per-job
# temporary directory. Anything else with a '$' is refused rather than taken literally by surprise.
NODE_LOCAL_VARIABLES = ("USER", "TMPDIR")
NODE_LOCAL_VARIABLE = re.compile(r"\$(?:\{(" + "|".join(NODE_LOCAL_VARIABLES) + r")\}|("
                                 + "|".join(NODE_LOCAL_VARIABLES) + r")(?![A-Za-z0-9_]))")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_HOME = re.compile(r"(?:~|\$HOME|\$\{HOME\})(?:/.*)?", re.DOTALL)
MAX_PATH = 4096

# Environment variables the rendered script sets for the ranks (read by ``hpctrain run``); NODE_LOCAL_ENV, this
# job's directory on the node-local storage, is launch_env's.
DATA_MAP_ENV = "HPCTRAIN_STAGED_DATA"  # JSON {shared path: path relative to $HPCTRAIN_NODE_LOCAL}
ENV_DIR = "env"  # the unpacked environment, under $HPCTRAIN_NODE_LOCAL
DATA_DIR = "data"  # staged input files, under $HPCTRAIN_NODE_LOCAL
STAGED_PYTHON = f"{ENV_DIR}/venv/bin/python"  # the ranks' interpreter in an unpacked archive
SHM = Path("/dev/shm")  # RAM-backed: the node's own storage where nothing was staged


def node_local_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """This node's own storage, where one process per node leaves what the node's other ranks read (a copy of the
    training volume, rank states on their way into a per-node checkpoint file): ``$HPCTRAIN_NODE_LOCAL`` when the
    script staged, else ``/dev/shm``; None when neither is a writable directory (callers then read per rank)."""
    environ = os.environ if environ is None else environ
    for candidate in (environ.get(NODE_LOCAL_ENV, ""), str(SHM)):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return Path(candidate)
    return None


def _plain_path(value: str, what: str) -> str:
    if _CONTROL.search(value) or len(value) > MAX_PATH:
        raise ValueError(f"{what} holds a control character or is longer than {MAX_PATH} characters")
    return value


def _check_node_local_dir(value: str) -> str:
    """Absolute (or under ``$TMPDIR``); ``$USER``/``$TMPDIR`` are the only variables, expanded on the node."""
    _plain_path(value, "the node-local directory")
    if not (value.startswith("/") or re.match(r"\$(\{TMPDIR\}|TMPDIR)(/|$)", value)):
        raise ValueError("the node-local directory must be absolute (e.g. /tmp, /local/scratch, /mnt/bb/$USER) "
                         "or start with $TMPDIR")
    if "$" in NODE_LOCAL_VARIABLE.sub("", value):
        raise ValueError("the node-local directory may name only $USER and $TMPDIR (expanded on each node); "
                         "write any other part literally")
    return value


def _check_shared_path(value: str) -> str:
    """An absolute or home-relative path on the shared file system (it becomes a quoted word in the script)."""
    _plain_path(value, "the path")
    if not (value.startswith("/") or _HOME.fullmatch(value)):
        raise ValueError("must be absolute or start with ~/ or $HOME/ (the job's shell reads it on another machine)")
    return value


def _check_image(value: str) -> str:
    return _plain_path(value, "the image")


NodeLocalDir = Annotated[str, AfterValidator(_check_node_local_dir)]
SharedPath = Annotated[str, AfterValidator(_check_shared_path)]
Image = Annotated[str, AfterValidator(_check_image)]


class Container(Strict):
    """The container the ranks run in: the site's runtime and an image the job's Python and hpctrain are in."""

    runtime: ContainerRuntime = Field("apptainer", description="apptainer (a .sif file, copied to every node's "
                                      "local storage), podman-hpc or shifter (an image the site's gateway serves)")
    image: Image | None = Field(None, description="apptainer: path of the .sif on a shared file system; podman-hpc: "
                                "image name; shifter: docker:NAME:TAG")
    python: Word = Field("python3", description="The interpreter inside the image")
    options: list[Word] = Field(default_factory=list, description="More options for the runtime (e.g. --bind=/lus)")

    @model_validator(mode="after")
    def _has_image(self) -> Container:
        if not self.image:
            raise FieldProblem(("image",), f"a {self.runtime} container needs an image")
        if self.runtime == "apptainer" and not (self.image.startswith("/") or _HOME.fullmatch(self.image)):
            raise FieldProblem(("image",), "apptainer's image is a .sif file: give its absolute path")
        return self


class JobStaging(Strict):
    """What a job stages (a job's ``staging:``; each key it sets replaces the site's)."""

    environment: EnvironmentStaging = Field(
        "none", description="none: the ranks start from the shared environment; archive: the job's Python "
        "environment, packed once and unpacked on every node; container: the ranks run in staging.container")
    archive_cache: SharedPath = Field(
        "$HOME/.cache/hpctrain/envs", description="Shared directory where packed environments are kept (reused "
        "while the environment is unchanged)")
    container: Container | None = None
    data: bool | list[str] = Field(
        False, description="Copy the job's input files to every node's local storage: true for every file the model "
        "reads (data.train.image, data.coordinates, ...), or a list of those keys")

    @model_validator(mode="after")
    def _container_named(self) -> JobStaging:
        if self.environment == "container" and self.container is None:
            raise FieldProblem(("container",), "environment: container needs container: {runtime, image}")
        return self


class Staging(JobStaging):
    """A site's staging: where its nodes' local storage is, and the default choice for its jobs."""

    node_local_dir: NodeLocalDir | None = Field(
        None, description="Node-local directory for staged copies ($USER and $TMPDIR expand on each node)")
    node_local_gb: float | None = Field(None, gt=0, description="Its size per node, GB")
    node_local_ram: bool = Field(False, description="RAM-backed (tmpfs): what is staged counts against the node's "
                                 "memory")


def effective(site: Staging, job: JobStaging | None) -> Staging:
    """The site's staging with the keys the job set on top."""
    if job is None or not job.model_fields_set:
        return site
    return site.model_copy(update={k: getattr(job, k) for k in job.model_fields_set})


def archive_key(python: str) -> str:
    """The cache name of the environment of interpreter ``python`` as the script names it (both sides agree)."""
    return "env-" + hashlib.sha256(python.encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------------------------- input files


def data_files(paths: Mapping[str, str], chosen: bool | list[str]) -> dict[str, str]:
    """``{shared path: name under $HPCTRAIN_NODE_LOCAL}`` of the files to stage.

    ``paths`` is the model plug-in's ``data_paths`` (key -> file); ``chosen`` the staging's ``data``. A file named
    by two keys (an HDF5 file holding image and labels) is copied once. Unknown keys are a ConfigError.
    """
    if chosen is False:
        return {}
    keys = list(paths) if chosen is True else list(chosen)
    unknown = [k for k in keys if k not in paths]
    if unknown:
        raise ConfigError(f"staging.data names {', '.join(map(repr, unknown))}, which the model does not read",
                          key="staging.data",
                          hint=f"its input files: {', '.join(paths) or 'none'}; or write staging.data: true")
    files: dict[str, str] = {}
    for key in keys:
        shared = paths[key]
        if shared not in files:
            base = os.path.basename(shared.rstrip("/")) or "input"
            files[shared] = f"{DATA_DIR}/{len(files)}-{base}"
    return files


def rewrite_data(data: Any, files: Mapping[str, str], root: str) -> Any:
    """``data`` (a job's ``data:`` mapping) with every value naming a staged file pointed at its node-local copy.

    A value is rewritten when it is the shared path itself, or the path followed by ``:`` and a dataset
    (``/lus/x.h5:image``); mappings and lists are walked. What the user wrote stays in the run's job.yaml.
    """
    if isinstance(data, Mapping):
        return {k: rewrite_data(v, files, root) for k, v in data.items()}
    if isinstance(data, list):
        return [rewrite_data(v, files, root) for v in data]
    if isinstance(data, str):
        for shared, local in files.items():
            if data == shared or data.startswith(shared + ":"):
                return f"{root.rstrip('/')}/{local}" + data[len(shared):]
    return data


def staged_data_from_env(environ: Mapping[str, str]) -> tuple[dict[str, str], str] | None:
    """(files, node-local root) when the rendered script staged input files, else None."""
    text, root = environ.get(DATA_MAP_ENV), environ.get(NODE_LOCAL_ENV)
    if not text or not root:
        return None
    try:
        files = json.loads(text)
    except ValueError:
        raise ConfigError(f"${DATA_MAP_ENV} is not the JSON the rendered script writes: {text[:80]!r}",
                          hint="render the script again with this hpctrain") from None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ConfigError(f"${DATA_MAP_ENV} must map shared paths to node-local names")
    return files, root
