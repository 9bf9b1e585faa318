"""Rendering: golden scripts for every shipped job x site, new sites without code, directive grammars.

No PBS Pro or Cobalt server exists here: PBS scripts are checked by a strict directive grammar of our own
plus ``sbatch --test-only`` (Slurm reads ``#PBS`` lines, but accepts unknown ones silently), Cobalt scripts
by golden files and a directive grammar.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.site import SiteProfile, load_site_file
from hpctrain.errors import ConfigError, FitError, SchedulerError
from hpctrain.submission.render import render_script
from hpctrain.submission.schedulers.base import get_scheduler
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.shell import quote, quote_path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("refresh_golden", ROOT / "scripts" / "refresh_golden.py")
assert _spec and _spec.loader
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
CASES = golden.cases()


@pytest.mark.parametrize(("job_name", "site_name", "path"), CASES, ids=[p.stem for _, _, p in CASES])
def test_golden(job_name: str, site_name: str, path: Path) -> None:
    got = golden.render_case(job_name, site_name)
    want = path.read_text(encoding="utf-8") if path.is_file() else ""
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"{path.name} (golden)", f"{path.name} (rendered now)"))
        pytest.fail(f"rendered script differs from {path.relative_to(ROOT)}:\n{diff}\n"
                    "if the change is intended, run `python scripts/refresh_golden.py` to accept it")


def test_no_stale_golden_files_and_every_site_renders_at_least_once() -> None:
    on_disk = set((ROOT / "tests" / "golden").glob("*.sh"))
    assert on_disk == {p for _, _, p in CASES}
    rendered_sites = {s for _, s, p in CASES if not p.read_text().startswith("REFUSED:")}
    assert rendered_sites == {p.stem for p in (ROOT / "site_configs").glob("*.yaml")}


def test_rendering_is_deterministic_and_refusals_name_the_limit() -> None:
    assert golden.render_case("ffn-theta", "theta") == golden.render_case("ffn-theta", "theta")
    refused = golden.render_case("ffn-polaris", "ci-slurm")
    assert refused.startswith("REFUSED: jobs/ffn-polaris.yaml:") and "at most 1" in refused
    assert ": resources.nodes: 2 nodes requested" in refused  # the line of the spec that asks for them


def test_golden_scripts_pass_bash_syntax_check() -> None:
    for _, _, path in CASES:
        text = path.read_text()
        if text.startswith("REFUSED:"):
            continue
        out = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, f"{path.name}: {out.stderr}"


# ---------------------------------------------------------------------------------------------------------
# A machine none of the shipped files describes: one YAML file, no code


def _job(**resources: object) -> JobSpec:
    base = {"nodes": 1, "ranks_per_node": 2, "threads_per_rank": 1, "walltime": "00:10:00"}
    return JobSpec.model_validate({"name": "tiny", "model": "resnet", "train": {"steps": 1, "batch_per_rank": 1,
                                   "lr": 0.1}, "resources": {**base, **resources}})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_new_slurm_site_extending_a_shipped_one_renders(tmp_path: Path) -> None:
    path = _write(tmp_path, "tinycluster", f"""\
        name: tinycluster
        extends: {ROOT / 'site_configs' / 'perlmutter.yaml'}
        login_host: login.tiny.example.org
        queue_option: partition
        queues:
          short: {{max_nodes: 2, max_walltime: "00:20:00", directives: {{constraint: cpu, exclusive: true}}}}
        default_queue: short
        account: proj1
        environment: {{modules: [gcc/12], venv: ~/envs/tiny}}
        """)
    site = load_site_file(path)
    text = render_script(_job(), site, run_dir="/scratch/run1", spec_path="/scratch/run1/job.yaml").text
    assert "#SBATCH --partition=short" in text
    assert "#SBATCH --account=proj1" in text
    assert "#SBATCH --constraint=cpu" in text and "#SBATCH --exclusive\n" in text
    assert "source \"$HOME\"/envs/tiny/bin/activate" in text
    assert "\"$HOME\"/envs/tiny/bin/python -m hpctrain run /scratch/run1/job.yaml" in text
    with pytest.raises(FitError, match="allows at most 2"):
        render_script(_job(nodes=3), site, run_dir="/r", spec_path="/r/j.yaml")


def test_new_standalone_pbs_site_renders_and_passes_the_strict_check(tmp_path: Path) -> None:
    path = _write(tmp_path, "pbslab", """\
        name: pbslab
        scheduler: pbs
        launcher: mpiexec
        node: {cores: 2, threads_per_core: 1, memory_gb: 2}
        queues:
          workq: {max_nodes: 1, max_walltime: "01:00:00"}
        default_queue: workq
        account: lab
        filesystems: [home, scratch]
        directives: {k: oe, r: "y", mem-hint: 1gb}
        """)
    site = load_site_file(path)
    text = render_script(_job(), site, run_dir="/tmp/pbslab-run", spec_path="/tmp/pbslab-run/job.yaml").text
    assert check_pbs_directives(text) >= 8
    assert "#PBS -l filesystems=home:scratch" in text and "#PBS -k oe" in text and "#PBS -l mem-hint=1gb" in text


def test_home_relative_run_dir_writes_bare_log_names_and_a_quoted_cd(tmp_path: Path) -> None:
    site = golden.golden_site("polaris")
    job = load_job(ROOT / "jobs" / "ffn-polaris.yaml")
    text = render_script(job, site, run_dir="$HOME/hpctrain-runs/x", spec_path="$HOME/hpctrain-runs/x/j.yaml").text
    assert "#PBS -o pbs.out" in text
    assert 'cd "$HOME"/hpctrain-runs/x\n' in text
    assert check_pbs_directives(text) > 0


def test_run_dir_that_cannot_be_a_directive_word_is_refused() -> None:
    site = golden.golden_site("ci-slurm")
    with pytest.raises(ConfigError, match="scheduler directive line"):
        render_script(_job(), site, run_dir="/tmp/a b", spec_path="/tmp/a b/j.yaml")


# ---------------------------------------------------------------------------------------------------------
# PBS Pro: strict directive grammar (no PBS server exists here)

_PBS_RESOURCE = r"(?:ncpus|ngpus|mpiprocs|ompthreads)=\d+|mem=\d+(?:b|kb|mb|gb|tb)|(?:system|host|vnode)=[\w.-]+"
_PBS_CHUNK = rf"\d+(?::(?:{_PBS_RESOURCE}))*"
_PBS_LINE = {
    "-N": re.compile(r"^[A-Za-z0-9][\w.-]{0,235}$"),
    "-q": re.compile(r"^[\w.-]+(?:@[\w.-]+)?$"),
    "-A": re.compile(r"^[\w.+:@=,-]+$"),
    "-o": re.compile(r"^[\w./%-]+$"),
    "-e": re.compile(r"^[\w./%-]+$"),
    "-j": re.compile(r"^(?:oe|eo|n)$"),
    "-k": re.compile(r"^(?:[oed]+|n)$"),
    "-r": re.compile(r"^[yn]$"),
}
_PBS_L = {
    "select": re.compile(rf"^{_PBS_CHUNK}(?:\+{_PBS_CHUNK})*$"),
    "walltime": re.compile(r"^\d{2,}:[0-5]\d:[0-5]\d$"),
    "place": re.compile(r"^(?:scatter|pack|free|vscatter)(?::(?:excl|shared|exclhost))?$"),
    "filesystems": re.compile(r"^[a-z0-9_-]+(?::[a-z0-9_-]+)*$"),
}
_PBS_GENERIC_L = re.compile(r"^[a-z][\w-]*=[\w./+:@,%*-]+$")


def check_pbs_directives(text: str) -> int:
    """Every ``#PBS`` line is a known option with a well-formed value; returns how many were checked."""
    count = 0
    seen_l: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("#PBS"):
            continue
        parts = line.split(" ")
        assert len(parts) == 3 and parts[0] == "#PBS", f"not '#PBS -x value': {line!r}"
        option, value = parts[1], parts[2]
        if option == "-l":
            key, _, val = value.partition("=")
            assert key not in seen_l, f"-l {key} given twice"
            seen_l.add(key)
            pattern = _PBS_L.get(key)
            assert (pattern.match(val) if pattern else _PBS_GENERIC_L.match(value)), f"bad -l value: {line!r}"
        else:
            assert option in _PBS_LINE, f"unknown #PBS option: {line!r}"
            assert _PBS_LINE[option].match(value), f"bad value for {option}: {line!r}"
        count += 1
    assert {"select", "walltime"} <= seen_l, "a PBS script needs -l select= and -l walltime="
    return count


