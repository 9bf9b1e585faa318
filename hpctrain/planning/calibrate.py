"""``--calibrate``: measure a job's step profile with a short run on one node of the site's smallest queue.

The run is the job itself with a few changes: one node, ``steps`` steps (the first few are not timed),
checkpoints only at the end, a walltime the queue allows, no LR warm-up or decay (they do not change a step's
time, and a warm-up longer than the calibration would be refused). It is submitted like any run (registry, batch
script, the site's scheduler) and waited for; its profile.json is then read back like ``--from RUN``.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.config.site import SiteProfile
from hpctrain.config.walltime import format_hms, parse_walltime
from hpctrain.errors import RuntimeFailure
from hpctrain.planning.measurements import Measurements
from hpctrain.planning.runs import read_run
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.transport import TransportPool

CALIBRATION_STEPS = 30
CALIBRATION_WALLTIME_S = 15 * 60


def smallest_queue(site: SiteProfile) -> str | None:
    """The queue with the fewest nodes (then the shortest walltime): where a one-node run starts soonest."""
    if not site.queues:
        return None
    direct = {name: q for name, q in site.queues.items() if q.direct_submit}
    eligible = {name: q for name, q in direct.items() if q.min_nodes <= 1} or direct
    return min(eligible, key=lambda n: (eligible[n].max_nodes, parse_walltime(eligible[n].max_walltime), n))


def calibration_overrides(site: SiteProfile, steps: int) -> list[str]:
    """The ``--set`` assignments that turn a job into its calibration run on ``site``."""
    queue = smallest_queue(site)
    walltime = CALIBRATION_WALLTIME_S
    if queue is not None:  # within the queue's limit for one node, and not under its minimum
        limits = site.queues[queue]
        walltime = min(walltime, parse_walltime(limits.walltime_limit(1)[0]))
        if limits.min_walltime is not None:
            walltime = max(walltime, parse_walltime(limits.min_walltime))
    # The LR schedule does not change a step's time; a warm-up longer than the calibration would be refused.
    sets = [f"train.steps={steps}", "resources.nodes=1", f"checkpoint.every_steps={steps}",
            f"train.log_every={max(1, min(10, steps))}", f"resources.walltime={format_hms(walltime)}",
            "train.warmup=none", "train.decay=none"]
    if queue is not None:
        sets.append(f"resources.queue={queue}")
    return sets


def calibrate(job_path: str, site: SiteProfile, *, job_sets: Sequence[str] = (), steps: int = CALIBRATION_STEPS,
              remote: str | None = None, ssh_config: str | None = None, registry: RunRegistry | None = None,
              pool: TransportPool | None = None, timeout_s: float = CALIBRATION_WALLTIME_S + 300,
              run_root: str | None = None) -> tuple[str, Measurements]:
    """Submit the calibration run, wait for it, and return (run id, its measurements)."""
    from hpctrain.submission.api import RunHandle, submit_runs

    pool = pool or TransportPool()
    own = registry is None
    registry = registry or RunRegistry()
    try:
        done = submit_runs(job_path, site, remote=remote, ssh_config=ssh_config,
                           sets=[*job_sets, *calibration_overrides(site, steps)], run_root=run_root,
                           registry=registry, pool=pool)
        run = done.runs[0]
        view = RunHandle(run.run_id, registry.path, pool).wait(timeout=timeout_s)
        if view.state != "completed":
            why = f": {view.reason}" if view.reason else ""
            raise RuntimeFailure(f"calibration run {run.run_id} ended {view.state}{why}",
                                 hint=f"see `hpctrain logs {run.run_id}`")
        return run.run_id, read_run(run.run_id, registry, pool)
    finally:
        if own:
            registry.close()
