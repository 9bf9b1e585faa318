"""Staging (config/staging.py, submission/staging.py): the models, the data paths the ranks are pointed at, what
render refuses, hostile text in every staging field, and the staged script of PBS Pro and Cobalt run for real.

No PBS Pro or Cobalt exists here: their scripts run under bash with stand-ins for ``mpiexec``/``aprun`` that start
the command once (one node, as ``--ppn 1``/``-N 1`` asks) for the staging step, and record the rank launch while
checking that its interpreter, the node-local copy, starts. The staging step itself (check, unpack, copy) is the
real node script on a real archive packed from a real venv. Slurm's path runs on the real Slurm in
tests/test_staging_slurm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_envpack import make_venv, pack

from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.site import load_site_file
from hpctrain.config.staging import (
    DATA_MAP_ENV,
    NODE_LOCAL_ENV,
    archive_key,
    data_files,
    effective,
    rewrite_data,
    staged_data_from_env,
)
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submission.render import render_script
from hpctrain.submission.shell import ShellWord

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return path


def site_doc(scheduler: str = "slurm", **staging: Any) -> dict[str, Any]:
    launcher = {"slurm": "srun", "pbs": "mpiexec", "cobalt": "aprun"}[scheduler]
    doc: dict[str, Any] = {"name": "stagesite", "scheduler": scheduler, "launcher": launcher,
                           "node": {"cores": 4, "memory_gb": 8}, "comm_backend": "gloo"}
    if staging:
        doc["staging"] = staging
    return doc


def ffn_job(data: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": "stagejob", "model": "ffn",
            "model_args": {"depth": 1, "features": 4, "fov": [9, 9, 9], "deltas": [2, 2, 2]},
            "data": data or {"train": {"image": "/lus/p/vol.h5:image", "labels": "/lus/p/vol.h5:labels"},
                             "coordinates": "/lus/p/coords.npz"},
            "train": {"steps": 3, "batch_per_rank": 1, "lr": 0.01},
            "resources": {"nodes": 2, "ranks_per_node": 2, "walltime": "00:10:00"},
            "checkpoint": {"signal_lead_s": 10}, **extra}


def render(tmp: Path, site: dict[str, Any], job: dict[str, Any], python: str = "/sw/venv/bin/python") -> Any:
    return render_script(load_job(write(tmp / "job.yaml", job)), load_site_file(write(tmp / "site.yaml", site)),
                         run_dir="/runs/r1", spec_path="/runs/r1/job.yaml", python=python)


# ------------------------------------------------------------------------------------------------- the models


def test_a_job_overrides_the_sites_choice_key_by_key(tmp_path: Path) -> None:
    site = load_site_file(write(tmp_path / "s.yaml", site_doc(node_local_dir="/tmp", environment="archive")))
    job = load_job(write(tmp_path / "j.yaml", ffn_job(staging={"data": True})))
    merged = effective(site.staging, job.staging)
    assert merged.environment == "archive" and merged.data is True and merged.node_local_dir == "/tmp"
    job = load_job(write(tmp_path / "j.yaml", ffn_job(staging={"environment": "none"})))
    assert effective(site.staging, job.staging).environment == "none"
    assert effective(site.staging, None) is site.staging


@pytest.mark.parametrize(("where", "value", "message"), [
    ("site", {"node_local_dir": "scratch"}, "must be absolute"),
    ("site", {"node_local_dir": "/lus/$SCRATCH/x"}, "may name only $USER and $TMPDIR"),
    ("site", {"node_local_dir": "/tmp/a\nb"}, "control character"),
    ("site", {"environment": "container"}, "needs container"),
    ("site", {"environment": "container", "container": {"runtime": "apptainer", "image": "ffn.sif"}}, "absolute"),
    ("site", {"environment": "container", "container": {"runtime": "shifter"}}, "needs an image"),
    ("site", {"archive_cache": "cache"}, "absolute or start with ~/"),
    ("site", {"directives": {"time": "10"}}, "written by hpctrain"),
    ("job", {"node_local_dir": "/tmp"}, "node_local_dir"),
    ("job", {"environment": "docker"}, "environment"),
])
def test_bad_staging_is_one_line_naming_the_key(tmp_path: Path, where: str, value: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        if where == "site":
            load_site_file(write(tmp_path / "s.yaml", site_doc(**value)))
        else:
            load_job(write(tmp_path / "j.yaml", ffn_job(staging=value)))
    text = str(caught.value)
    assert "\n" not in text and message in text and "staging" in text, text


def test_archive_key_is_the_interpreter_as_written() -> None:
    assert archive_key("$HOME/venv/bin/python") == archive_key("$HOME/venv/bin/python")
    assert archive_key("$HOME/venv/bin/python") != archive_key("/home/u/venv/bin/python")
    assert archive_key("x").startswith("env-") and len(archive_key("x")) == 16


# ------------------------------------------------------------------------------------------- input files


def test_data_files_are_copied_once_each() -> None:
    paths = {"data.train.image": "/lus/p/vol.h5", "data.train.labels": "/lus/p/vol.h5",
             "data.coordinates": "/lus/p/coords.npz"}
    assert data_files(paths, True) == {"/lus/p/vol.h5": "data/0-vol.h5", "/lus/p/coords.npz": "data/1-coords.npz"}
    assert data_files(paths, ["data.coordinates"]) == {"/lus/p/coords.npz": "data/0-coords.npz"}
    assert data_files(paths, False) == {}
    with pytest.raises(ConfigError, match="'data.eval.image', which the model does not read"):
        data_files(paths, ["data.eval.image"])


def test_the_ranks_data_points_at_the_node_local_copies() -> None:
    files = {"/lus/p/vol.h5": "data/0-vol.h5", "/lus/p/coords.npz": "data/1-coords.npz"}
    data = {"train": {"image": "/lus/p/vol.h5:image", "labels": {"path": "/lus/p/vol.h5", "dataset": "labels"}},
            "coordinates": "/lus/p/coords.npz", "eval": {"image": "/lus/p/vol.h5x:image"}, "n": 3,
            "list": ["/lus/p/coords.npz"]}
    assert rewrite_data(data, files, "/nvme/j7/") == {
        "train": {"image": "/nvme/j7/data/0-vol.h5:image", "labels": {"path": "/nvme/j7/data/0-vol.h5",
                                                                       "dataset": "labels"}},
        "coordinates": "/nvme/j7/data/1-coords.npz", "eval": {"image": "/lus/p/vol.h5x:image"}, "n": 3,
        "list": ["/nvme/j7/data/1-coords.npz"]}
    env = {DATA_MAP_ENV: json.dumps(files), NODE_LOCAL_ENV: "/nvme/j7"}
    assert staged_data_from_env(env) == (files, "/nvme/j7")
    assert staged_data_from_env({DATA_MAP_ENV: json.dumps(files)}) is None
    with pytest.raises(ConfigError, match="not the JSON"):
        staged_data_from_env({**env, DATA_MAP_ENV: "{"})


# ---------------------------------------------------------------------------------------------- rendering


def test_render_refuses_what_cannot_be_staged(tmp_path: Path) -> None:
    cases = [
        (site_doc(), ffn_job(staging={"data": True}), "names no node-local directory"),
        (site_doc(node_local_dir="/tmp"), ffn_job(staging={"data": ["data.eval.image"]}), "does not read"),
        (site_doc(node_local_dir="/tmp"), {**ffn_job(staging={"data": True}), "model": "mypkg.models:build"},
         "declares no schema"),
    ]
    for site, job, message in cases:
        with pytest.raises(ConfigError) as caught:
            render(tmp_path, site, job)
        text = str(caught.value)
        assert "\n" not in text and message in text and text.startswith(f"{tmp_path / 'job.yaml'}"), text
        assert "staging." in text


def test_unstaged_jobs_render_as_before_and_staged_ones_ask_for_local_storage(tmp_path: Path) -> None:
    site = site_doc(node_local_dir="/mnt/bb/$USER", directives={"C": "nvme"})
    plain = render(tmp_path, site, ffn_job()).text
    assert "HPCTRAIN_NODE_LOCAL" not in plain and "#SBATCH -C nvme" not in plain
    staged = render(tmp_path, site, ffn_job(staging={"environment": "archive"}))
    assert "#SBATCH -C nvme" in staged.text
    assert 'export HPCTRAIN_NODE_LOCAL=/mnt/bb/"${USER}"/hpctrain-"${SLURM_JOB_ID:-none}"' in staged.text
    python = staged.launch_argv[staged.launch_argv.index("-m") - 1]
    assert isinstance(python, ShellWord) and python == "${HPCTRAIN_NODE_LOCAL}/env/venv/bin/python"
    assert f"/{archive_key('/sw/venv/bin/python')}.tar" in staged.text


# ------------------------------------------------------------------------------------ hostile text, staged

STANDINS = ("srun", "sbcast", "mpiexec", "aprun", "module", "python3", "qsub", "scontrol")
STANDIN = "#!/bin/bash\nprintf '%s\\0' \"$@\" >> \"$RECORD_DIR/NAME.argv\"\nexit 0\n"
PAYLOADS = ['/x/$(touch CANARY)', '/x/`touch CANARY`', "/x'; touch CANARY; '", '/x"; touch CANARY; echo "',
            "/x/${IFS}$(touch${IFS}CANARY)", "/x/$USER'; touch CANARY; '", "/x/$TMPDIR\"$(touch CANARY)\"",
            "/x\ntouch CANARY", "/x/\\'; touch CANARY; \\'"]
FIELDS = [("site", ("staging", "node_local_dir")), ("site", ("staging", "archive_cache")),
          ("site", ("staging", "container", "image")), ("site", ("staging", "container", "options", 0)),
          ("site", ("staging", "container", "python")), ("job", ("data", "train", "image")),
          ("job", ("data", "coordinates"))]


def _standins(root: Path, archive: Path) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in STANDINS:
        (bin_dir / name).write_text(STANDIN.replace("NAME", name))
    # The archive is found (its link resolves to a real file) and every size is read, so the script runs on to
    # its launch line whatever the paths hold.
    (bin_dir / "readlink").write_text(f"#!/bin/bash\necho {archive}\n")
    (bin_dir / "du").write_text("#!/bin/bash\nfor a; do case $a in -*) ;; *) printf '1\\t%s\\n' \"$a\";; esac; done\n")
    for exe in bin_dir.iterdir():
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
@pytest.mark.parametrize("field", FIELDS, ids=lambda f: ".".join(map(str, f[1])))
def test_hostile_text_in_staging_fields_is_refused_or_inert(tmp_path: Path, scheduler: str,
                                                            field: tuple[str, tuple[str | int, ...]]) -> None:
    side, key = field
    container = key[:2] == ("staging", "container")
    for i, template in enumerate(PAYLOADS):
        root = tmp_path / str(i)
        root.mkdir()
        canary = root / "pwned"
        payload = template.replace("CANARY", str(canary))
        site = site_doc(scheduler, node_local_dir="/tmp/nl", data=True,
                        environment="container" if container else "archive",
                        **({"container": {"image": "/img/ffn.sif", "options": ["--cleanenv"]}} if container else {}))
        if scheduler != "slurm":
            site["filesystems"] = ["home"]
        job = ffn_job()
        job["resources"]["node_check"] = False  # the stand-in launchers run no node check step (test_node_check.py)
        node: Any = site if side == "site" else job
        for part in key[:-1]:
            node = node[part]
        node[key[-1]] = payload if not isinstance(key[-1], int) else payload
        try:
            rendered = render(root, site, job)
        except HpctrainError as exc:
            assert isinstance(exc, ConfigError), exc
            text = str(exc)
            assert "\n" not in text and text.startswith((str(root / "job.yaml"), str(root / "site.yaml"))), text
            continue
        syntax = subprocess.run(["bash", "-n"], input=rendered.text, capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, syntax.stderr
        archive = root / "env.tar"
        archive.write_bytes(b"")
        records = root / "records"
        records.mkdir()
        bin_dir = _standins(root, archive)
        script = root / "job.sh"
        script.write_text(rendered.text.replace("cd /runs/r1", f"cd {root}"), encoding="utf-8")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root), "RECORD_DIR": str(records), "USER": "u",
               "LANG": "C.UTF-8"}
        subprocess.run(["bash", str(script)], capture_output=True, timeout=60, env=env, cwd=root)
        assert not canary.exists(), f"the payload ran: {payload!r} in {key}"
        launched = (records / f"{rendered.launch_argv[0]}.argv").read_bytes().decode().split("\0")[:-1]
        assert payload in launched or payload in rendered.text or side == "site", launched


# ------------------------------------------------------------------------- PBS Pro and Cobalt, run for real

# The staging steps run once per stand-in node (-n), one after the other: the stage_node.tmpl steps under bash, the
# broadcast (PYTHON -c TEXT) under the real MPICH mpiexec when TREE_MPIEXEC is set, else as processes that know no
# MPI launcher. The rank launch writes what its interpreter sees.
LAUNCHER_STANDIN = r"""#!/bin/bash
# Launcher options with a value (PALS mpiexec, ALPS aprun) are skipped; then the command follows.
nodes=1
while [ "$#" -gt 0 ]; do
    case "$1" in
    -n) nodes=$2; shift 2 ;;
    -N|-d|-j|-cc|-e|--ppn|--depth|--cpu-bind|--env) shift 2 ;;
    *) break ;;
    esac