def test_strict_pbs_check_accepts_shipped_scripts_and_rejects_bad_lines() -> None:
    pbs_goldens = [p for _, s, p in CASES if s in ("polaris", "aurora") and not p.read_text().startswith("REF")]
    assert pbs_goldens
    for path in pbs_goldens:
        assert check_pbs_directives(path.read_text()) >= 9, path.name
    good = "#PBS -l select=1:ncpus=2\n#PBS -l walltime=00:10:00\n"
    for bad in ("#PBS -l select=1:ncpus=two", "#PBS -l walltime=1:00", "#PBS -N has space",
                "#PBS -Z x", "#PBS -l select=1:ncpus=2"):
        with pytest.raises(AssertionError):
            check_pbs_directives(good + bad + "\n")


@pytest.mark.slurm
def test_pbs_script_is_accepted_by_sbatch_test_only_as_a_stand_in(tmp_path: Path, slurm: object) -> None:
    """Stand-in only: Slurm's sbatch reads #PBS lines (select, walltime, -N, -o) but ignores unknown ones."""
    path = _write(tmp_path, "pbsci", """\
        name: pbsci
        scheduler: pbs
        launcher: mpiexec
        node: {cores: 2, threads_per_core: 1, memory_gb: 1}
        queues: {debug: {max_nodes: 1, max_walltime: "01:00:00"}}
        default_queue: debug
        filesystems: [home]
        """)
    rendered = render_script(_job(), load_site_file(path), run_dir=str(tmp_path), spec_path=f"{tmp_path}/j.yaml")
    script = tmp_path / "job.pbs"
    script.write_text(rendered.text)
    out = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "to start at" in out.stderr


