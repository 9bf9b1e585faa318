"""A scheduler back-end shipped outside hpctrain: a toy package, installed only as a ``.dist-info`` with an entry
point in the group ``hpctrain.schedulers`` on the PYTHONPATH of a real ``hpctrain`` process, renders its own
directives, submits to a stand-in ``toysub`` on PATH and is found by ``hpctrain sites discover`` through a
stand-in ``toyq``. No file under hpctrain/ is touched (checked by size and modification time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TinyJob, write_standin_site

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hpctrain"

TOY = '''"""A toy batch scheduler: toysub submits, toyq lists jobs and queues."""

from hpctrain.submission.schedulers.base import Scheduler, StatusProbe, check_directive_lines, check_request
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus


class Toy(Scheduler):
    name = "toy"
    title = "Toy"
    directive_prefix = "#TOY"
    job_id_variable = "TOY_JOB_ID"
    script_note = "# Toy sends SIG${signal} to this shell ${signal_lead_s} s before the walltime."
    detect_programs = ("toyq",)
    probe_programs = ("toysub",)
    detect_order = 5  # asked before the built-ins: this test machine also runs a real Slurm
    commands = ("toysub", "toyq")
    reserved_directives = frozenset({"nodes", "walltime"})
    allowed_directives = frozenset({"color"})

    def render_directives(self, job, site, placement, options):
        lines = [f"#TOY nodes={job.resources.nodes}", f"#TOY walltime={job.resources.walltime}",
                 f"#TOY log={options.log_path('toy.out')}"]
        return check_directive_lines(lines, self.directive_prefix)

    def submit_argv(self, script_path, *, dependency=None, array=None, array_dir=None, hold=False):
        check_request(self, dependency=dependency, array=array, hold=hold)
        return ["toysub", script_path]

    def parse_job_id(self, stdout):
        return stdout.split()[-1]

    def status_probes(self, jobs):
        return [[StatusProbe("toyq", "live", ["toyq", *jobs], self.parse)]]

    @staticmethod
    def parse(text):
        return {job: JobStatus(job, JobState.RUNNING) for job in text.split()}

    def cancel_argv(self, job_id, run_dir):
        return ["toyq", "--cancel", job_id]

    def log_names(self, job_id):
        return ["toy.out"]

    def probe_lines(self):
        return ["run toy_queues toyq --queues"]

    def read_discovery(self, probe):
        from hpctrain.submission.discovery.facts import SchedulerFacts

        queues = probe.answered("toy_queues")
        return SchedulerFacts(name=self.name, answered=queues is not None, notes=[f"toyq lists: {queues.strip()}"])


SCHEDULER = Toy()
'''


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _toy_site_packages(directory: Path) -> Path:
    """A directory holding the toy package and its distribution metadata, as pip would install them."""
    (directory / "toy_scheduler").mkdir(parents=True)
    (directory / "toy_scheduler" / "__init__.py").write_text(TOY)
    info = directory / "toy_scheduler-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-scheduler\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hpctrain.schedulers]\ntoy = toy_scheduler:SCHEDULER\n")
    return directory


def _stand_ins(bin_dir: Path, record: Path) -> Path:
    bin_dir.mkdir()
    (bin_dir / "toysub").write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> {record}\necho "queued as toy-42"\n')
    (bin_dir / "toyq").write_text('#!/bin/sh\nif [ "$1" = --queues ]; then echo "debug 4 nodes"; else echo "$@"; fi\n')
    for tool in ("toysub", "toyq"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, timeout=240,
                          cwd=env["HPCTRAIN_HOME"], env=env)


@pytest.mark.slow
def test_an_installed_backend_renders_submits_and_is_discovered(tmp_path: Path, tiny_job: TinyJob) -> None:
    before = _tree(PACKAGE)
    site_packages = _toy_site_packages(tmp_path / "site-packages")
    record = tmp_path / "submitted.txt"
    bin_dir = _stand_ins(tmp_path / "bin", record)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site_packages)]), "HPCTRAIN_HOME": str(home),
           "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]])}
    env.pop("HPCTRAIN_REGISTRY", None)
    tiny_job("tiny-toy", walltime="00:10:00", checkpoint="{signal_lead_s: 30}")
    site = write_standin_site(tmp_path, "toy-site", "toy")

    rendered = _cli(env, "render", str(tmp_path / "tiny.yaml"), "--site", str(site))
    assert rendered.returncode == 0, rendered.stderr
    lines = rendered.stdout.splitlines()
    assert lines[:3] == ["#!/bin/bash", "#TOY nodes=1", "#TOY walltime=00:10:00"]
    assert "# Toy sends SIGUSR2 to this shell 30 s before the walltime." in lines

    submitted = _cli(env, "submit", str(tmp_path / "tiny.yaml"), "--site", str(site))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "toy-42" in submitted.stdout + submitted.stderr
    (script,) = record.read_text().splitlines()
    assert Path(script).read_text().startswith("#!/bin/bash\n#TOY nodes=1\n")

    # A directive the toy back-end writes itself is refused, with the back-end's own rules.
    (tmp_path / "bad.yaml").write_text(site.read_text() + "directives: {walltime: '01:00:00'}\n")
    bad = _cli(env, "render", str(tmp_path / "tiny.yaml"), "--site", str(tmp_path / "bad.yaml"))
    assert bad.returncode != 0 and "toy option 'walltime' is written by hpctrain" in bad.stderr, bad.stderr

    discovered = _cli(env, "sites", "discover", "--name", "toybox", "-o", str(tmp_path / "toybox.yaml"))
    assert discovered.returncode == 0, discovered.stdout + discovered.stderr
    profile = (tmp_path / "toybox.yaml").read_text()
    assert "\nscheduler: toy" in profile and "Toy found on" in profile

    # Without the package, the name is unknown and the error lists what is.
    env["PYTHONPATH"] = str(REPO)
    unknown = _cli(env, "render", str(tmp_path / "tiny.yaml"), "--site", str(site))
    assert unknown.returncode != 0
    assert "scheduler 'toy' is not installed: pip install" in unknown.stderr, unknown.stderr
    assert "installed: cobalt, local, pbs, slurm" in unknown.stderr, unknown.stderr

    assert _tree(PACKAGE) == before
