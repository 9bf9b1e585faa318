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
    aurora = load_site("aurora")  # tiles are the devices, reduced over xccl; IPEX is not for its GPUs
    assert (aurora.node.gpus, aurora.node.gpu_kind, aurora.comm_backend, aurora.intel_extension) == (
        12, "intel", "xccl", False)
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
    ({"nodes": 9000}, "allows at most 4100"),
    ({"walltime": "30:00:00"}, "at most 03:00:00 from 1 to 255 nodes"),
    ({"threads_per_rank": 512}, "has 64 cores x 4 threads = 256"),
    ({"gpus_per_rank": 1}, "has no GPUs"),
])
def test_impossible_specs_are_refused_naming_the_limit(change: dict, limit: str) -> None:
    job = load_job(REPO / "jobs/ffn-theta.yaml")
    job = job.model_copy(update={"resources": job.resources.model_copy(update=change)})
    with pytest.raises(FitError, match=limit):
        check_fit(job, load_site("theta"))


@pytest.mark.parametrize("sets,key", [
    (["resources.ranks_per_node=64"], "resources.ranks_per_node"),
    (["resources.threads_per_rank=64", "resources.ranks_per_node=8"], None),
    (["resources.threads_per_rank=300"], "resources.threads_per_rank"),
])
def test_too_many_threads_per_node_names_the_key_the_user_set(sets: list[str], key: str | None) -> None:
    """A refusal names the key (and the flag) that made the node over-full, not always threads_per_rank."""
    job = load_job(REPO / "jobs/ffn-theta.yaml", sets=sets)
    with pytest.raises(FitError) as caught:
        check_fit(job, load_site("theta"))
    err = caught.value
    if key is None:  # both set by flags: ranks_per_node alone fits, so threads_per_rank is the one to lower
        key = "resources.threads_per_rank"
    assert err.key == key
    flag = next(s for s in sets if s.startswith(key + "="))
    assert err.path == f"--set {flag}", err


def test_a_fit_error_names_the_line_of_the_spec(tmp_path: Path) -> None:
    spec = (REPO / "jobs/ffn-theta.yaml").read_text().replace("nodes: 128", "nodes: 9000")
    path = write(tmp_path, "big.yaml", spec)
    with pytest.raises(FitError) as caught:
        check_fit(load_job(path), load_site("theta"))
    lines = path.read_text().splitlines()
    assert caught.value.path == str(path) and "nodes: 9000" in lines[caught.value.line - 1]


def test_local_site_refuses_many_nodes_and_unknown_queue() -> None:
    from hpctrain.submission.schedulers.base import place  # the one-machine limit is the local back-end's

    with pytest.raises(FitError, match="runs on at most 1"):
        place(load_job(REPO / "jobs/ffn-local.yaml", nodes=4), load_site("local"))
    with pytest.raises(FitError, match="did you mean 'gpu_debug'"):
        check_fit(load_job(REPO / "jobs/ffn-perlmutter.yaml", queue="gpu_debg"), load_site("perlmutter"))


@pytest.mark.processes
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
    assert result.returncode == 2 and "allows at most 4100" in result.stderr and "Traceback" not in result.stderr


def test_jobs_validate_without_site_checks_the_fit_on_the_default_local_site() -> None:
    """submit without --site runs on local: validate without --site refuses what that submit would refuse."""
    too_many = cli("jobs", "validate", "jobs/ffn-local.yaml", "--set", "resources.ranks_per_node=64")
    assert too_many.returncode == 2 and "Traceback" not in too_many.stderr
    assert "--set resources.ranks_per_node=64: resources.ranks_per_node:" in too_many.stderr
    assert "a node of site 'local'" in too_many.stderr
    fine = cli("jobs", "validate", "jobs/resnet-local.yaml")
    assert fine.returncode == 0 and "ok on local" in fine.stdout and "--site NAME" in fine.stdout


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


# ---------------------------------------------------------------------------------------------------------
# Issue 11: hostile or careless input gets one readable error (file, line, key), never a traceback or a hang

SITE_OK = """\
    name: box
    scheduler: slurm
    launcher: srun
    node: {cores: 4, memory_gb: 8}
    """
