"""``jsrun``: one resource set per rank, ``-r`` of them per host, each with its cores and GPUs, bound to them
(OLCF Summit user guide, "Job Launcher (jsrun)": ``jsrun -n12 -r6 -a1 -c7 -g1 -brs``)."""

from hpctrain.submission.launchers import LauncherBackend, LaunchPlan


def jsrun(command: list[str], plan: LaunchPlan) -> list[str]:
    argv = ["jsrun", f"-n{plan.ranks}", f"-r{plan.ranks_per_node}", "-a1", f"-c{plan.cpus_per_task}",
            f"-g{plan.gpus_per_rank}", f"-b{plan.cpu_bind or 'rs'}", f"-EOMP_NUM_THREADS={plan.threads_per_rank}"]
    return [*argv, *plan.extra_args, *command]


JSRUN = LauncherBackend(jsrun, job_environment="hpctrain_lsf.job_environment:LSF")
