"""Which scheduler the login node has, and everything learned from one probe of it (``discover``).

Every registered back-end is asked in its ``detect_order`` whether the probe shows it (each back-end's order says
why it comes where it does); the one without scheduler, last, takes a machine where no other answers.
"""

from __future__ import annotations

from hpctrain.submission.discovery import environment
from hpctrain.submission.discovery.facts import Findings, guess, learned
from hpctrain.submission.discovery.probe import Probe, run_probe
from hpctrain.submission.schedulers.base import Scheduler, all_schedulers
from hpctrain.submission.transport import Transport


def detected_scheduler(probe: Probe) -> Scheduler:
    """The first back-end, in detection order, that the probe shows."""
    return next(s for s in all_schedulers() if s.detects(probe))


def scheduler_programs() -> list[str]:
    """The programs whose presence tells a scheduler is there."""
    return list(dict.fromkeys(p for s in all_schedulers() for p in s.detect_programs))


def _login_shell_hints(probe: Probe, scheduler: Scheduler) -> list[str]:
    """Scheduler commands a login shell finds but hpctrain's non-login ssh commands do not."""
    if not scheduler.runs_here:
        return []
    programs = scheduler_programs()
    hidden = [p.split()[0] for p in probe.login_shell().get("PROGRAM", []) if p.split()
              and p.split()[0] in programs]
    if not hidden:
        return []
    return [f"{', '.join(hidden)} exist only in a login shell (bash -l), which hpctrain's commands do not start: "
            "add their directory to PATH in ~/.bashrc (or the module load that provides them), then discover again"]


def findings_from(probe: Probe, remote: str | None = None) -> Findings:
    """Everything the probe's answers say, as Findings (no command runs here)."""
    scheduler = detected_scheduler(probe)
    here = scheduler.runs_here
    facts = scheduler.read_discovery(probe)
    notes = list(facts.notes)
    host = probe.out("host").strip() or (remote or "this machine")
    if here:
        notes.append(f"no scheduler commands ({', '.join(scheduler_programs())}) on {host}: the profile is for a "
                     f"machine without scheduler (scheduler: {scheduler.name}); on a cluster, load the scheduler's "
                     "module or fix PATH and discover again")
    elif not facts.answered:
        notes.append(f"{scheduler.title}'s commands exist on {host} but none answered: the profile "
                     "is mostly guessed; run discover again when the scheduler answers")
    notes += _login_shell_hints(probe, scheduler)

    module_system, modules = environment.loaded_modules(probe)
    mpi, mpi_modules = environment.mpi_library(probe, modules)
    if facts.node is not None:
        node = facts.node
    else:
        why = ("no scheduler: jobs run on this machine" if here
               else f"{scheduler.title} did not describe its compute nodes")
        node = environment.login_node(probe, why, runs_jobs=here)
    launcher = scheduler.discovered_launcher(probe, mpi) or environment.unscheduled_launcher(probe, mpi)
    launcher_args = scheduler.discovered_launcher_args(facts, mpi) or learned([], "no extra launcher options needed")
    notes += scheduler.discovery_notes(probe, launcher, mpi)
    if here and launcher.value == "local":
        backend = learned("gloo", "chosen: hpctrain's local launcher runs torch.distributed over gloo")
    else:
        backend = environment.comm_backend(node, mpi)
    if not here and launcher.guessed:
        backend = guess(backend.value, backend.source + "; the launcher is a guess")
    return Findings(
        host=host, user=probe.out("user").strip(), remote=remote, scheduler=facts, node=node,
        launcher=launcher, launcher_args=launcher_args, comm_backend=backend, mpi_library=mpi,
        mpi_modules=mpi_modules, module_system=module_system, loaded_modules=modules,
        scratch=environment.scratch(probe, facts), notes=notes)


def discover(transport: Transport, remote: str | None = None) -> Findings:
    """Probe the login node behind ``transport`` once and read what it says."""
    return findings_from(run_probe(transport, all_schedulers()), remote)