done
if [ "$1" = bash ] || [ "$2" = -c ]; then
    [ "$1" = bash ] && echo "node script x ${nodes}: ${*:5}" >> "$RECORD_DIR/staging.log" \
        || echo "tree x ${nodes}: ${*:4}" >> "$RECORD_DIR/staging.log"
    if [ "$1" != bash ] && [ -n "${TREE_MPIEXEC}" ]; then
        exec "${TREE_MPIEXEC}" -n "${nodes}" "$@"
    fi
    for ((i = 0; i < nodes; i++)); do "$@" || exit; done
    exit 0
fi
printf '%s\0' "$@" > "$RECORD_DIR/launch.argv"
env > "$RECORD_DIR/launch.env"
"$1" -c 'import json, sys, stagetoy; print(json.dumps({"prefix": sys.prefix, "toy": stagetoy.__file__}))' \
    > "$RECORD_DIR/launch.python"
"""


def mpi4py_on_path(tmp: Path) -> Path:
    """A directory holding only mpi4py, as a site's module puts it on PYTHONPATH."""
    import mpi4py

    shim = tmp / "site-mpi4py"
    shim.mkdir()
    (shim / "mpi4py").symlink_to(Path(mpi4py.__file__).parent)
    return shim


# How the job's Python meets MPI: mpi4py and its MPI library (the broadcast runs); no mpi4py; mpi4py whose MPI
# library is not there; mpi4py whose MPI is not the launcher's (each process alone in its world, 2 nodes).
MPI_CASES = ["tree", "no-mpi4py", "no-libmpi", "not-the-launchers"]


