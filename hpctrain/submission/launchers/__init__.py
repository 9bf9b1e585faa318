"""Launchers: small pure functions, registered by name (config/backends.py), that wrap a command in the parallel
launch argv, each with its job-side half (a ``LauncherBackend``).

Each is ``(command, plan) -> argv`` (Parsl/ReFrame style) and returns a list, never a shell string;
``render.py`` quotes the list once when it writes the script. Its ``LauncherBackend`` adds what the script and the
ranks need to know about it: its job environment (hpctrain/job_environment.py), the broadcast staging may use,
and the line that notes a failed launch. A plug-in may register a plain function: it then has none of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpctrain.config.backends import LAUNCHERS
from hpctrain.errors import ConfigError
from hpctrain.submission.launchers.binding import RankSets, device_map, pals_cpu_list

if TYPE_CHECKING:  # the in-job helpers below this package start on every rank: no pydantic import at run time
    from hpctrain.config.node_shape import NodeShape


@dataclass(frozen=True)
class LaunchPlan:
    """How many ranks go where, with which threads, GPUs and binding.

    ``hyperthreads`` is the number of hardware threads per core the job uses (aprun ``-j``);
    ``cpus_per_rank`` the scheduler "CPUs" reserved per rank, whole cores; ``threads_per_core`` the
    ``--threads-per-core`` a Slurm site needs asked for (None: its default). ``cpu_list`` holds each local rank's
    logical CPUs where the site binds by list, ``devices`` each local rank's device ids (see binding.py).
    """

    nodes: int
    ranks_per_node: int
    threads_per_rank: int = 1
    gpus_per_rank: int = 0
    cpu_bind: str | None = None
    extra_args: tuple[str, ...] = ()
    hyperthreads: int = 1
    cpus_per_rank: int | None = None
    gpu_kind: str = "none"
    python: str = "python3"
    env: tuple[tuple[str, str], ...] = field(default=())
    threads_per_core: int | None = None
    cpu_list: RankSets = ()
    devices: RankSets = ()
    # A file of the hosts to start on, one per line (the node check's choice, where the job has spare nodes);
    # None: every node of the allocation.
    host_file: str | None = None

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def cpus_per_task(self) -> int:
        return self.cpus_per_rank if self.cpus_per_rank is not None else self.threads_per_rank


Launcher = Callable[[list[str], LaunchPlan], list[str]]
# (the job's interpreter, the run directory, both as script words) -> a shell command run after the launch failed
ExitNote = Callable[[str, str], str]


@dataclass(frozen=True)
class LauncherBackend:
    """A launcher plug-in whole: its launch argv and its job-side half.

    ``job_environment``: ``module:attribute`` of its JobEnvironment (the variables its ranks see). ``broadcast``: a
    command (``sbcast -f``) that reads a file once and writes it to ``DEST`` on every node of the job, as
    ``BROADCAST... SRC DEST``; empty where the launcher has none (staging then runs stage_tree.py on every node).
    ``exit_note``: the command noting the failure of a launch that exited non-zero (None: the ranks note it).
    ``pins_threads``: the launcher places each rank's threads itself (aprun's ``-cc``), so the script sets OpenMP's
    placement variables to match even where the profile asks for no CPU binding.
    """

    argv: Launcher
    job_environment: str = ""
    broadcast: tuple[str, ...] = ()
    exit_note: ExitNote | None = None
    pins_threads: bool = False

    def __call__(self, command: list[str], plan: LaunchPlan) -> list[str]:
        return self.argv(command, plan)


def get_launcher(name: str) -> LauncherBackend:
    """The launcher registered as ``name`` (config/backends.py: the back-ends below, or an installed package's
    entry point in the group ``hpctrain.launchers``, a LauncherBackend or a plain function); unknown names are a
    ConfigError listing the known ones."""
    launcher = LAUNCHERS.load(name)
    return launcher if isinstance(launcher, LauncherBackend) else LauncherBackend(launcher)


# A site's ``cpu_bind: list`` asks hpctrain to write each rank's CPUs itself (binding.py); only PALS takes such a list.
LIST_BINDING = "list"


def _no_list_binding(plan: LaunchPlan, launcher: str) -> None:
    if plan.cpu_bind == LIST_BINDING:
        raise ConfigError(f"cpu_bind: list (hpctrain writes each rank's CPUs) works with PALS mpiexec, not {launcher}",
                          key="cpu_bind", hint="use the launcher's own binding (srun: cores or threads)")


def gpu_wrapper(command: list[str], plan: LaunchPlan) -> list[str]:
    """``command`` behind ``python -m hpctrain.submission.launchers.gpu_affinity`` when ranks need their own GPUs.

    With ``plan.devices`` the wrapper gets the whole map (local rank -> devices) the site's topology gives;
    without, each local rank takes the next ``gpus_per_rank`` devices.
    """
    if plan.gpus_per_rank <= 0 or plan.gpu_kind == "none":
        return list(command)
    chosen = ["--devices", device_map(plan.devices)] if plan.devices else ["--gpus-per-rank", str(plan.gpus_per_rank)]
    return [plan.python, "-m", "hpctrain.submission.launchers.gpu_affinity", "--kind", plan.gpu_kind,
            *chosen, "--", *command]


def _no_host_file(plan: LaunchPlan, launcher: str) -> None:
    if plan.host_file is not None:
        raise ConfigError(f"{launcher} cannot be told which of the job's nodes to start on, so spare nodes cannot "
                          "replace a bad one", key="resources.spare_nodes",
                          hint="remove spare_nodes (the node check still names a bad node and ends the job)")


def srun(command: list[str], plan: LaunchPlan) -> list[str]:
    """Slurm's srun; GPUs per rank through ``--gpus-per-task`` and ``--gpu-bind=closest``; the chosen nodes with
    ``--nodelist=FILE`` (srun reads a value holding a ``/`` as a file of host names)."""
    _no_list_binding(plan, "srun")
    # --kill-on-bad-exit: a rank that dies takes the step down at once instead of leaving peers blocked.
    argv = ["srun", f"--nodes={plan.nodes}", f"--ntasks={plan.ranks}",
            f"--ntasks-per-node={plan.ranks_per_node}", f"--cpus-per-task={plan.cpus_per_task}"]
    if plan.host_file is not None:
        argv.append(f"--nodelist={plan.host_file}")
    if plan.threads_per_core is not None:  # must match the allocation's (OLCF: set it in sbatch and srun)
        argv.append(f"--threads-per-core={plan.threads_per_core}")
    argv.append("--kill-on-bad-exit=1")
    if plan.gpus_per_rank > 0:
        argv += [f"--gpus-per-task={plan.gpus_per_rank}", "--gpu-bind=closest"]
    if plan.cpu_bind:
        argv.append(f"--cpu-bind={plan.cpu_bind}")
    return [*argv, *plan.extra_args, *command]


def aprun(command: list[str], plan: LaunchPlan) -> list[str]:
    """Cray ALPS aprun (Theta): ``-d`` hardware threads per PE, ``-j`` hardware threads used per core."""
    _no_list_binding(plan, "aprun")
    _no_host_file(plan, "aprun (node ids, not host names)")
    argv = ["aprun", "-n", str(plan.ranks), "-N", str(plan.ranks_per_node), "-d", str(plan.threads_per_rank),
            "-j", str(plan.hyperthreads), "-cc", plan.cpu_bind or "depth",
            "-e", f"OMP_NUM_THREADS={plan.threads_per_rank}"]
    return [*argv, *plan.extra_args, *command]


def mpiexec_pals(command: list[str], plan: LaunchPlan) -> list[str]:
    """HPE Cray PALS mpiexec under PBS Pro (Polaris, Aurora); GPUs through the gpu_affinity wrapper.

    ``cpu_bind: list`` writes each rank's CPUs (``--cpu-bind list:1-8:9-16:...``, as ALCF documents for Aurora);
    otherwise ``--depth`` hardware threads per rank with the site's binding (depth by default).
    """
    argv = ["mpiexec", "-n", str(plan.ranks), "--ppn", str(plan.ranks_per_node)]
    if plan.host_file is not None:  # PALS: the hosts to use instead of $PBS_NODEFILE
        argv += ["--hostfile", plan.host_file]
    if plan.cpu_bind == LIST_BINDING:
        if len(plan.cpu_list) != plan.ranks_per_node:
            raise ConfigError("cpu_bind: list needs each rank's CPUs in the launch plan", key="cpu_bind")
        argv += ["--cpu-bind", pals_cpu_list(plan.cpu_list)]
    else:
        argv += ["--depth", str(plan.threads_per_rank), "--cpu-bind", plan.cpu_bind or "depth"]
    argv += ["--env", f"OMP_NUM_THREADS={plan.threads_per_rank}"]
    return [*argv, *plan.extra_args, *gpu_wrapper(command, plan)]


def mpiexec_hydra(command: list[str], plan: LaunchPlan) -> list[str]:
    """MPICH's hydra mpiexec (also the mpich wheel's): ``-n`` ranks, ``-ppn`` per node."""
    _no_list_binding(plan, "hydra mpiexec")
    argv = ["mpiexec", "-n", str(plan.ranks), "-ppn", str(plan.ranks_per_node)]
    if plan.host_file is not None:  # hydra: a file of host names, one per line
        argv += ["-f", plan.host_file]
    if plan.cpu_bind:
        argv += ["-bind-to", plan.cpu_bind]
    return [*argv, *plan.extra_args, *gpu_wrapper(command, plan)]


def local(command: list[str], plan: LaunchPlan) -> list[str]:
    """hpctrain's own launcher for a machine without scheduler (one node, a process per rank)."""
    if plan.nodes != 1:
        raise ConfigError(f"the local launcher runs on one machine, not {plan.nodes} nodes", key="resources.nodes")
    _no_host_file(plan, "the local launcher (one machine)")
    return [plan.python, "-m", "hpctrain.submission.launchers.local_launch", "--nprocs", str(plan.ranks),
            *plan.extra_args, "--", *command]


