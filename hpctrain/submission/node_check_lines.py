"""The batch script's node check section (``hpctrain.submission.launchers.node_check`` around one launcher step of
``hpctrain.nodes.check`` per node) and the line that reads the nodes a requeue must exclude. docs/nodes.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.exit_codes import EXIT_REQUEUE, REQUEUE_MARKER
from hpctrain.nodes.check import MIN_FREE_TMP_BYTES
from hpctrain.submission.schedulers.base import Scheduler, exit_record_line
from hpctrain.submission.shell import quote_path, word
from hpctrain.submission.staging import one_per_node

# Free memory a node must have where the job names none: a tenth of what the profile says a node has.
MEMORY_SHARE = 0.1


def _local_dirs(site: SiteProfile) -> list[str]:
    """``PATH:BYTES`` of each node-local directory to check: /tmp, and the staging directory where it is a plain path
    (a path with variables is checked by staging itself, on the node)."""
    dirs = [f"/tmp:{MIN_FREE_TMP_BYTES}"]
    staged = site.staging.node_local_dir if site.staging is not None else None
    if staged and "$" not in staged and staged.rstrip("/") != "/tmp":
        dirs.append(f"{staged.rstrip('/')}:{MIN_FREE_TMP_BYTES}")
    return dirs


def node_check_lines(job: JobSpec, site: SiteProfile, scheduler: Scheduler, launcher: str, python: str,
                     run_dir: str, excluded: Sequence[str]) -> list[str]:
    """The script's node check, run after the environment is set up and before staging and the launch; none where
    the job does not check its nodes."""
    res = job.resources
    if not res.checks_nodes:
        return []
    node = site.node_for(res.queue)
    memory = res.memory_gb if res.memory_gb is not None else (node.memory_gb or 0) * MEMORY_SHARE
    check = [python, "-m", "hpctrain.nodes.check", "--timeout", str(res.node_check_timeout_s),
             "--min-memory-gb", f"{memory:.3g}"]
    for directory in _local_dirs(site):
        check += ["--local-dir", directory]
    devices = res.gpus_per_rank * res.ranks_per_node
    if devices and node.gpu_kind != "none":
        check += ["--devices", str(devices), "--device-kind", node.gpu_kind]
    step = one_per_node(site, launcher, res.allocated_nodes, check, python)
    argv = _gatherer(job, scheduler, python, run_dir, excluded)
    spares = f", {res.spare_nodes} spare" if res.spare_nodes else ""
    return ["# ---- hpctrain: node check (docs/nodes.md) ----------------------------------------------------------",
            f"# Every node of the allocation ({res.nodes} to train on{spares}) checks itself in one step and reports "
            "to this node;",
            f"# a bad node is left out ({TRAINING_NODES_NOTE}) or, with too few healthy ones, the job ends here.",
            f"{argv} -- \\",
            "    " + " ".join(word(w) for w in step) + " \\",
            f"    || {{ status=$?; {exit_record_line(scheduler.job_id_variable)}; exit \"${{status}}\"; }}"]


def _gatherer(job: JobSpec, scheduler: Scheduler, python: str, run_dir: str, excluded: Sequence[str]) -> str:
    """The gatherer's command line (hpctrain.submission.launchers.node_check), without its step."""
    res = job.resources
    options: list[str] = ["--nodes", str(res.nodes), "--timeout", str(res.node_check_timeout_s)]
    if excluded:
        options += ["--exclude", ",".join(excluded)]
    log = scheduler.job_log_word()
    if log is not None and scheduler.lost_node_pattern:
        options += ["--lost-nodes-log", log, "--lost-nodes-pattern", scheduler.lost_node_pattern]
    return " ".join([word(python), "-m", "hpctrain.submission.launchers.node_check", "--run-dir",
                     quote_path(run_dir), *(word(w) for w in options)])


def relaunch_lines(job: JobSpec, scheduler: Scheduler, python: str, run_dir: str,
                   excluded: Sequence[str]) -> tuple[str, str]:
    """With spare nodes: the loop around the launch that starts the ranks again on the spares when the launch
    failed for a node (blamed by the launcher's report or lost by the scheduler), from the last checkpoint, at
    most ``spare_nodes`` times; when too few nodes are left the job goes back in the queue (status 75). ("", "")
    without spare nodes."""
    spares = job.resources.spare_nodes
    if not spares or not job.resources.checks_nodes:
        return "", ""
    start = "hpctrain_relaunches=0\nwhile :; do  # again on the spare nodes after a node failed (docs/nodes.md)"
    end = "\n".join([
        f'if [ "${{status}}" -ne 0 ] && [ "${{status}}" -ne {EXIT_REQUEUE} ] '
        f'&& [ "${{hpctrain_relaunches}}" -lt {spares} ]; then',
        "    hpctrain_reselect=0",
        f"    {_gatherer(job, scheduler, python, run_dir, excluded)} --reselect || hpctrain_reselect=$?",
        '    if [ "${hpctrain_reselect}" -eq 0 ]; then',
        "        hpctrain_relaunches=$((hpctrain_relaunches + 1))",
        '        echo "hpctrain: starting the ranks again from the last checkpoint (relaunch ${hpctrain_relaunches} '
        f'of {spares})"',
        f"        rm -f -- {REQUEUE_MARKER}",
        "        continue",
        f'    elif [ "${{hpctrain_reselect}}" -eq {EXIT_REQUEUE} ]; then',
        f"        status={EXIT_REQUEUE}",
        "    fi",
        "fi",
        "break",
        "done"])
    return start, end


TRAINING_NODES_NOTE = "the launch starts on the nodes of ./training-nodes"


def excluded_nodes_line(job: JobSpec, scheduler: Scheduler, python: str) -> list[str]:
    """Before the requeue: ``hpctrain_excluded_nodes``, the nodes the run blamed (comma-separated), which a scheduler
    that can exclude nodes hands to the requeued job; none where the job does not check its nodes or the scheduler
    cannot exclude any."""
    if not job.resources.checks_nodes or not scheduler.excludes_nodes:
        return []
    spares = " --spares" if job.resources.spare_nodes else ""
    return [f"hpctrain_excluded_nodes=$({word(python)} -m hpctrain.nodes.blame --run-dir .{spares} 2>/dev/null)"
            " || hpctrain_excluded_nodes="]