# ---------------------------------------------------------------------------------------------------------
# Cobalt: directive grammar (Theta is retired; no Cobalt exists anywhere)

_COBALT_LINE = {
    "-n": re.compile(r"^[1-9]\d*$"),
    "-t": re.compile(r"^[1-9]\d*$"),
    "-q": re.compile(r"^[\w.-]+$"),
    "-A": re.compile(r"^[\w.+:@=,-]+$"),
    "-O": re.compile(r"^[\w./-]+$"),
    "--jobname": re.compile(r"^[\w.-]+$"),
    "--attrs": re.compile(r"^[\w-]+=[\w,.-]+(?::[\w-]+=[\w,.-]+)*$"),
}


def test_cobalt_directives_follow_the_grammar() -> None:
    text = (ROOT / "tests" / "golden" / "ffn-theta__theta.sh").read_text()
    lines = [line for line in text.splitlines() if line.startswith("#COBALT")]
    options = []
    for line in lines:
        _, option, value = line.split(" ")
        assert option in _COBALT_LINE and _COBALT_LINE[option].match(value), line
        options.append(option)
    assert options[:2] == ["-n", "-t"] and "--attrs" in options
    assert "#COBALT -t 180" in text  # 03:00:00 in minutes: Theta's limit below 256 nodes
    assert "#COBALT --attrs mcdram=cache:numa=quad:filesystems=home,theta-fs0" in text
    assert "aprun -n 128 -N 1 -d 128 -j 2 -cc depth" in text


# ---------------------------------------------------------------------------------------------------------
# Quoting helpers and the scheduler contract


@pytest.mark.parametrize("value", ["plain", "a b", "it's", 'x"; rm -rf ~; echo "', "$(touch /x)", "`id`",
                                   "line1\nline2", "tab\there", "\u2028sep", "ünïcödé ✓", "back\\slash\\"])
def test_quote_round_trips_through_bash(value: str) -> None:
    out = subprocess.run(["bash", "-c", f"printf %s {quote(value)}"], capture_output=True, text=True, timeout=10)
    assert out.stdout == value
    assert "\n" not in quote(value)


def test_quote_path_expands_only_the_home_prefix() -> None:
    home = "/home/tester"
    cases = {"$HOME/a b": f"{home}/a b", "~/x": f"{home}/x", "${HOME}": home, "$SCRATCH/x": "$SCRATCH/x",
             "~other/x": "~other/x", "/abs/$(id)": "/abs/$(id)"}
    for path, want in cases.items():
        out = subprocess.run(["bash", "-c", f"printf %s {quote_path(path)}"], capture_output=True, text=True,
                             timeout=10, env={"HOME": home, "PATH": "/usr/bin:/bin"})
        assert out.stdout == want, path
    with pytest.raises(ConfigError, match="NUL"):
        quote("a\x00b")


def test_slurm_contract_argv_and_job_id() -> None:
    slurm = get_scheduler("slurm")
    assert slurm.submit_argv("/r/job.sh", dependency=("afterok", "12"), array="0-3%2", hold=True) == [
        "sbatch", "--parsable", "--dependency=afterok:12", "--array=0-3%2", "--hold", "/r/job.sh"]
    assert slurm.parse_job_id("4242;cluster\n") == "4242"
    assert slurm.parse_job_id("Submitted batch job 77\n") == "77"
    with pytest.raises(SchedulerError):
        slurm.parse_job_id("sbatch: error: Batch job submission failed")
    chains = slurm.status_probes({"1": "/r/1", "2": "/r/2"})
    assert [[(p.name, p.role) for p in chain] for chain in chains] == [
        [("sacct", "accounting"), ("sacct -c", "accounting")], [("squeue", "live"), ("scontrol", "live")]]
    assert chains[0][1].argv[:2] == ["sacct", "-c"] and chains[0][1].ended_runs and not chains[0][0].ended_runs
    assert slurm.test_only_argv("s.sh") == ["sbatch", "--test-only", "s.sh"]
    assert slurm.log_names("7_2") == ["slurm-7_2.out"] and slurm.array_task_id("7", 2) == "7_2"
    with pytest.raises(SchedulerError):
        slurm.cancel_argv("1; rm -rf ~", "/r/1")
    with pytest.raises(SchedulerError):
        slurm.submit_argv("s.sh", dependency=("whenever", "1"))