JOB_OK = """\
    name: j
    model: resnet
    train: {steps: 1, batch_per_rank: 1, lr: 0.1}
    resources: {walltime: "00:30:00"}
    """


def _one_error(exc: ConfigError) -> str:
    text = str(exc)
    assert "\n" not in text, f"more than one line: {text!r}"
    return text


def cli_limited(*args: str, env: dict | None = None, memory_gb: float = 1.5) -> subprocess.CompletedProcess:
    """The CLI under an address-space limit: a YAML bomb that is not refused dies with MemoryError here
    (a traceback, which the callers refuse) instead of swapping the test machine."""
    limit = int(memory_gb * 2**30)
    return subprocess.run(
        [sys.executable, "-c", f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
                               "from hpctrain.cli import main; sys.exit(main(sys.argv[1:]))", *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


@pytest.mark.parametrize("field,doc", [
    ("name", 'name: "evilsite\\n"\nscheduler: slurm\nlauncher: srun\nnode: {cores: 4, memory_gb: 8}\n'),
    ("environment.env", 'name: box\nscheduler: slurm\nlauncher: srun\nnode: {cores: 4, memory_gb: 8}\n'
                        'environment: {env: {"FOO\\n": x}}\n'),
    ("queues", 'name: box\nscheduler: slurm\nlauncher: srun\nnode: {cores: 4, memory_gb: 8}\n'
               'queues: {"q\\n": {max_nodes: 1, max_walltime: "1:00:00"}}\ndefault_queue: "q\\n"\n'),
    ("environment.modules.0", 'name: box\nscheduler: slurm\nlauncher: srun\nnode: {cores: 4, memory_gb: 8}\n'
                              'environment: {modules: ["gcc\\n"]}\n'),
    ("directives", 'name: box\nscheduler: slurm\nlauncher: srun\nnode: {cores: 4, memory_gb: 8}\n'
                   'directives: {"constraint\\n": gpu}\n'),
])
def test_a_trailing_newline_fails_the_name_checks(tmp_path: Path, field: str, doc: str) -> None:
    """re.match(r"...$") matches before a final newline; every pattern is checked with fullmatch."""
    path = tmp_path / "site.yaml"
    path.write_text(doc)
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    text = _one_error(info.value) if not hasattr(info.value, "errors") or len(info.value.errors) == 1 else \
        str(info.value).splitlines()[0]
    assert text.startswith(f"{path}:") and f" {field}" in text


def test_a_job_name_with_a_trailing_newline_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "j.yaml", JOB_OK.replace("name: j", 'name: "x\\n"'))
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert _one_error(info.value).startswith(f"{path}:1: name: names may hold only")


def test_a_filesystem_entry_cannot_add_resources(tmp_path: Path) -> None:
    """The polaris injection: an element of `filesystems` must be one plain name, not ',walltime=72:00:00'."""
    path = write(tmp_path, "evil.yaml", """\
        name: evil
        extends: polaris
        filesystems: ["home,walltime=72:00:00,select=496:ncpus=64"]
        """)
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    assert _one_error(info.value).startswith(f"{path}:3: filesystems.0: must be a plain name")
    for bad in ("home:grand", "eagle=1", "a b"):
        write(tmp_path, "evil.yaml", f"name: evil\nextends: polaris\nfilesystems: [home, '{bad}']\n")
        with pytest.raises(ConfigError, match="filesystems.1"):
            load_site_file(path)
    write(tmp_path, "fine.yaml", "name: fine\nextends: polaris\nfilesystems: [home, grand, eagle]\n")
    assert load_site_file(tmp_path / "fine.yaml").filesystems == ["home", "grand", "eagle"]


@pytest.mark.parametrize("attrs", ["mcdram=cache:numa=quad,walltime=100", "mcdram", "a=b::c=d", "x=y:",
                                   "filesystems=home:location=x y"])
def test_cobalt_attrs_follow_their_grammar(tmp_path: Path, attrs: str) -> None:
    good = "mcdram=cache:numa=quad"
    path = write(tmp_path, "t.yaml", f"name: t\nextends: theta\ndirectives: {{attrs: '{good}'}}\n")
    assert load_site_file(path).directives["attrs"] == good
    write(tmp_path, "t.yaml", f"name: t\nextends: theta\ndirectives: {{attrs: '{attrs}'}}\n")
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    assert "directives" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("site,directive", [
    ("polaris", "walltime: '72:00:00'"), ("polaris", "select: '496:ncpus=64'"), ("polaris", "l: 'walltime=72:00:00'"),
    ("perlmutter", "time: '99:00:00'"), ("perlmutter", "nodes: 4000"), ("theta", "t: 9999"),
    ("polaris", "place: 'scatter,walltime=72:00:00'"),
])
def test_site_directives_cannot_override_what_the_fit_check_passed(tmp_path: Path, site: str, directive: str) -> None:
    path = write(tmp_path, "s.yaml", f"name: s\nextends: {site}\ndirectives: {{{directive}}}\n")
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    key = directive.split(":")[0]
    assert _one_error(info.value).startswith(f"{path}:3: directives.{key}: ")


def test_a_pbs_resource_value_cannot_carry_a_second_resource(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", "name: s\nextends: polaris\ndirectives: {foo: 'bar,walltime=72:00:00'}\n")
    with pytest.raises(ConfigError, match=r"directives.foo: PBS resource 'foo': a ',' in the value"):
        load_site_file(path)


BILLION_LAUGHS = "".join(
    f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}'] * 9) if i else ', '.join(['lol'] * 9)}]\n"
    for i in range(10))


@pytest.mark.processes
def test_yaml_bombs_are_refused_quickly_and_cleanly(tmp_path: Path) -> None:
    """A 442-byte alias bomb, a 50 MB spec and 3000 nested lists: one error each, under a 1.5 GB memory cap."""
    assert len(BILLION_LAUGHS) < 600
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: j\nmodel: resnet\ndata: {blob: '" + "x" * (50 << 20) + "'}\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: j\nmodel_args: {a: " + "[" * 3000 + "]" * 3000 + "}\n")
    for path, words in ((bomb, "expands to more than"), (huge, "larger than"), (deep, "nest deeper than")):
        for args in (("jobs", "validate", str(path)), ("sites", "validate", str(path))):
            done = cli_limited(*args)
            assert done.returncode == 2, done.stderr[-2000:]
            assert "Traceback" not in done.stderr and words in done.stderr and str(path) in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
    set_bomb = cli_limited("render", str(write(tmp_path, "j.yaml", JOB_OK)), "--set",
                           "model_args=" + BILLION_LAUGHS.replace("\n", ", ").join("{}"))
    assert set_bomb.returncode == 2 and "Traceback" not in set_bomb.stderr
    assert "--set model_args=" in set_bomb.stderr


@pytest.mark.parametrize("raw,line", [(b"name: box\x01\n", 1), (b"name: box\nscheduler: \x0b\n", 2),
                                      (b"name: box\n\x1b[31m: x\n", 2), (b"name: box\ndescription: \xff\n", 2)])
def test_control_characters_and_bad_bytes_name_file_and_line(tmp_path: Path, raw: bytes, line: int) -> None:
    path = tmp_path / "ctl.yaml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    assert _one_error(info.value).startswith(f"{path}:{line}: ")


def test_one_broken_profile_never_breaks_sites_list(tmp_path: Path) -> None:
    sites_dir = tmp_path / "sites"
    sites_dir.mkdir()
    (sites_dir / "broken.yaml").write_bytes(b"name: broken\x01\n")
    (sites_dir / "bomb.yaml").write_text(BILLION_LAUGHS)
    write(sites_dir, "mine.yaml", "name: mine\nextends: polaris\n")
    env = {**__import__("os").environ, "HPCTRAIN_SITES": str(sites_dir)}
    listing = cli_limited("sites", "list", "--json", env=env)
    assert listing.returncode == 0, listing.stderr
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows["mine"]["valid"] and rows["theta"]["valid"]
    assert not rows["broken"]["valid"] and "character U+0001" in rows["broken"]["error"]
    assert not rows["bomb"]["valid"] and "expands to more than" in rows["bomb"]["error"]
    table = cli_limited("sites", "list", env=env)
    assert table.returncode == 0 and "Traceback" not in table.stderr
    broken_line = next(ln for ln in table.stdout.splitlines() if ln.startswith("broken "))
    assert "BROKEN: " in broken_line and str(sites_dir / "broken.yaml") in broken_line


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_memory_must_be_finite(tmp_path: Path, value: str) -> None:
    site = write(tmp_path, "s.yaml", SITE_OK.replace("memory_gb: 8", f"memory_gb: {value}"))
    with pytest.raises(ConfigError) as info:
        load_site_file(site)
    assert _one_error(info.value).startswith(f"{site}:4: node.memory_gb: ")
    job = write(tmp_path, "j.yaml", JOB_OK)
    with pytest.raises(ConfigError, match=r"^--set resources.memory_gb=\S+: resources.memory_gb: .*finite"):
        load_job(job, sets=[f"resources.memory_gb={value}"])


@pytest.mark.parametrize("bad", ["01:99:00", "00:00:60", "1-24:00:00", "1-00:60", "01:30:99", "99999999", "400-00"])
def test_walltime_fields_are_bounded(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_walltime(bad)


def test_values_that_used_to_be_silently_changed_are_refused(tmp_path: Path) -> None:
    job = write(tmp_path, "j.yaml", JOB_OK)
    cases = {
        "--walltime 01:99:00": dict(walltime="01:99:00"),
        "--set resources.memory_gb=0.0001": dict(sets=["resources.memory_gb=0.0001"]),
        "--set resources.nodes=true": dict(sets=["resources.nodes=true"]),
        "--set resources.nodes='4'": dict(sets=["resources.nodes='4'"]),
        f"--set checkpoint.max_requeues={10**20}": dict(sets=[f"checkpoint.max_requeues={10**20}"]),
        "--nodes 0": dict(nodes=0),
        "--set train.optimizer.nesterov=1": dict(sets=["train.optimizer.nesterov=1"]),
    }
    for flag, kwargs in cases.items():
        with pytest.raises(ConfigError) as info:
            load_job(job, **kwargs)
        text = _one_error(info.value)
        assert text.startswith(f"{flag}: "), text  # blamed on the flag, not on a line of j.yaml
        assert str(job) not in text
    assert load_job(job, sets=["resources.memory_gb=0.5"]).resources.memory_mb == 512
    assert load_job(job, sets=["resources.memory_gb=0.001"]).resources.memory_mb == 2  # rounded up, never 0


def test_signal_lead_must_be_below_the_walltime_naming_both(tmp_path: Path) -> None:
    job = write(tmp_path, "j.yaml", JOB_OK.rstrip(" ") + "    checkpoint: {signal_lead_s: 7200}\n")
    with pytest.raises(ConfigError) as info:
        load_job(job)
    text = _one_error(info.value)
    assert text.startswith(f"{job}:5: checkpoint.signal_lead_s: 7200 s is not below resources.walltime (00:30:00")
    assert load_job(job, walltime="03:00:00").checkpoint.signal_lead_s == 7200


def test_strict_types_in_the_file_name_line_and_key(tmp_path: Path) -> None:
    site = write(tmp_path, "s.yaml", SITE_OK.replace("cores: 4", "cores: true"))
    with pytest.raises(ConfigError) as info:
        load_site_file(site)
    # int | 'auto': the two members' complaints are merged into one line naming the key, not "cores.int".
    assert _one_error(info.value).startswith(f"{site}:4: node.cores: Input should be a valid integer, or ")
    job = write(tmp_path, "j.yaml", JOB_OK.replace("steps: 1", "steps: 1.5"))
    with pytest.raises(ConfigError, match=rf"^{job}:3: train.steps: "):
        load_job(job)
    betas = load_job(write(tmp_path, "a.yaml", JOB_OK), sets=["train.optimizer={name: adam, betas: [0.9, 0.99]}"])
    assert betas.train.optimizer.betas == (0.9, 0.99)


@pytest.mark.parametrize("text,words", [
    ("a: &x [1, *x]\n", "alias refers to the list or mapping that contains it"),
    ("? [a, b]\n: 1\n", "a key must be a plain word"),
    ('name: "a\\0b"\n', "NUL character"),
    ('name: "a\\ud800"\n', "unpaired surrogate"),
])
def test_yaml_shapes_that_cannot_be_configuration(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_site_file(path)
    assert words in _one_error(info.value) and str(path) in str(info.value)


def test_render_output_errors_are_clean_and_leave_no_temp_file(tmp_path: Path) -> None:
    job = str(write(tmp_path, "j.yaml", JOB_OK))
    missing = cli("render", job, "-o", str(tmp_path / "missing_dir" / "x.sh"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "missing_dir does not exist" in missing.stderr
    into_dir = cli("render", job, "-o", str(tmp_path))
    assert into_dir.returncode != 0 and "Traceback" not in into_dir.stderr and "is a directory" in into_dir.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.yaml"]
    ok = cli("render", job, "-o", str(tmp_path / "job.sh"))
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.yaml", "job.sh"]
    assert (tmp_path / "job.sh").stat().st_mode & 0o111


def test_extends_chains_and_unreadable_paths_are_config_errors(tmp_path: Path) -> None:
    for i in range(20):
        write(tmp_path, f"s{i}.yaml", f"name: s{i}\nextends: s{i + 1}.yaml\n")
    write(tmp_path, "s20.yaml", SITE_OK)
    with pytest.raises(ConfigError, match="more than 16 profiles extend each other"):
        load_site_file(tmp_path / "s0.yaml")
    long_name = write(tmp_path, "long.yaml", f"name: long\nextends: {'x' * 5000}.yaml\n")
    with pytest.raises(ConfigError, match="extends"):
        load_site_file(long_name)


@pytest.mark.parametrize("scheduler,launcher,valid", [
    ("pbs", "srun", "mpiexec, aprun or local"), ("cobalt", "srun", "aprun, mpiexec or local"),
    ("slurm", "aprun", "srun, mpiexec or local"),
])
def test_a_launcher_its_scheduler_cannot_start_is_refused(tmp_path: Path, scheduler: str, launcher: str,
                                                          valid: str) -> None:
    """srun needs Slurm's step daemons, aprun Cray's ALPS: a profile pairing them with another scheduler is refused
    by ``sites validate`` at the launcher's line, and by every check of a job against it (``place``)."""
    from hpctrain.submission.schedulers.base import place

    path = write(tmp_path, "s.yaml", f"""\
        name: odd
        scheduler: {scheduler}
        launcher: {launcher}
        node: {{cores: 4, memory_gb: 8}}
        """)
    message = f"launcher: site 'odd': scheduler {scheduler} starts ranks with {valid}, not '{launcher}'"
    done = cli("sites", "validate", str(path))
    assert done.returncode == 2 and done.stderr.startswith(f"hpctrain: error: {path}:3: {message}"), done.stderr
    with pytest.raises(ConfigError, match=message):
        place(load_job(REPO / "jobs/ffn-local.yaml"), load_site_file(path))
    done = cli("jobs", "validate", "jobs/ffn-local.yaml", "--site", str(path))
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_queue_option_is_the_schedulers_rule(tmp_path: Path) -> None:
    """queue_option takes the values the scheduler's back-end lists (Slurm: partition, its default, or qos); a
    scheduler without the choice refuses it, naming the key."""
    base = "node: {cores: 2, gpus: 0, memory_gb: 1}\nlauncher: mpiexec\n"
    cases = {"slurm-qos": ("slurm", "qos", None), "slurm-bad": ("slurm", "queue", "Slurm takes queue_option "
                                                                 "partition or qos, not 'queue'"),
             "pbs-qos": ("pbs", "qos", "PBS has no choice of queue option: remove queue_option")}
    for name, (scheduler, value, error) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nscheduler: {scheduler}\nqueue_option: {value}\n{base}")
        if error is None:
            assert load_site_file(path).queue_option == value
            continue
        with pytest.raises(ConfigError) as info:
            load_site_file(path)
        assert error in str(info.value) and "queue_option" in str(info.value)
    assert load_site("perlmutter").queue_option == "qos" and load_site("frontier").queue_option is None
