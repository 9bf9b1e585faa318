"""hpctrain's LSF back-end, shipped outside hpctrain: ``bsub`` with ``#BSUB`` directives (scheduler.py), ``jsrun``
resource sets (launcher.py) and the variables LSF and jsrun set in a job (job_environment.py)."""
