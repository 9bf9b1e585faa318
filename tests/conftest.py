"""Session fixtures for the real components tests run against: the single-node Slurm and the loopback sshd
started by scripts/ci/*.sh, the repository root and the project venv.  When a daemon cannot be started the
fixture FAILS (never skips) and says to run `bash scripts/install.sh`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from tests.cluster_support import Cluster, start_cluster

REPO_ROOT = Path(__file__).resolve().parent.parent
SLURM_NODE = "head"
SSH_HOST = "hpctrain-test-login"
# Job states after which a job will not change any more (REQUEUED/PENDING can still move on).
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
     "PREEMPTED", "SPECIAL_EXIT"}
)
_UP_STATES = ("idle", "mix", "alloc", "comp")


def _run(
    argv: Sequence[str], timeout: float = 30, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


@dataclass(frozen=True)
class SlurmCluster:
    """The running single-node Slurm: where to submit and how to wait for a job."""

    partition: str
    cpus: int
    node: str
    partitions: tuple[str, ...]

    def state(self, job_id: int | str) -> str | None:
        """Current state of a job (first word, e.g. CANCELLED for 'CANCELLED by 0'), None if unknown."""
        out = _run(["scontrol", "show", "job", "-o", str(job_id)], timeout=15)
        if out.returncode == 0:
            for field in out.stdout.split():
                if field.startswith("JobState="):
                    return field.split("=", 1)[1]
        # Purged from slurmctld (MinJobAge passed): the jobcomp text file still knows finished jobs.
        acct = _run(["sacct", "-c", "-j", str(job_id), "-n", "-P", "-o", "State"], timeout=15)
        lines = [ln.split()[0] for ln in acct.stdout.splitlines() if ln.strip()]
        return lines[-1] if acct.returncode == 0 and lines else None

    def wait_for_state(self, job_id: int | str, states: Iterable[str], timeout: float = 60) -> str:
        """Poll until the job is in one of `states`; fail the test on timeout or another final state."""
        wanted = {s.upper() for s in states}
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            st = self.state(job_id)
            if st is not None and (not seen or seen[-1] != st):
                seen.append(st)
            if st in wanted:
                return st
            if st in TERMINAL_STATES or time.monotonic() > deadline:
                why = f"ended {st}" if st in TERMINAL_STATES else f"still {st} after {timeout:.0f} s"
                detail = _run(["scontrol", "show", "job", str(job_id)]).stdout
                pytest.fail(f"job {job_id} {why}, wanted {sorted(wanted)}; states seen: {seen}\n{detail}")
            time.sleep(0.5)

    def sbatch(self, *args: str, cwd: Path | None = None) -> int:
        """Submit with `sbatch --parsable ARGS` and return the job id (fails the test on error)."""
        out = _run(["sbatch", "--parsable", "-p", self.partition, *args], cwd=cwd)
        if out.returncode != 0:
            pytest.fail(f"sbatch {' '.join(args)} failed (exit {out.returncode}): {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])


@dataclass(frozen=True)
class SshLogin:
    """The loopback sshd: use as `ssh -F config host CMD`."""

    config: Path
    host: str
    key: Path
    known_hosts: Path
    port: int

    def argv(self, *command: str, options: Sequence[str] = ()) -> list[str]:
        return ["ssh", "-F", str(self.config), *options, self.host, *command]

    @property
    def log(self) -> Path:
        return self.config.parent / "sshd.log"

    def log_offset(self) -> int:
        """Where sshd's log ends now: count logins after it with ``logins``."""
        return self.log.stat().st_size if self.log.exists() else 0

    def logins(self, port: str, since: int, wait_s: float = 5.0) -> int:
        """Logins sshd accepted from loopback client ``port`` after log offset ``since``, waiting up to ``wait_s``
        for the first to be written. The log is shared by the whole suite and the kernel reuses a closed
        connection's ephemeral port, so a count over the whole log can include an earlier test's login (seen)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.log.open("rb") as f:
                f.seek(since)
                text = f.read().decode("utf-8", errors="replace")
            count = len(re.findall(rf"Accepted publickey for \S+ from 127\.0\.0\.1 port {port} ", text))
            if count or time.monotonic() > deadline:
                return count
            time.sleep(0.2)


def _start_failure(what: str, proc: subprocess.CompletedProcess[str] | None, err: str = "") -> None:
    detail = err or (proc.stdout + proc.stderr if proc is not None else "")
    pytest.fail(
        f"{what} could not be started. Run `bash scripts/install.sh` (as root) and then "
        f"`bash scripts/ci/{what.lower()}.sh start` to see the error.\n{detail.strip()[-3000:]}",
        pytrace=False,
    )


def _slurm_up() -> bool:
    """The node is up and slurmdbd answers (a Slurm started without accounting is restarted with it)."""
    try:
        out = _run(["sinfo", "-h", "-N", "-n", SLURM_NODE, "-o", "%t"], timeout=15)
        clusters = _run(["sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster"], timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return (out.returncode == 0 and out.stdout.strip().startswith(_UP_STATES) and clusters.returncode == 0
            and "hpctrain" in clusters.stdout.split())


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    """The bin/ directory of the project venv (the one running these tests when .venv is absent)."""
    bin_dir = REPO_ROOT / ".venv" / "bin"
    return bin_dir if (bin_dir / "python").exists() else Path(sys.executable).parent


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    if not _slurm_up():
        try:
            proc = _run(["bash", str(REPO_ROOT / "scripts/ci/slurm.sh"), "start"], timeout=150)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _start_failure("Slurm", None, repr(exc))
        if proc.returncode != 0 or not _slurm_up():
            _start_failure("Slurm", proc)
    parts = _run(["sinfo", "-h", "-o", "%P"]).stdout.split()
    default = next((p.rstrip("*") for p in parts if p.endswith("*")), parts[0] if parts else "debug")
    cpus = int(_run(["sinfo", "-h", "-N", "-n", SLURM_NODE, "-o", "%c"]).stdout.split()[0])
    return SlurmCluster(partition=default, cpus=cpus, node=SLURM_NODE,
                        partitions=tuple(p.rstrip("*") for p in parts))


@pytest.fixture(scope="session")
def sshd() -> SshLogin:
    try:
        proc = _run(["bash", str(REPO_ROOT / "scripts/ci/sshd.sh"), "start"], timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _start_failure("sshd", None, repr(exc))
    if proc.returncode != 0:
        _start_failure("sshd", proc)
    env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in _run(["bash", str(REPO_ROOT / "scripts/ci/sshd.sh"), "env"]).stdout.splitlines()
        if line.startswith("export ")
    )
    return SshLogin(config=Path(env["HPCTRAIN_SSH_CONFIG"]), host=env["HPCTRAIN_SSH_HOST"],
                    key=Path(env["HPCTRAIN_SSH_KEY"]), known_hosts=Path(env["HPCTRAIN_SSH_KNOWN_HOSTS"]),
                    port=int(env["HPCTRAIN_SSH_PORT"]))


@pytest.fixture(scope="session")
def cluster_session(slurm: SlurmCluster) -> Cluster:
    """The cluster of namespace nodes (scripts/ci/cluster.sh), served by the same slurmctld as ``slurm``."""
    return start_cluster()


@pytest.fixture
def cluster(cluster_session: Cluster) -> Iterator[Cluster]:
    """The cluster; links this test cut or slowed are restored and nodes it killed or drained are back after it."""
    yield cluster_session
    cluster_session.restore()


@pytest.fixture
def cluster_tmp(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory of this test on the cluster's shared file system (pytest's tmp_path is under /tmp, which each
    node has of its own); removed after the test."""
    base = cluster.shared / "tests"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=re.sub(r"\W+", "-", request.node.name)[:60] + "-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_standin_site(directory: Path, name: str, scheduler: str) -> Path:
    """A site profile ``DIRECTORY/NAME.yaml`` for a stand-in scheduler whose ranks start with hpctrain's local
    launcher from this venv (no PALS mpiexec or aprun here), runs under ``DIRECTORY/runs``."""
    path = directory / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nscheduler: {scheduler}\nlauncher: local\ncomm_backend: gloo\n"
        f"remote_root: {directory / 'runs'}\n"
        "node: {cores: 2, threads_per_core: 1, gpus: 0, memory_gb: 1}\n"
        f"environment: {{python: {sys.executable}}}\n")
    return path


