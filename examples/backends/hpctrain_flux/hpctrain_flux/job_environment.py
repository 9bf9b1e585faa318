"""What ``flux run`` sets in each task (flux-core doc/man7/flux-environment.rst; job-environment-variables.rst).

Imported on every rank (the script names it in HPCTRAIN_JOB_ENVIRONMENT): it imports nothing but hpctrain's
``job_environment``. The batch script itself sees only ``FLUX_URI`` and ``FLUX_ENCLOSING_ID`` (the batch job's
id); its tasks inherit that and get ``FLUX_JOB_ID`` (the step's id) and the ``FLUX_TASK_*`` variables.
"""

from hpctrain.job_environment import JobEnvironment, RankVariables

FLUX = JobEnvironment(
    "flux",
    ranks=(RankVariables("flux-run", "FLUX_TASK_RANK", rank=("FLUX_TASK_RANK",), size=("FLUX_JOB_SIZE",),
                         local_rank=("FLUX_TASK_LOCAL_ID",), nodes=("FLUX_JOB_NNODES",)),),
    job_id=("FLUX_ENCLOSING_ID", "FLUX_JOB_ID"),
)
