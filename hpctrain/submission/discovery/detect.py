"""Which scheduler the login node has, and everything learned from one probe of it (``discover``).

Slurm wins where its commands exist (sites often install PBS-style ``qstat`` wrappers beside it); Cobalt is
told from PBS by its ``qstat -Q`` table or its ``partlist``/``cqsub`` commands.
"""

from __future__ import annotations

from hpctrain.submission.discovery import environment
from hpctrain.submission.discovery.cobalt import is_cobalt_queue_table, read_cobalt
from hpctrain.submission.discovery.facts import Findings, SchedulerFacts, guess, learned
from hpctrain.submission.discovery.pbs import read_pbs
from hpctrain.submission.discovery.probe import Probe, run_probe
from hpctrain.submission.discovery.slurm import read_slurm
from hpctrain.submission.transport import Transport

SCHEDULER_TITLES = {"slurm": "Slurm", "pbs": "PBS", "cobalt": "Cobalt", "local": "no scheduler"}
_SCHEDULER_PROGRAMS = ("sinfo", "scontrol", "qstat", "pbsnodes", "partlist", "cqsub")


def which_scheduler(probe: Probe) -> str:
    """``slurm``, ``cobalt``, ``pbs`` or ``local`` (no scheduler commands at all)."""
    programs = probe.programs
    if "sinfo" in programs or "scontrol" in programs:
        return "slurm"
    if "partlist" in programs or "cqsub" in programs or is_cobalt_queue_table(probe.out("qstat_queues")):
        return "cobalt"
    if "qstat" in programs or "pbsnodes" in programs:
        return "pbs"
    return "local"


def read_scheduler(probe: Probe, name: str) -> SchedulerFacts:
    if name == "slurm":
        return read_slurm(probe)
    if name == "pbs":
        return read_pbs(probe)
    if name == "cobalt":
        return read_cobalt(probe)
    return SchedulerFacts(name="local", answered=True)


def _login_shell_hints(probe: Probe, scheduler: str) -> list[str]:
    """Scheduler commands a login shell finds but hpctrain's non-login ssh commands do not."""
    if scheduler != "local":
        return []
    hidden = [p.split()[0] for p in probe.login_shell().get("PROGRAM", []) if p.split()
              and p.split()[0] in _SCHEDULER_PROGRAMS]
    if not hidden:
        return []
    return [f"{', '.join(hidden)} exist only in a login shell (bash -l), which hpctrain's commands do not start: "
            "add their directory to PATH in ~/.bashrc (or the module load that provides them), then discover again"]


def findings_from(probe: Probe, remote: str | None = None) -> Findings:
    """Everything the probe's answers say, as Findings (no command runs here)."""
    name = which_scheduler(probe)
    facts = read_scheduler(probe, name)
    notes = list(facts.notes)
    host = probe.out("host").strip() or (remote or "this machine")
    if name == "local":
        notes.append(f"no scheduler commands ({', '.join(_SCHEDULER_PROGRAMS)}) on {host}: the profile is for a "
                     "machine without scheduler (scheduler: local); on a cluster, load the scheduler's module or "
                     "fix PATH and discover again")
    elif not facts.answered:
        notes.append(f"{SCHEDULER_TITLES[name]}'s commands exist on {host} but none answered: the profile "
                     "is mostly guessed; run discover again when the scheduler answers")
    notes += _login_shell_hints(probe, name)

    module_system, modules = environment.loaded_modules(probe)
    mpi, mpi_modules = environment.mpi_library(probe, modules)
    if facts.node is not None:
        node = facts.node
    else:
        why = ("no scheduler: jobs run on this machine" if name == "local"
               else f"{SCHEDULER_TITLES[name]} did not describe its compute nodes")
        node = environment.login_node(probe, why, runs_jobs=name == "local")
    launcher = environment.launcher(probe, name, mpi)
    if name == "slurm":
        launcher_args = environment.srun_mpi_args(facts, mpi)
    else:
        launcher_args = learned([], "no extra launcher options needed")
    if name == "pbs" and launcher.value == "mpiexec" and (mpi is None or mpi.value != "CRAY MPICH"):
        notes.append("under PBS, launcher mpiexec is rendered with HPE PALS's options (--ppn, --depth, --cpu-bind); "
                     f"check that {probe.programs.get('mpiexec', 'mpiexec')} is PALS's or accepts them")
    if name == "local" and launcher.value == "local":
        backend = learned("gloo", "chosen: hpctrain's local launcher runs torch.distributed over gloo")
    else:
        backend = environment.comm_backend(node, mpi)
    if name != "local" and launcher.guessed:
        backend = guess(backend.value, backend.source + "; the launcher is a guess")
    return Findings(
        host=host, user=probe.out("user").strip(), remote=remote, scheduler=facts, node=node,
        launcher=launcher, launcher_args=launcher_args, comm_backend=backend, mpi_library=mpi,
        mpi_modules=mpi_modules, module_system=module_system, loaded_modules=modules,
        scratch=environment.scratch(probe, facts), notes=notes)


def discover(transport: Transport, remote: str | None = None) -> Findings:
    """Probe the login node behind ``transport`` once and read what it says."""
    return findings_from(run_probe(transport), remote)
