"""``hpctrain sites discover``: a new site's profile from what the scheduler on its login node reports.

One probe (probe.py, one round trip, here or over ssh) asks the scheduler and the login node; the detected
back-end's reader (its ``read_discovery``, e.g. schedulers/slurm/discovery.py) and environment.py turn the answers
into Findings (facts.py, detect.py); profile.py writes them as a validated profile with sources and guesses;
check.py compares them with an existing profile. Nothing here knows a scheduler: what differs is the back-end's.
The package re-exports nothing: facts.py and probe.py are part of the back-end contract (schedulers/base.py reads
them), and importing them must not import the modules that use the back-ends.
"""
