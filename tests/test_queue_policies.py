"""Queue policies (config/queue_policy.py): walltime by job size, minimum walltime, routing queues, per-user limits and
chaining, read from the shipped profiles and applied by check_fit, `jobs validate`, `render` and `plan`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.config.queue_policy import choose_queue, requeue_rule
from hpctrain.config.site import Queue, SiteProfile, load_site, load_site_file
from hpctrain.config.walltime import format_hms, parse_walltime
from hpctrain.errors import ConfigError, FitError
from tests.conftest import TinyJob

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SITES = ["theta", "polaris", "perlmutter", "frontier", "aurora", "ci-slurm"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


# ---------------------------------------------------------------------------------------------------------
# The edges of every bin of every shipped queue, read from the profile


def _bins(queue: Queue) -> list[tuple[int, int, int]]:
    """(first node, last node, walltime limit in s) of each bin; a queue without bins is one bin."""
    if queue.walltime_by_nodes:
        return [(b.min_nodes, b.max_nodes, parse_walltime(b.max_walltime)) for b in queue.walltime_by_nodes]
    return [(queue.min_nodes, queue.max_nodes, parse_walltime(queue.max_walltime))]


def _why_not(queue: Queue, nodes: int, seconds: int) -> str | None:
    """The words a refusal by ``queue`` must hold, or None where the queue takes the job (the test's oracle)."""
    if nodes > queue.max_nodes:
        return f"allows at most {queue.max_nodes}"
    if nodes < queue.min_nodes:
        return f"needs at least {queue.min_nodes}"
    if queue.max_nodes_per_user is not None and nodes > queue.max_nodes_per_user:
        return f"at most {queue.max_nodes_per_user} nodes at once"
    if queue.min_walltime is not None and seconds < parse_walltime(queue.min_walltime):
        return "under the minimum of queue"
    limit = next((w for lo, hi, w in _bins(queue) if lo <= nodes <= hi), parse_walltime(queue.max_walltime))
    if seconds > limit:
        return f"at most {format_hms(limit)}" if queue.walltime_by_nodes else "over the limit of queue"
    return None


def _expected(site: SiteProfile, name: str, nodes: int, seconds: int) -> tuple[str | None, str | None]:
    """(the execution queue that takes the job, None) or (None, the words its refusal must hold)."""
    queue = site.queues[name]
    why = _why_not(queue, nodes, seconds)
    if why is not None or not queue.routes_to:
        return (name, None) if why is None else (None, why)
    for target in queue.routes_to:
        if _why_not(site.queues[target], nodes, seconds) is None:
            return target, None
    sized = [t for t in queue.routes_to if site.queues[t].min_nodes <= nodes <= site.queues[t].max_nodes]
    if not sized:
        return None, "no execution queue behind routing queue"
    return None, _why_not(site.queues[sized[0]], nodes, seconds)


def _edges(site: SiteProfile, name: str) -> set[tuple[int, int]]:
    """(nodes, walltime s) at the edges of every bin of the queue (and of its execution queues): the first and last
    node count of a bin and one outside, the limit and a minute over, the minimum and a minute under."""
    queue = site.queues[name]
    points = set()
    for q in [queue, *(site.queues[t] for t in queue.routes_to)]:
        shortest = parse_walltime(q.min_walltime) if q.min_walltime else 60
        for lo, hi, limit in _bins(q):
            for nodes in {lo - 1, lo, hi, hi + 1} - {0}:
                for seconds in {limit, limit + 60, shortest, shortest - 60} - {0}:
                    points.add((nodes, seconds))
    return points


@pytest.mark.parametrize("site_name", CLUSTER_SITES)
def test_every_bin_of_every_queue_at_its_edges(site_name: str) -> None:
    """For each queue a user may submit to: the last node count and walltime each bin allows are accepted, the first
    beyond is refused with one line naming the rule (its limit), its source and a fix."""
    site = load_site(site_name)
    wrong, checked = [], 0
    for name, queue in site.queues.items():
        if not queue.direct_submit:
            continue
        for nodes, seconds in sorted(_edges(site, name)):
            walltime = format_hms(seconds)
            landed, why = _expected(site, name, nodes, seconds)
            checked += 1
            try:
                choice = choose_queue(site, name, queue, nodes, walltime)
            except FitError as exc:
                text = str(exc)
                if why is None:
                    wrong.append(f"{name} {nodes} nodes {walltime}: refused ({text}), expected {landed}")
                elif why not in text or "\n" in text or "(" not in text or exc.hint is None:
                    wrong.append(f"{name} {nodes} nodes {walltime}: {text!r} should name {why!r} and a source")
                continue
            if why is not None:
                wrong.append(f"{name} {nodes} nodes {walltime}: accepted in {choice.execution_queue}, expected {why}")
            elif choice.execution_queue != landed:
                wrong.append(f"{name} {nodes} nodes {walltime}: lands in {choice.execution_queue}, expected {landed}")
    assert checked and not wrong, "\n".join(wrong)


@pytest.mark.parametrize("site_name", CLUSTER_SITES)
def test_each_rule_names_where_it_comes_from(site_name: str) -> None:
    """A refusal cites the rule's source: the page, or 'guessed' for what the profile lists under guessed:."""
    site = load_site(site_name)
    for name, queue in site.queues.items():
        for rule in queue.set_rules():
            source = site.rule_source(name, rule)
            assert source and (queue.source or rule in queue.sources or "guessed" in source), (name, rule)


def test_an_execution_queue_behind_a_routing_queue_is_not_submitted_to() -> None:
    site = load_site("polaris")
    with pytest.raises(FitError, match="takes jobs only through the routing queue 'prod'.*set resources.queue: prod"):
        choose_queue(site, "small", site.queues["small"], 10, "01:00:00")


# ---------------------------------------------------------------------------------------------------------
# What the issue measured, by hand


@pytest.mark.parametrize("site_name,queue,nodes,walltime,words", [
    ("frontier", "batch", 16, "12:00:00", ["16 nodes for 12:00:00", "at most 02:00:00 from 1 to 91 nodes",
                                          "ask for 184 nodes or at most 02:00:00"]),
    ("frontier", "batch", 16, "06:00:00", ["at most 02:00:00", "ask for 92 nodes or at most 02:00:00"]),
    ("polaris", "prod", 10, "24:00:00", ["'prod' sends 10 nodes to 'small'", "(03:00:00)"]),
    ("theta", "default", 128, "06:00:00", ["128 nodes for 06:00:00", "at most 03:00:00"]),
])
def test_the_jobs_the_issue_found_are_refused(site_name: str, queue: str, nodes: int, walltime: str,
                                              words: list[str]) -> None:
    site = load_site(site_name)
    with pytest.raises(FitError) as err:
        choose_queue(site, queue, site.queues[queue], nodes, walltime)
    text = str(err.value)
    assert all(w in text for w in words), text
    assert site.queues[queue].source is not None and site.rule_source(queue, "max_walltime") in text or \
        any(site.rule_source(t, "max_walltime") in text for t in site.queues[queue].routes_to), text


def test_validate_refuses_the_shipped_theta_job_in_one_line() -> None:
    """`hpctrain jobs validate jobs/ffn-theta.yaml --site theta` said ok for 128 nodes x 6 h."""
    done = cli("jobs", "validate", "jobs/ffn-theta.yaml", "--site", "theta", "--nodes", "128", "--walltime", "06:00:00")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "resources.walltime" in lines[0] and "at most 03:00:00" in lines[0], done.stderr
    assert "Job and Queue Scheduling for Theta" in lines[0]


def test_validate_says_which_execution_queue_it_chose() -> None:
    done = cli("jobs", "validate", "jobs/ffn-polaris.yaml", "--site", "polaris", "--set", "resources.queue=prod",
               "--nodes", "30", "--walltime", "05:00:00", "--set", "resources.account=proj")
    assert done.returncode == 0, done.stderr
    assert "hpctrain: note: queue 'prod' of site 'polaris' routes 30 nodes for 05:00:00 to its execution queue " \
           "'medium'" in done.stderr


# ---------------------------------------------------------------------------------------------------------
# Requeue only where the queue allows it


@pytest.mark.processes
def test_frontier_debug_renders_no_requeue_and_validate_says_so() -> None:
    """Frontier prohibits job chaining in the debug QOS: no --requeue, no scontrol requeue; the job still stops at
    its checkpoint and says how to resume."""
    site = load_site("frontier")
    assert requeue_rule(site, ["debug"])[0] is False and requeue_rule(site, ["batch"])[0] is True
    done = cli("render", "jobs/ffn-frontier.yaml", "--site", "frontier", "--set", "resources.queue=debug",
               "--set", "resources.account=proj", "--walltime", "01:00:00")
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "#SBATCH --requeue" not in script and "scontrol requeue" not in script
    assert "#SBATCH --signal=B:" in script  # the checkpoint on the walltime warning stays
    assert "# no requeue: queue 'debug' of site 'frontier' forbids job chaining" in script
    assert "stopped at its checkpoint; no requeue:" in script and "hpctrain resume RUN" in script
    batch = cli("render", "jobs/ffn-frontier.yaml", "--site", "frontier", "--set", "resources.account=proj",
                "--walltime", "01:00:00")
    assert "#SBATCH --requeue" in batch.stdout and "scontrol requeue" in batch.stdout
    validate = cli("jobs", "validate", "jobs/ffn-frontier.yaml", "--site", "frontier", "--set",
                   "resources.queue=debug", "--set", "resources.account=proj", "--walltime", "01:00:00")
    assert validate.returncode == 0 and "hpctrain: note: no requeue: queue 'debug'" in validate.stderr


def test_one_queued_job_per_user_renders_no_resubmission() -> None:
    """Polaris' debug-scaling takes one queued job per user: the running job's qsub of its successor would be
    refused, so none is rendered."""
    site = load_site("polaris")
    assert site.queues["debug-scaling"].max_queued_per_user == 1
    done = cli("render", "jobs/ffn-polaris.yaml", "--site", "polaris", "--set", "resources.queue=debug-scaling",
               "--set", "resources.account=proj", "--nodes", "4", "--walltime", "00:30:00")
    assert done.returncode == 0, done.stderr
    assert "qsub -W depend=afterany" not in done.stdout and "one queued job per user" in done.stdout


# ---------------------------------------------------------------------------------------------------------
# The schema


SITE = """\
name: s
scheduler: pbs
launcher: mpiexec
node: {cores: 4, memory_gb: 8}
default_queue: q
queues:
"""


@pytest.mark.parametrize("queues,words", [
    ("  q:\n    max_nodes: 10\n    max_walltime: '06:00:00'\n    source: page\n    walltime_by_nodes:\n"
     "      - {min_nodes: 1, max_nodes: 4, max_walltime: '01:00:00'}\n"
     "      - {min_nodes: 6, max_nodes: 10, max_walltime: '06:00:00'}\n", "sorted and contiguous"),
    ("  q:\n    max_nodes: 10\n    max_walltime: '06:00:00'\n    source: page\n    walltime_by_nodes:\n"
     "      - {min_nodes: 1, max_nodes: 8, max_walltime: '01:00:00'}\n", "must end at max_nodes 10"),
    ("  q:\n    max_nodes: 10\n    max_walltime: '01:00:00'\n    source: page\n    walltime_by_nodes:\n"
     "      - {min_nodes: 1, max_nodes: 10, max_walltime: '02:00:00'}\n", "above the queue's max_walltime"),
    ("  q:\n    max_nodes: 10\n    max_walltime: '01:00:00'\n    max_queued_per_user: 1\n", "needs its source"),
    ("  q:\n    max_nodes: 10\n    max_walltime: '01:00:00'\n    routes_to: [r]\n    source: page\n",
     "'r' is not one of the queues"),
    ("  q:\n    max_nodes: 10\n    max_walltime: '01:00:00'\n    direct_submit: false\n    source: page\n",
     "make that queue the default"),
    ("  q:\n    max_nodes: 10\n    max_walltime: '01:00:00'\n    sources: {max_wall: page}\n", "not a queue rule"),
])
def test_a_policy_that_cannot_hold_is_refused_at_its_line(tmp_path: Path, queues: str, words: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SITE + queues)
    with pytest.raises(ConfigError, match=words) as err:
        load_site_file(path)
    assert str(path) in str(err.value)


def test_guessed_is_a_source() -> None:
    text = SITE + "  q:\n    max_nodes: 10\n    max_walltime: '01:00:00'\n    max_queued_per_user: 1\n"
    site = SiteProfile.model_validate({**yaml.safe_load(text), "guessed": ["queues.q.max_queued_per_user"]})
    assert site.rule_source("q", "max_queued_per_user") == "guessed in site profile 's'"
    assert requeue_rule(site, ["q"]) == (False, "queue 'q' of site 's' takes one queued job per user, so the job "
                                         "cannot queue its successor (guessed in site profile 's')")


def test_plan_warns_where_the_queue_refuses_the_size() -> None:
    done = cli("plan", "jobs/ffn-frontier.yaml", "--site", "frontier", "--nodes", "64,128", "--set",
               "resources.walltime=05:00:00", "--set", "compute_s=0.5", "--set", "compute_std_s=0.01", "--set",
               "grad_bytes=1e6", "--json")
    assert done.returncode == 0, done.stderr
    predictions = {p["nodes"]: p for p in json.loads(done.stdout)["predictions"]}
    assert any("the queue refuses this size" in w and "at most 02:00:00" in w for w in predictions[64]["warnings"])
    assert not any("the queue refuses" in w for w in predictions[128]["warnings"])



def test_an_array_larger_than_the_queued_jobs_limit_is_refused_before_anything_is_written(tmp_path: Path,
                                                                                           tiny_job: TinyJob) -> None:
    from hpctrain.submission.api import submit_runs

    site = tmp_path / "limited.yaml"
    site.write_text("extends: ci-slurm\nname: limited\nqueues:\n  debug:\n    max_queued_per_user: 2\n"
                    "    source: the test's own rule\n")
    job = tiny_job(checkpoint=None)
    with pytest.raises(FitError, match=r"an array of 3 tasks, but queue 'debug' of site 'limited' takes at most 2 "
                                       r"queued jobs per user \(the test's own rule\)"):
        submit_runs(job, str(site), array="train.lr=0.1,0.2,0.3", run_root=str(tmp_path / "runs"), dry_run=True)
    assert not (tmp_path / "runs").exists()