def test_slurm_parse_status_uses_the_shared_parsers() -> None:
    slurm = get_scheduler("slurm")
    probe = slurm.status_probes({"17": "/r", "18": "/r"})[1][0]
    squeue = probe.parse("17|RUNNING|None|0:05|localhost|job\n18|TIMEOUT|TimeLimit|1:00|localhost|x\n")
    assert squeue["17"].state is JobState.RUNNING and squeue["18"].state is JobState.TIMEOUT


def test_pbs_and_cobalt_contract() -> None:
    pbs, cobalt = get_scheduler("pbs"), get_scheduler("cobalt")
    assert pbs.submit_argv("j.sh", dependency=("afterany", "12.server"), array="0-3", hold=True) == [
        "qsub", "-W", "depend=afterany:12.server", "-J", "0-3", "-h", "j.sh"]
    assert pbs.parse_job_id("1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov\n") == \
        "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
    ((probe,),) = pbs.status_probes({"1.s": "/r"})
    assert probe.argv == ["qstat", "-x", "-f", "-F", "json", "1.s"] and probe.role == "live"
    assert pbs.cancel_argv("1.s", "/r") == ["qdel", "1.s"]
    assert pbs.array_task_id("12[].s", 3) == "12[3].s" and pbs.log_names("12.s") == ["pbs.out", "job.sh.o12"]
    parsed = probe.parse('{"Jobs": {"1.s": {"job_state": "R"}}}')
    assert parsed["1.s"].state is JobState.RUNNING
    assert cobalt.submit_argv("j.sh", dependency=("afterok", "99")) == ["qsub", "--dependencies", "99", "j.sh"]
    assert cobalt.parse_job_id("WARNING: something\n123456\n") == "123456"
    with pytest.raises(SchedulerError, match="arrays"):
        cobalt.submit_argv("j.sh", array="0-3")
    with pytest.raises(ConfigError, match="no scheduler back-end"):
        get_scheduler("lsf")


def test_render_path_imports_no_heavy_modules() -> None:
    code = ("import sys, hpctrain.submission.render, hpctrain.submission.schedulers.slurm, "
            "hpctrain.submission.schedulers.pbs, "
            "hpctrain.submission.schedulers.cobalt, hpctrain.submission.launchers.gpu_affinity; "
            "print(sorted(m for m in ('torch', 'numpy', 'mpi4py', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stderr


def test_unknown_queue_is_refused_before_rendering() -> None:
    site: SiteProfile = golden.golden_site("perlmutter")
    with pytest.raises(FitError, match="did you mean 'gpu_debug'"):
        render_script(_job(queue="debug", account="m1"), site, run_dir="/r", spec_path="/r/j.yaml")


@pytest.mark.parametrize("memory_gb,mib", [(0.5, 512), (0.001, 2), (16, 16384), (1.0001, 1025)])
def test_memory_is_rendered_in_whole_mib_rounded_up(memory_gb: float, mib: int) -> None:
    """Issue 11: 0.0001 GB rendered --mem=0M (all of the node to Slurm) and 0.5 GB mem=0gb on PBS."""
    job = load_job(ROOT / "jobs/ffn-polaris.yaml", sets=[f"resources.memory_gb={memory_gb}", "resources.account=p"])
    pbs = render_script(job, load_site_file(ROOT / "site_configs/polaris.yaml"), run_dir="/r", spec_path="/r/j")
    assert f":mem={mib}mb:" in pbs.text
    check_pbs_directives(pbs.text)
    slurm_job = load_job(ROOT / "jobs/ffn-perlmutter.yaml",
                         sets=[f"resources.memory_gb={memory_gb}", "resources.account=p"])
    slurm = render_script(slurm_job, load_site_file(ROOT / "site_configs/perlmutter.yaml"), run_dir="/r",
                          spec_path="/r/j")
    assert f"#SBATCH --mem={mib}M\n" in slurm.text



def test_a_job_id_ending_in_a_newline_is_refused() -> None:
    """fullmatch, not match: ``re.match(r"^...$")`` accepts a value that ends in a newline (issue 11, item 2)."""
    from hpctrain.submission.schedulers.base import check_job_id

    assert check_job_id("123[4].polaris-pbs-01") == "123[4].polaris-pbs-01"
    for bad in ("123\n", "123\n; rm -rf ~", "12 3", ""):
        with pytest.raises(SchedulerError, match="does not look like a job id"):
            check_job_id(bad)
