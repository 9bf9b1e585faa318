"""Per-job scheduler options (issue 14, item 3): exclusive nodes, a reservation, the job's own directives and the
ranks' working directory, rendered on Slurm, PBS Pro and Cobalt and refused where a scheduler has no such option.

Slurm is the real single-node one: the options are submitted and read back with ``scontrol``, and the ranks report
the directory they started in. No PBS Pro or Cobalt server exists: their scripts are checked line by line (and in
tests/test_render.py by the golden files and the strict PBS grammar) and run under a recording launcher stand-in.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile, load_site_file
from hpctrain.errors import FitError
from hpctrain.submission.render import render_script
from hpctrain.submission.schedulers.state import JobState

ROOT = Path(__file__).resolve().parents[1]


def site(name: str) -> SiteProfile:
    return load_site_file(ROOT / "site_configs" / f"{name}.yaml")


def job(**resources: object) -> JobSpec:
    base = {"nodes": 1, "ranks_per_node": 2, "threads_per_rank": 1, "walltime": "00:30:00"}
    return JobSpec.model_validate({"name": "options-test", "model": "resnet",
                                   "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1},
                                   "resources": {**base, **resources}, "checkpoint": {"signal_lead_s": 30}})


def render(spec: JobSpec, where: SiteProfile, run_dir: str = "/r", **kw: object) -> str:
    return render_script(spec, where, run_dir=run_dir, spec_path=f"{run_dir}/job.yaml", **kw).text  # type: ignore[arg-type]


def directive_lines(text: str, prefix: str) -> list[str]:
    return [line[len(prefix) + 1:] for line in text.splitlines() if line.startswith(prefix + " ")]


# --- what each scheduler writes -------------------------------------------------------------------------------


def test_slurm_options() -> None:
    text = render(job(exclusive=True, reservation="maint1", directives={"mail-type": "END", "comment": "x"},
                      workdir="/scratch/w"), site("ci-slurm"))
    lines = directive_lines(text, "#SBATCH")
    assert {"--exclusive", "--reservation=maint1", "--mail-type=END", "--comment=x"} <= set(lines)
    assert "( cd /scratch/w && exec srun " in text


def test_pbs_options_reservation_is_the_queue_and_exclusive_the_placement() -> None:
    spec = job(exclusive=True, reservation="R123456", directives={"r": "y", "m": "ae"}, workdir="~/w",
               gpus_per_rank=1, ranks_per_node=4, threads_per_rank=8, queue="debug", account="a")
    lines = directive_lines(render(spec, site("polaris")), "#PBS")
    assert "-l place=scatter:excl" in lines and "-q R123456" in lines and "-q debug" not in lines
    assert {"-r y", "-m ae"} <= set(lines)


def test_cobalt_options_reservation_is_the_queue_and_nodes_are_always_whole() -> None:
    spec = job(exclusive=True, reservation="ffn-res", directives={"M": "a@example.org"}, nodes=128,
               ranks_per_node=1, threads_per_rank=64, queue="default", account="a")
    lines = directive_lines(render(spec, site("theta")), "#COBALT")
    assert "-q ffn-res" in lines and "-M a@example.org" in lines
    assert not any("excl" in line for line in lines)  # Cobalt gives whole nodes: nothing to ask for


def test_a_queue_that_is_always_exclusive_and_an_exclusive_job_write_it_once(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nextends: {ROOT / 'site_configs' / 'ci-slurm.yaml'}\n"
                    "queues: {debug: {max_nodes: 1, max_walltime: '01:00:00', directives: {exclusive: true}}}\n")
    lines = directive_lines(render(job(exclusive=True), load_site_file(path)), "#SBATCH")
    assert lines.count("--exclusive") == 1


# --- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [{"exclusive": True}, {"reservation": "r1"}, {"directives": {"comment": "x"}}])
def test_the_local_scheduler_refuses_every_option_in_one_line(option: dict[str, object]) -> None:
    with pytest.raises(FitError) as info:
        render(job(**option), site("local"))
    (key,) = option
    assert info.value.key == f"resources.{key}" and "has no per-job" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("where", "directives", "key"), [
    ("ci-slurm", {"exclusive": True}, "exclusive"),
    ("ci-slurm", {"reservation": "r"}, "reservation"),
    ("ci-slurm", {"nodes": 4}, "nodes"),
    ("ci-slurm", {"chdir": "/tmp"}, "chdir"),
    ("polaris", {"place": "pack"}, "place"),
    ("polaris", {"l": "walltime=72:00:00"}, "l"),
    ("polaris", {"host": "a,walltime=72:00:00"}, "host"),
    ("theta", {"t": 9999}, "t"),
])
def test_job_directives_cannot_override_what_hpctrain_writes(where: str, directives: dict[str, object],
                                                             key: str) -> None:
    spec = job(directives=directives, **({"gpus_per_rank": 1, "queue": "debug", "account": "a"} if where == "polaris"
                                         else {"nodes": 128, "ranks_per_node": 1, "queue": "default",
                                               "account": "a"} if where == "theta" else {}))
    with pytest.raises(FitError) as info:
        render(spec, site(where))
    assert info.value.key == f"resources.directives.{key}", str(info.value)


@pytest.mark.parametrize("bad", [{"directives": {"a b": "x"}}, {"directives": {"k": "x y"}},
                                 {"reservation": "r:1"}, {"workdir": "relative/dir"}, {"workdir": "/a\nb"}])
def test_malformed_options_are_refused_when_the_spec_loads(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        job(**bad)


# --- the working directory, run ---------------------------------------------------------------------------------

RECORDER = """#!/bin/bash
pwd > "$RECORD_DIR/NAME.cwd"
exit 0
"""


@pytest.mark.parametrize(("where", "launcher", "extra"), [
    ("polaris", "mpiexec", {"gpus_per_rank": 1, "queue": "debug", "account": "a"}),
    # The stand-in aprun records and exits: no node check step would report (tests/test_node_check.py has those).
    ("theta", "aprun", {"nodes": 128, "ranks_per_node": 1, "queue": "default", "account": "a", "node_check": False}),
])
def test_ranks_start_in_the_working_directory_and_the_script_stays_in_the_run_directory(
        tmp_path: Path, where: str, launcher: str, extra: dict[str, object]) -> None:
    """PBS and Cobalt stand-in: the launcher records the directory it was started in."""
    workdir, run_dir, records, bin_dir = (tmp_path / n for n in ("work dir", "run", "records", "bin"))
    for d in (workdir, run_dir, records, bin_dir):
        d.mkdir()
    for name in (launcher, "module", "qsub"):
        exe = bin_dir / name
        exe.write_text(RECORDER.replace("NAME", name))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    here = site(where)
    here = here.model_copy(update={"environment": here.environment.model_copy(update={"venv": None, "setup": []}),
                                   "mpi": here.mpi.model_copy(update={"expected_library": None})})
    text = render(job(workdir=str(workdir), **extra), here, run_dir=str(run_dir), python=sys.executable)
    script = run_dir / "job.sh"
    script.write_text(text)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORD_DIR": str(records)}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (records / f"{launcher}.cwd").read_text().strip() == str(workdir)
    assert (run_dir / "job-exit.jsonl").is_file()  # the batch shell's own record stays in the run directory


# --- the real Slurm -------------------------------------------------------------------------------------------


@pytest.mark.slurm
def test_slurm_runs_the_options_for_real(slurm: object, tmp_path: Path) -> None:
    """Submitted to the real Slurm: scontrol shows the job exclusive with its directive, the ranks start in the
    working directory, the log lands in the run directory."""
    workdir, run_dir = tmp_path / "work", tmp_path / "run"
    workdir.mkdir()
    run_dir.mkdir()
    code = "import os; print('cwd', os.environ['SLURM_PROCID'], os.getcwd(), flush=True)"
    rendered = render_script(job(exclusive=True, directives={"comment": "hpctrain-options"}, workdir=str(workdir)),
                             site("ci-slurm"), run_dir=str(run_dir), spec_path=f"{run_dir}/job.yaml",
                             python=sys.executable, command=[sys.executable, "-c", code])
    script = run_dir / "job.sh"
    script.write_text(rendered.text)
    out = subprocess.run(rendered.scheduler.submit_argv(str(script), hold=True), capture_output=True, text=True,
                         timeout=60, cwd=run_dir)
    assert out.returncode == 0, out.stderr
    job_id = rendered.scheduler.parse_job_id(out.stdout)
    try:
        shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
        assert "OverSubscribe=NO" in shown and "Comment=hpctrain-options" in shown, shown
        subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True, timeout=30)
        log = run_dir / f"slurm-{job_id}.out"
        deadline = time.monotonic() + 120
        state = JobState.MISSING
        while time.monotonic() < deadline:
            state = _state(job_id)
            if state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT):
                break
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=20)
    text = log.read_text() if log.exists() else "(no output file)"
    assert state is JobState.COMPLETED, text
    assert sorted(line for line in text.splitlines() if line.startswith("cwd ")) == [
        f"cwd 0 {workdir}", f"cwd 1 {workdir}"], text


@pytest.mark.slurm
def test_slurm_hands_the_reservation_to_the_scheduler(slurm: object, tmp_path: Path) -> None:
    """sbatch --test-only reads the --reservation line: an unknown reservation is Slurm's refusal, not ours."""
    script = tmp_path / "job.sh"
    rendered = render_script(job(reservation="no-such-reservation"), site("ci-slurm"), run_dir=str(tmp_path),
                             spec_path=f"{tmp_path}/job.yaml", python=sys.executable)
    script.write_text(rendered.text)
    test_only = rendered.scheduler.test_only_argv(str(script))
    assert test_only is not None
    out = subprocess.run(test_only, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "reservation" in out.stderr.lower(), out.stderr


def _state(job_id: str) -> JobState:
    from hpctrain.submission.schedulers.base import get_scheduler

    probe = get_scheduler("slurm").status_probes({job_id: "/tmp"})[1][1]  # scontrol: works without accounting
    out = subprocess.run(probe.argv, capture_output=True, text=True, timeout=20)
    status = probe.parse(out.stdout).get(job_id)
    return status.state if status else JobState.MISSING

