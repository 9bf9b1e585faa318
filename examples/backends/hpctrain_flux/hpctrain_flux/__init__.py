"""hpctrain's Flux back-end, shipped outside hpctrain: ``flux batch`` with ``#FLUX:`` directives (scheduler.py),
``flux run`` (launcher.py), the variables Flux sets in a job (job_environment.py) and the El Capitan profile."""

from pathlib import Path

SITE_CONFIGS = Path(__file__).resolve().parent / "site_configs"
