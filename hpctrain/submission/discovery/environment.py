"""The login node's software around the scheduler: which launcher and MPI a job would use, the module system
and loaded modules, a node-local scratch path, and the login node's own shape (the fallback when the
scheduler says nothing about compute nodes).
"""

from __future__ import annotations

import re

from hpctrain.config.numbers import plain_count
from hpctrain.submission.discovery.facts import Fact, NodeFacts, SchedulerFacts, guess, learned
from hpctrain.submission.discovery.probe import SCRATCH_DIRS, Probe

# MPI families by what `mpiexec --version` prints, and the substring of MPI.Get_library_version() that
# proves mpi4py runs on that family (what site.mpi.expected_library holds).
_MPI_VERSION_PATTERNS = (
    (re.compile(r"Intel\(R\) MPI", re.I), "Intel(R) MPI"),
    (re.compile(r"Open ?MPI|OpenRTE", re.I), "Open MPI"),
    (re.compile(r"MVAPICH", re.I), "MVAPICH"),
    (re.compile(r"HYDRA|MPICH", re.I), "MPICH"),
)
# MPI modules by name (a loaded `cray-mpich/8.1.28` says more than mpiexec, which is PALS's on Cray EX).
_MPI_MODULES = (
    (re.compile(r"^cray-mpich(/|$)"), "CRAY MPICH"),
    (re.compile(r"^(openmpi|ompi)(/|$)", re.I), "Open MPI"),
    (re.compile(r"^(intel-mpi|impi|intel-oneapi-mpi)(/|$)", re.I), "Intel(R) MPI"),
    (re.compile(r"^mvapich", re.I), "MVAPICH"),
    (re.compile(r"^mpich(/|$)", re.I), "MPICH"),
)
# Environment variables whose value sites document as node-local scratch.
_SCRATCH_VARIABLES = ("LOCAL_SCRATCH", "LOCALSCRATCH", "SCRATCH_LOCAL", "NODE_LOCAL_SCRATCH", "LOCAL_TMPDIR")


def loaded_modules(probe: Probe) -> tuple[str | None, list[str]]:
    """The module system (``Lmod``, ``Environment Modules``, None) and the modules a login shell has loaded."""
    variables = probe.variables
    login = probe.login_shell()
    text = variables.get("LOADEDMODULES") or next((v for v in login.get("LOADEDMODULES", []) if v), "")
    modules = [m for m in text.split(":") if m]
    if "LMOD_VERSION" in variables or "LMOD_CMD" in variables:
        system: str | None = "Lmod"
    elif "MODULES_CMD" in variables or "MODULESHOME" in variables:
        system = "Environment Modules"
    elif login.get("MODULE_COMMAND"):
        system = "a login shell's `module`"
    else:
        system = None
    return system, modules


def mpi_library(probe: Probe, modules: list[str]) -> tuple[Fact[str] | None, list[str]]:
    """The MPI family a job would use (expected_library) and the loaded modules that provide it."""
    for module in modules:
        for pattern, family in _MPI_MODULES:
            if pattern.search(module):
                return learned(family, f"loaded module {module}"), [module]
    version = probe.answered("mpi_version") or ""
    for pattern, family in _MPI_VERSION_PATTERNS:
        if pattern.search(version):
            path = probe.programs.get("mpiexec", "mpiexec")
            return learned(family, f"{path} --version"), []
    return None, []


def batch_launcher(probe: Probe, mpi: Fact[str] | None, *, prefer_aprun: bool) -> Fact[str]:
    """The launcher under a batch scheduler that has none of its own: Cray ALPS's aprun where it is the only
    one (or ``prefer_aprun``), else mpiexec."""
    programs = probe.programs
    if "aprun" in programs and (prefer_aprun or "mpiexec" not in programs):
        return learned("aprun", f"Cray ALPS: {programs['aprun']}")
    if "mpiexec" in programs:
        return learned("mpiexec", f"{programs['mpiexec']}" + (f" ({mpi.value})" if mpi else ""))
    return guess("mpiexec", "no mpiexec or aprun on the login node's PATH")


def unscheduled_launcher(probe: Probe, mpi: Fact[str] | None) -> Fact[str]:
    """The launcher on a machine without scheduler: its MPI's mpiexec, else hpctrain's own."""
    if mpi is not None and "mpiexec" in probe.programs:
        return learned("mpiexec", f"{probe.programs['mpiexec']} ({mpi.value}); no scheduler")
    return learned("local", "no scheduler and no MPI: hpctrain's own launcher")


def comm_backend(node: NodeFacts, mpi: Fact[str] | None) -> Fact[str]:
    """NCCL (RCCL on AMD) where nodes have NVIDIA/AMD GPUs, MPI where an MPI exists, else gloo."""
    kind = node.gpu_kind.value
    if node.gpus.value > 0 and kind in ("nvidia", "amd"):
        return learned("nccl", f"chosen: {node.gpus.value} {kind} GPUs per node")
    if mpi is not None:
        return learned("mpi", f"chosen: {mpi.value} found")
    return learned("gloo", "chosen: no MPI found on the login node (torch.distributed over TCP)")


def scratch(probe: Probe, facts: SchedulerFacts) -> Fact[str] | None:
    """A node-local scratch path: the scheduler's (its reader's ``scratch``), a variable that names one, a known
    directory."""
    variables = probe.variables
    for name in _SCRATCH_VARIABLES:
        if variables.get(name, "").startswith("/"):
            return learned(variables[name], f"${name} on the login node")
    if facts.scratch is not None:
        return facts.scratch
    for directory in probe.out("dirs").splitlines():
        if directory in SCRATCH_DIRS:
            return guess(directory, f"{directory} exists on the login node; sites use it for node-local scratch")
    tmpdir = variables.get("TMPDIR", "")
    if tmpdir.startswith("/") and tmpdir.rstrip("/") != "/tmp":
        return guess(tmpdir, "$TMPDIR on the login node")
    return None


def login_node(probe: Probe, why: str, runs_jobs: bool = False) -> NodeFacts:
    """The login node's own CPUs and memory: the machine's shape when it runs the jobs itself (no
    scheduler, ``runs_jobs``), else guesses for compute nodes the scheduler did not describe."""
    cpus_text = probe.out("cpus").strip()
    counted = plain_count(cpus_text, 1_000_000)
    cpus = counted or 1
    kilobytes = plain_count(probe.out("memory"))
    memory = round(kilobytes / 2 ** 20, 1) if kilobytes else 0.0
    host = probe.out("host").strip() or "the login node"
    fact = learned if runs_jobs and counted is not None else guess
    return NodeFacts(
        cores=fact(cpus, f"{why}: getconf _NPROCESSORS_ONLN on {host} (logical CPUs)"),
        threads_per_core=guess(1, f"{why}: hardware threads per core not asked"),
        gpus=guess(0, f"{why}: GPUs not asked"),
        gpu_kind=guess("none", f"{why}: GPUs not asked"),
        memory_gb=(fact(memory, f"{why}: MemTotal in /proc/meminfo on {host}") if memory > 0
                   else guess(1.0, f"{why}: no /proc/meminfo on {host}")),
        count=1,
    )
