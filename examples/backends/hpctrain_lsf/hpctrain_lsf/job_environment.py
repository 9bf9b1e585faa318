"""What LSF sets in a job and jsrun in each task. Imported on every rank (the script names it in
HPCTRAIN_JOB_ENVIRONMENT): it imports nothing but hpctrain's ``job_environment``.

LSB_JOBID, LSB_JOBINDEX: OLCF Summit user guide, "Batch Environment Variables". LSB_MCPU_HOSTS ("hostA n hostB n"):
IBM LSF 9.1.3, "About parallel jobs"; on Summit and Lassen its first host is the launch node the batch script
runs on, not a compute node (as PyTorch Lightning's LSF environment reads it). JSM_NAMESPACE_RANK, _SIZE,
_LOCAL_RANK: jsrun's task variables (PyTorch Lightning's LSF environment; no IBM page found). jsrun names no
local size: it comes from the node count (a resource set never spans nodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.job_environment import JobEnvironment, RankVariables


@dataclass(frozen=True)
class LsfJobEnvironment(JobEnvironment):
    def nodes(self, environ: Mapping[str, str]) -> list[str] | None:
        """The compute hosts of LSB_MCPU_HOSTS (host, slots, host, slots ...), the launch node left out."""
        words = environ.get("LSB_MCPU_HOSTS", "").split()
        if not words:
            return None
        hosts = list(dict.fromkeys(words[0::2]))
        return hosts[1:] or hosts


LSF = LsfJobEnvironment(
    "lsf",
    ranks=(RankVariables("jsrun", "JSM_NAMESPACE_RANK", rank=("JSM_NAMESPACE_RANK",), size=("JSM_NAMESPACE_SIZE",),
                         local_rank=("JSM_NAMESPACE_LOCAL_RANK",)),),
    job_id=("LSB_JOBID",), array_job_id=("LSB_JOBID",), array_index=("LSB_JOBINDEX",),
    array_id_format="{job}[{index}]",
)
