"""Site profiles and job specs: validation messages, extends, search path, overrides, fit checks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.config.fit import check_fit
from hpctrain.config.job import load_job
from hpctrain.config.site import available_sites, load_site, load_site_file
from hpctrain.config.walltime import parse_walltime
from hpctrain.errors import ConfigError, FitError

REPO = Path(__file__).resolve().parents[1]
SHIPPED_SITES = ["theta", "polaris", "perlmutter", "frontier", "aurora", "local", "ci-slurm"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=60)


@pytest.mark.parametrize("name", SHIPPED_SITES)
def test_every_shipped_site_validates(name: str) -> None:
    site = load_site(name)
    assert site.name == name
    node = site.node_for(site.default_queue)
    assert isinstance(node.cores, int) and node.cores >= 1


def test_shipped_site_facts() -> None:
    theta = load_site("theta")
    assert (theta.scheduler, theta.launcher, theta.comm_backend) == ("cobalt", "aprun", "mpi")
    assert (theta.node.cores, theta.node.threads_per_core, theta.node.memory_gb) == (64, 4, 192)
    polaris = load_site("polaris")
    assert (polaris.scheduler, polaris.node.gpus, polaris.comm_backend) == ("pbs", 4, "nccl")
    assert polaris.filesystems == ["home", "eagle"]
    perlmutter = load_site("perlmutter")
    assert perlmutter.node_for("cpu").gpus == 0 and perlmutter.node_for("gpu").gpus == 4
    assert load_site("frontier").node.gpus == 8 and load_site("frontier").node.gpu_kind == "amd"
    assert load_site("aurora").intel_extension and load_site("aurora").node.gpu_kind == "intel"
    assert load_site("local").scheduler == "local"


def test_misspelt_key_names_file_line_key_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "box.yaml", """\
        name: box
        scheduler: slurm
        launcher: srun
        node:
          cores: 8
          memory_gb: 16
          threads_per_cor: 2
        """)
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    text = str(info.value)
    assert f"{path}:7" in text
    assert "node.threads_per_cor" in text
    assert "did you mean 'threads_per_core'?" in text


def test_wrong_value_and_missing_key_reported_together(tmp_path: Path) -> None:
    path = write(tmp_path, "box.yaml", """\
        name: box
        scheduler: torque
        launcher: srun
        node: {cores: 8}
        """)
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    text = str(info.value)
    assert f"{path}:2: scheduler:" in text and "'torque'" in text
    assert "node.memory_gb: required key is missing" in text


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, "box.yaml", "name: box\nnode: {cores: 8\nscheduler: slurm\n")
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    assert str(path) in str(info.value) and "not valid YAML" in str(info.value)


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "box.yaml", "name: box\nname: other\n")
    with pytest.raises(ConfigError, match="appears twice"):
        load_site_file(path)


def test_extends_deep_merges_and_detects_cycles(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", """\
        name: base
        scheduler: slurm
        launcher: srun
        node: {cores: 32, memory_gb: 128}
        queues: {batch: {max_nodes: 100, max_walltime: "12:00:00"}}
        default_queue: batch
        environment: {modules: [gcc], env: {A: "1"}}
        """)
    child = write(tmp_path, "child.yaml", """\
        name: child
        extends: base.yaml
        node: {memory_gb: 256}
        environment: {env: {B: "2"}}
        """)
    site = load_site_file(child)
    assert site.name == "child" and site.node.cores == 32 and site.node.memory_gb == 256
    assert site.environment.env == {"A": "1", "B": "2"} and site.environment.modules == ["gcc"]
    loop_a = write(tmp_path, "a.yaml", "name: a\nextends: b.yaml\n")
    write(tmp_path, "b.yaml", "name: b\nextends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_site_file(loop_a)


def test_extends_a_shipped_site_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, "mytheta.yaml", "name: mytheta\nextends: theta\naccount: myproject\n")
    site = load_site_file(path)
    assert site.scheduler == "cobalt" and site.account == "myproject"


def test_search_path_env_and_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sites_dir = tmp_path / "sites"
    sites_dir.mkdir()
    write(sites_dir, "newmachine.yaml", """\
        name: newmachine
        scheduler: pbs
        launcher: mpiexec
        node: {cores: 48, memory_gb: 384}
        queues: {workq: {max_nodes: 64, max_walltime: "48:00:00"}}
        default_queue: workq
        """)
    monkeypatch.setenv("HPCTRAIN_SITES", str(sites_dir))
    assert "newmachine" in available_sites()
    assert load_site("newmachine").node.cores == 48
    monkeypatch.delenv("HPCTRAIN_SITES")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "cfg" / "hpctrain").mkdir(parents=True)
    (sites_dir).rename(tmp_path / "cfg" / "hpctrain" / "sites")
    assert load_site("newmachine").scheduler == "pbs"


def test_unknown_site_suggests(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="did you mean 'theta'"):
        load_site("thetaa")


@pytest.mark.parametrize("text,seconds", [("01:00:00", 3600), ("30", 1800), (45, 2700), ("1-02:00:00", 93600),
                                          ("10:30", 630), ("2-00", 172800), ("48:00:00", 172800)])
def test_walltime_forms(text: str | int, seconds: int) -> None:
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("bad", ["1h", "00:61", "-5", "0", "a:b:c"])
def test_bad_walltimes(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_walltime(bad)


def test_walltime_in_yaml_is_not_sexagesimal(tmp_path: Path) -> None:
    path = write(tmp_path, "j.yaml", """\
        name: j
        model: resnet
        train: {steps: 1, batch_per_rank: 1, lr: 0.1}
        resources: {walltime: 01:30:00}
        """)
    assert load_job(path).resources.walltime == "01:30:00"


@pytest.mark.parametrize("path", sorted(str(p) for p in (REPO / "jobs").glob("*.yaml")))
def test_shipped_jobs_validate(path: str) -> None:
    job = load_job(path)
    assert job.train.steps >= 1 and job.resources.ranks >= 1


def test_shipped_jobs_fit_their_site() -> None:
    for job_name, site_name in [("ffn-local", "local"), ("ffn-theta", "theta"), ("ffn-polaris", "polaris"),
                                ("ffn-perlmutter", "perlmutter"), ("ffn-local", "ci-slurm")]:
        placement = check_fit(load_job(REPO / "jobs" / f"{job_name}.yaml"), load_site(site_name))
        assert placement.backend in ("mpi", "gloo", "nccl")
    theta = check_fit(load_job(REPO / "jobs/ffn-theta.yaml"), load_site("theta"))
    assert theta.queue_name == "default" and theta.backend == "mpi"


def test_overrides_apply_and_validate() -> None:
    job = load_job(REPO / "jobs/ffn-local.yaml", sets=["train.lr=0.01", "train.combiner=adasum",
                                                      "model_args.depth=2"], walltime="00:10:00")
    assert job.train.lr == 0.01 and job.train.combiner.name == "adasum" and job.model_args["depth"] == 2
    assert job.resources.walltime == "00:10:00"
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        load_job(REPO / "jobs/ffn-local.yaml", sets=["train.lrr=0.01"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_job(REPO / "jobs/ffn-local.yaml", sets=["train.lr"])


def test_hostile_job_name_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "j.yaml", """\
        name: 'x"; rm -rf ~; echo "'
        model: ffn
        train: {steps: 1, batch_per_rank: 1, lr: 0.1}
        """)
    with pytest.raises(ConfigError, match="name"):
        load_job(path)


@pytest.mark.parametrize("change,limit", [
    ({"nodes": 9000}, "allows at most 4096"),
    ({"walltime": "30:00:00"}, "over the limit"),
    ({"threads_per_rank": 512}, "has 64 cores x 4 threads = 256"),
    ({"gpus_per_rank": 1}, "has no GPUs"),
])
def test_impossible_specs_are_refused_naming_the_limit(change: dict, limit: str) -> None:
    job = load_job(REPO / "jobs/ffn-theta.yaml")
    job = job.model_copy(update={"resources": job.resources.model_copy(update=change)})
    with pytest.raises(FitError, match=limit):
        check_fit(job, load_site("theta"))


def test_local_site_refuses_many_nodes_and_unknown_queue() -> None:
    with pytest.raises(FitError, match="no scheduler"):
        check_fit(load_job(REPO / "jobs/ffn-local.yaml", nodes=4), load_site("local"))
    with pytest.raises(FitError, match="did you mean 'gpu_debug'"):
        check_fit(load_job(REPO / "jobs/ffn-perlmutter.yaml", queue="gpu_debg"), load_site("perlmutter"))


def test_cli_sites_list_show_validate_json(tmp_path: Path) -> None:
    listing = json.loads(cli("sites", "list", "--json").stdout)
    assert {r["name"] for r in listing} >= set(SHIPPED_SITES)
    shown = json.loads(cli("sites", "show", "perlmutter", "--json").stdout)
    assert shown["queues"]["cpu"]["node"]["cores"] == 128
    bad = write(tmp_path, "bad.yaml", "name: bad\nscheduler: slurm\nlauncher: srun\nnode: {cores: 2, memry_gb: 1}\n")
    result = cli("sites", "validate", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:4: node.memry_gb: unknown key; did you mean 'memory_gb'?" in result.stderr
    as_json = json.loads(cli("sites", "validate", str(bad), "--json").stdout)
    assert as_json[0]["valid"] is False and as_json[0]["errors"][0]["line"] == 4
    ok = cli("sites", "validate", str(REPO / "site_configs/theta.yaml"))
    assert ok.returncode == 0 and "ok (theta)" in ok.stdout


def test_cli_jobs_validate_refuses_with_exit_2() -> None:
    result = cli("jobs", "validate", "jobs/ffn-theta.yaml", "--site", "theta", "--nodes", "5000")
    assert result.returncode == 2 and "allows at most 4096" in result.stderr and "Traceback" not in result.stderr


def test_schema_export_matches_docs(tmp_path: Path) -> None:
    """docs/ holds the schema generated from the models; a model change without re-export fails here."""
    from hpctrain.config.schema_export import export

    for path in export(tmp_path):
        committed = REPO / "docs" / path.name
        assert committed.read_text() == path.read_text(), f"run `hpctrain schema export docs` ({path.name})"
    schema = json.loads((tmp_path / "site-profile.schema.json").read_text())
    assert "memory_gb" in schema["$defs"]["NodeShape"]["properties"]


def test_submission_path_imports_no_heavy_modules() -> None:
    code = ("import sys, hpctrain.cli as c; c.build_parser();"
            "from hpctrain.config import site, job, fit;"
            "print(','.join(m for m in ('torch','numpy','mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