# ------------------------------------------------------------------------------ shared set-ups
@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own hpctrain home: the registry and caches under ``TMP/home`` (HPCTRAIN_HOME), no
    HPCTRAIN_REGISTRY from outside, run directories under ``TMP/runs`` (HPCTRAIN_RUNS). Returns TMP (tmp_path);
    processes the test starts inherit the same."""
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    monkeypatch.setenv("HPCTRAIN_RUNS", str(tmp_path / "runs"))
    return tmp_path


TINY_JOB = """name: {name}
model: resnet
train: {{steps: {steps}, batch_per_rank: 2, lr: 0.01}}
resources: {{nodes: 1, ranks_per_node: {ranks_per_node}, walltime: "{walltime}"}}
"""


class TinyJob(Protocol):
    def __call__(self, name: str = "tiny", *, steps: int = 2, ranks_per_node: int = 1, walltime: str = "00:05:00",
                 checkpoint: str | None = "{signal_lead_s: 10}", path: Path | None = None) -> Path: ...


@pytest.fixture
def tiny_job(tmp_path: Path) -> TinyJob:
    """Writes the smallest job spec (resnet, one node of one rank, 2 steps) and returns its path, ``TMP/tiny.yaml``
    unless ``path`` is given; the arguments vary what a test's meaning depends on (``checkpoint=None``: no
    checkpoint section)."""

    def write(name: str = "tiny", *, steps: int = 2, ranks_per_node: int = 1, walltime: str = "00:05:00",
              checkpoint: str | None = "{signal_lead_s: 10}", path: Path | None = None) -> Path:
        path = path or tmp_path / "tiny.yaml"
        text = TINY_JOB.format(name=name, steps=steps, ranks_per_node=ranks_per_node, walltime=walltime)
        path.write_text(text if checkpoint is None else f"{text}checkpoint: {checkpoint}\n")
        return path

    return write


# ------------------------------------------------------------------------------ the fast lane (--fast)
# What the fast lane leaves out: tests marked for a real process (pyproject.toml's markers) and tests that ask,
# themselves or through another fixture, for a fixture that starts one (Slurm, sshd, the cluster of nodes).
REAL_PROCESS_MARKERS = ("slurm", "sshd", "mpi", "processes", "slow")
REAL_PROCESS_FIXTURES = ("slurm", "sshd", "cluster_session", "cluster", "cluster_tmp")


def real_process_need(item: pytest.Item) -> str | None:
    """Why ``item`` is left out of the fast lane (the marker or fixture that needs a real process), else None."""
    for marker in REAL_PROCESS_MARKERS:
        if item.get_closest_marker(marker) is not None:
            return f"marker {marker}"
    fixtures = set(getattr(item, "fixturenames", ()))
    return next((f"fixture {f}" for f in REAL_PROCESS_FIXTURES if f in fixtures), None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", default=False,
                     help="deselect the tests that need real Slurm, sshd, the cluster or mpiexec, and the slow ones "
                          f"(markers {', '.join(REAL_PROCESS_MARKERS)}; fixtures {', '.join(REAL_PROCESS_FIXTURES)})")


def deselect_real_process_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--fast``, takes out of ``items`` every test that needs a real process, reported as deselected."""
    if not config.getoption("fast", default=False):
        return
    left_out = [item for item in items if real_process_need(item) is not None]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if real_process_need(item) is None]


