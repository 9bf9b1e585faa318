"""Reading a job's record from the real Slurm, for the tests that steer a running job (walltime, requeue)."""

from __future__ import annotations

import re
import subprocess


def scontrol(job_id: str) -> dict[str, str]:
    """``scontrol show job -o``, as key → value."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=15)
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def seconds(text: str) -> int:
    """Slurm's [D-]HH:MM:SS as seconds."""
    days, _, hms = text.rpartition("-")
    h, m, s = (int(v) for v in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s
