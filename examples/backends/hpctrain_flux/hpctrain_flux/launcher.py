"""``flux run``: ranks, nodes, cores and GPUs per task, each task bound to its own cores and GPUs (LLNL's mpibind
tutorial, "Flux affinity on the AMD MI300A APU": ``-o cpu-affinity=per-task -o gpu-affinity=per-task``)."""

from hpctrain.submission.launchers import LauncherBackend, LaunchPlan


def flux_run(command: list[str], plan: LaunchPlan) -> list[str]:
    argv = ["flux", "run", f"--nodes={plan.nodes}", f"--ntasks={plan.ranks}",
            f"--tasks-per-node={plan.ranks_per_node}", f"--cores-per-task={plan.cpus_per_task}",
            "-o", "cpu-affinity=per-task"]
    if plan.gpus_per_rank > 0:
        argv += [f"--gpus-per-task={plan.gpus_per_rank}", "-o", "gpu-affinity=per-task"]
    return [*argv, *plan.extra_args, *command]


FLUX_RUN = LauncherBackend(flux_run, job_environment="hpctrain_flux.job_environment:FLUX")
