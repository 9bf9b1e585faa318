"""``hpctrain sites discover``: a new site's profile from what the scheduler on its login node reports.

One probe (probe.py, one round trip, here or over ssh) asks the scheduler and the login node; the detected
back-end's reader (its ``read_discovery``, e.g. schedulers/slurm/discovery.py) and environment.py turn the answers
into Findings (facts.py, detect.py); profile.py writes them as a validated profile with sources and guesses;
check.py compares them with an existing profile. Nothing here knows a scheduler: what differs is the back-end's.
"""

from hpctrain.submission.discovery.check import Difference, compare_profile
from hpctrain.submission.discovery.detect import discover, findings_from
from hpctrain.submission.discovery.facts import Findings
from hpctrain.submission.discovery.profile import Draft, draft_profile, write_profile

__all__ = ["Difference", "Draft", "Findings", "compare_profile", "discover", "draft_profile", "findings_from",
           "write_profile"]