@pytest.mark.processes
@pytest.mark.parametrize("mpi", MPI_CASES)
@pytest.mark.parametrize(("scheduler", "launcher"), [("pbs", "mpiexec"), ("cobalt", "aprun")])
def test_staged_script_runs_on_pbs_and_cobalt_stand_ins(tmp_path: Path, scheduler: str, launcher: str,
                                                        mpi: str) -> None:
    venv, _ = make_venv(tmp_path)
    python = str(venv / "bin" / "python")
    cache = tmp_path / "cache"
    pack(venv, cache, archive_key(python))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "vol.h5").write_bytes(b"\x89HDF volume")
    (shared / "coords.npz").write_bytes(b"PK coords")
    job = ffn_job({"train": {"image": f"{shared}/vol.h5:image", "labels": f"{shared}/vol.h5:labels"},
                   "coordinates": f"{shared}/coords.npz"})
    nodes = 2 if mpi == "not-the-launchers" else 1
    job["resources"]["nodes"] = nodes
    job["resources"]["node_check"] = False  # the stand-in launchers run no node check step (test_node_check.py)
    site = {**site_doc(scheduler, node_local_dir=str(tmp_path / "local"), environment="archive", data=True,
                       archive_cache=str(cache)), "filesystems": ["home"]}
    rendered = render(tmp_path, site, job, python=python)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / launcher).write_text(LAUNCHER_STANDIN)
    (bin_dir / launcher).chmod(0o755)
    records = tmp_path / "records"
    records.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(rendered.text.replace("cd /runs/r1", f"cd {run_dir}"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORD_DIR": str(records), "LANG": "C.UTF-8"}
    mpi_lib = str(Path(sys.executable).parent.parent / "lib")
    if mpi != "no-mpi4py":
        env["PYTHONPATH"] = str(mpi4py_on_path(tmp_path))
    if mpi in ("tree", "not-the-launchers"):
        env.update(LD_LIBRARY_PATH=mpi_lib, MPICH_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE="lo")
    if mpi == "tree":
        env["TREE_MPIEXEC"] = str(Path(sys.executable).parent / "mpiexec")
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hpctrain: staged on every node in" in done.stdout
    local = tmp_path / "local" / "hpctrain-none"  # no job id outside a scheduler
    log = (records / "staging.log").read_text().splitlines()
    files = [f"-- copy {cache}/{os.readlink(cache / (archive_key(python) + '.tar'))} {local}/env.tar",
             f"-- copy {shared}/vol.h5 {local}/data/0-vol.h5", f"-- copy {shared}/coords.npz {local}/data/1-coords.npz"]
    unpack = f"-- unpack {local} {local}/env.tar"
    warnings = [ln for ln in done.stderr.splitlines() if "warning" in ln]
    if mpi == "tree":
        assert log[1:] == [f"tree x 1: 1 {run_dir} 64 {' '.join(files)}", f"node script x 1: {unpack}"], log
        assert warnings == []
    else:
        assert log[-1] == f"node script x {nodes}: {' '.join(files)} {unpack}", log
        why = {"no-mpi4py": f"the job's Python {python} has no mpi4py:",
               "no-libmpi": "no broadcast (mpi4py cannot start MPI here: cannot load MPI library):",
               "not-the-launchers": "no broadcast (MPI sees 1 processes where the launcher started one on each of 2 "
                                    "nodes (mpi4py's MPI is not the launcher's)):"}[mpi]
        assert warnings == [f"hpctrain: warning: {why} every node reads the shared copies itself"
                            + (" (no broadcast)" if mpi == "no-mpi4py" else "")], done.stderr[-3000:]
    assert log[0].startswith("node script x") and " check " in f" {log[0]}"
    seen = json.loads((records / "launch.python").read_text())
    assert seen["prefix"] == f"{local}/env/venv" and seen["toy"].startswith(f"{local}/env/venv/lib/")
    argv = (records / "launch.argv").read_bytes().decode().split("\0")[:-1]
    assert argv[:4] == [f"{local}/env/venv/bin/python", "-m", "hpctrain", "run"]
    launch_env = dict(line.split("=", 1) for line in (records / "launch.env").read_text().splitlines() if "=" in line)
    assert launch_env[NODE_LOCAL_ENV] == str(local)
    assert json.loads(launch_env[DATA_MAP_ENV]) == {f"{shared}/vol.h5": "data/0-vol.h5",
                                                    f"{shared}/coords.npz": "data/1-coords.npz"}
    assert (local / "data" / "0-vol.h5").read_bytes() == b"\x89HDF volume"
    assert (local / "data" / "1-coords.npz").read_bytes() == b"PK coords"
    assert sorted(p.name for p in local.iterdir()) == ["data", "env"]  # the sent archive removed once unpacked
    assert Path(os.readlink(cache / f"{archive_key(python)}.tar")).name.startswith(archive_key(python))
    assert (Path(cache) / f"{archive_key(python)}.tar").exists(), "the nodes read the shared archive in place"
    shutil.rmtree(local)


def test_the_ranks_read_the_node_local_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hpctrain run``'s first step: the job it trains reads the copies the script exported; job.yaml is untouched."""
    from hpctrain.commands.run import _with_staged_data

    job = JobSpec.model_validate(ffn_job())
    monkeypatch.setenv(NODE_LOCAL_ENV, "/nvme/j1")
    monkeypatch.setenv(DATA_MAP_ENV, json.dumps({"/lus/p/vol.h5": "data/0-vol.h5"}))
    staged = _with_staged_data(job)
    assert staged.data["train"] == {"image": "/nvme/j1/data/0-vol.h5:image", "labels": "/nvme/j1/data/0-vol.h5:labels"}
    assert staged.data["coordinates"] == "/lus/p/coords.npz" and job.data["train"]["image"] == "/lus/p/vol.h5:image"
    monkeypatch.delenv(DATA_MAP_ENV)
    assert _with_staged_data(job) is job


@pytest.mark.parametrize(("directory", "written"), [
    ("/mnt/bb/$USER", '/mnt/bb/"${USER}"/hpctrain-"${SLURM_JOB_ID:-none}"'),
    ("/x/${USER}}/y/", '/x/"${USER}"\'}/y\'/hpctrain-"${SLURM_JOB_ID:-none}"'),
    ("$TMPDIR", '"${TMPDIR}"/hpctrain-"${SLURM_JOB_ID:-none}"'),
    ("/l s/it's", "'/l s/it'\"'\"'s'/hpctrain-\"${SLURM_JOB_ID:-none}\""),
])
def test_the_node_local_directory_expands_only_user_and_tmpdir(directory: str, written: str) -> None:
    from hpctrain.config.site import SiteStaging
    from hpctrain.submission.shell import word
    from hpctrain.submission.staging import _node_local_root

    assert word(_node_local_root(SiteStaging(node_local_dir=directory), "SLURM_JOB_ID")) == written
    out = subprocess.run(["bash", "-c", f"USER=u TMPDIR=/t SLURM_JOB_ID=9; printf %s {written}"], capture_output=True,
                         text=True, check=True, timeout=10).stdout
    assert out == directory.rstrip("/").replace("${USER}", "u").replace("$USER", "u").replace("$TMPDIR", "/t") \
        + "/hpctrain-9"