# ------------------------------------------------------------------------------ parallel runs (pytest-xdist)

def _uses_slurm(item: pytest.Item) -> bool:
    """The test asks for the ``slurm`` fixture (itself or through another fixture) or carries the ``slurm``
    marker: a module that only names sbatch or srun (a rendered script, a parser's input) does not count."""
    return "slurm" in getattr(item, "fixturenames", ()) or item.get_closest_marker("slurm") is not None


def group_modules(items: Iterable[pytest.Item]) -> dict[Path, str]:
    """Every test of a module runs on one worker (module-level caches and fixtures stay shared), and every module
    with a test that uses the one real Slurm runs on the same worker, one test at a time: their jobs would
    otherwise queue behind each other's on its few CPUs and miss the deadlines their walltime tests are built on."""
    groups: dict[Path, str] = {}
    for item in items:
        path = Path(str(item.fspath))
        if groups.get(path) != "slurm":
            groups[path] = "slurm" if _uses_slurm(item) else path.stem
    return groups


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test with its module's group. First of the hooks: xdist's worker reads the marks in its own
    ``pytest_collection_modifyitems`` (the group becomes the test id's ``@GROUP`` suffix, which ``--dist
    loadgroup`` schedules by), and a plugin registered after this conftest is otherwise called before it. Under
    ``--fast`` the tests that need a real process are deselected first."""
    deselect_real_process_tests(config, items)
    if not config.pluginmanager.hasplugin("xdist"):
        return
    groups = group_modules(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[Path(str(item.fspath))]))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory under /tmp, for ssh's ControlPath sockets (a unix socket path must fit in ~104 bytes,
    and pytest's tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="hts", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