def srun_exit_note(python: str, run_dir: str) -> str:
    """After a failed srun: the first rank srun reports killed by a signal becomes the failure note (exit_note.py)."""
    return " ".join([python, "-m", "hpctrain.submission.launchers.exit_note", "--run-dir", run_dir, "--slurm-job",
                     '"${SLURM_JOB_ID}"'])


BUILTIN_JOB_ENVIRONMENT = "hpctrain.job_environment:"
SRUN = LauncherBackend(srun, BUILTIN_JOB_ENVIRONMENT + "SLURM", broadcast=("sbcast", "-f"), exit_note=srun_exit_note)
APRUN = LauncherBackend(aprun, BUILTIN_JOB_ENVIRONMENT + "ALPS", pins_threads=True)
MPIEXEC_PALS = LauncherBackend(mpiexec_pals, BUILTIN_JOB_ENVIRONMENT + "PALS")
MPIEXEC_HYDRA = LauncherBackend(mpiexec_hydra, BUILTIN_JOB_ENVIRONMENT + "HYDRA")
LOCAL = LauncherBackend(local, BUILTIN_JOB_ENVIRONMENT + "LOCAL")


def hyperthreads_for(node: NodeShape, ranks_per_node: int, threads_per_rank: int) -> int:
    """Hardware threads per core the job needs: ranks x threads spread over the node's cores (at least 1)."""
    assert isinstance(node.cores, int)
    wanted = ranks_per_node * threads_per_rank
    return max(1, min(node.threads_per_core, -(-wanted // node.cores)))


def slurm_threads_per_core(node: NodeShape, hyperthreads: int) -> int | None:
    """The ``--threads-per-core`` a job must ask for: only where the site lays tasks out on fewer hardware threads
    per core than the job needs (Frontier defaults to 1; a job using both threads of its cores asks for 2)."""
    if node.task_threads_per_core is not None and hyperthreads > node.task_threads_per_core:
        return hyperthreads
    return None


def cpus_per_rank_for(node: NodeShape, threads_per_rank: int, hyperthreads: int) -> int:
    """Scheduler CPUs reserved per rank (``--cpus-per-task``): whole cores, times the hardware threads per core a
    task is laid out on (Perlmutter: 2, so 16 cores are -c 32; Frontier: 1, so 7 cores are OLCF's -c 7)."""
    cores = -(-threads_per_rank // hyperthreads)
    per_core = slurm_threads_per_core(node, hyperthreads) or node.task_threads_per_core or node.threads_per_core
    return cores * per_core
