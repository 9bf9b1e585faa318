"""A run submitted from the "laptop" through the loopback login node (fixture ``sshd``) to the cluster of namespace
nodes (fixtures ``cluster``, ``cluster_tmp``), followed with the CLI from fresh processes: ``hpctrain status`` sees
it running on the cluster, ``hpctrain logs --rank 3`` prints the log rank 3 wrote on the fourth node, and
``hpctrain cancel`` ends it: Slurm records CANCELLED and no rank process (nor the job's step daemon) is left on any
node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_support import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.sshd, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parent.parent
RANKS = 4
# Each rank writes its own rank-N.log in the run directory (the job's working directory), where `hpctrain logs
# --rank N` reads it, then becomes a process named after the test (exec -a) that waits to be cancelled: the
# name finds the ranks, the PID in the log says which one each is.
RANK_SCRIPT = ('echo "rank $SLURM_PROCID of $SLURM_NTASKS on $(hostname) pid $$" > "rank-$SLURM_PROCID.log"; '
               'exec -a "$0" sleep 600')
RANK_LINE = re.compile(r"^rank (\d+) of (\d+) on (\S+) pid (\d+)$", re.MULTILINE)


def cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``hpctrain ARGS`` in a fresh process in ``directory``, with the registry under it."""
    environ = {**os.environ, "HPCTRAIN_HOME": str(directory / "home"), "PYTHONPATH": str(REPO)}
    environ.pop("HPCTRAIN_REGISTRY", None)
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=directory, env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def processes_on(cluster: Cluster, node: str, pattern: str) -> list[int]:
    """PIDs of the processes on ``node`` whose command line matches ``pattern`` (``pgrep -f``; anchor it with ^ so
    that the command asking does not match itself). The nodes share the host's PID space: a process is on the node
    whose UTS namespace (hostname) it has."""
    script = ('me=$(readlink /proc/self/ns/uts); for p in $(pgrep -f -- "$1"); do '
              '[ "$(readlink "/proc/$p/ns/uts" 2>/dev/null)" = "$me" ] && echo "$p"; done; exit 0')
    out = cluster.run(node, "sh", "-c", script, "sh", pattern)
    assert out.returncode == 0, out.stderr
    return sorted(int(pid) for pid in out.stdout.split())


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check()`` until it is true: a hang guard, not a speed check."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.5)


def test_submit_over_ssh_to_four_nodes_then_status_rank_log_and_cancel(cluster: Cluster, cluster_tmp: Path,
                                                                       sshd: Any, slurm: Any) -> None:
    nodes = cluster.nodes[:RANKS]
    # Pinned to the first four nodes so that rank 3 runs on the fourth (block distribution, one rank a node);
    # the job waits if another developer's job holds one of them. No node check: the ranks are a shell script
    # and ci-cluster's interpreter over ssh (python3, no venv) has no hpctrain to run one.
    (cluster_tmp / "remote4.yaml").write_text(f"""name: remote4
model: resnet
train: {{steps: 2, batch_per_rank: 2, lr: 0.01}}
resources: {{nodes: {RANKS}, ranks_per_node: 1, walltime: "00:10:00", node_check: false,
            directives: {{nodelist: "{','.join(nodes)}"}}}}
checkpoint: {{signal_lead_s: 10}}
""")
    marker = f"hpctrain-rank-{uuid.uuid4().hex[:12]}"
    submitted = cli(cluster_tmp, "submit", "remote4.yaml", "--site", "ci-cluster", "--remote", sshd.host,
                    "--ssh-config", str(sshd.config), "--run-root", str(cluster_tmp / "runs"),
                    "--command", shlex.join(["bash", "-c", RANK_SCRIPT, marker]))
    assert submitted.returncode == 0, submitted.stderr
    run_id, job_id = submitted.stdout.splitlines()[0].split()
    cancelled = False
    try:
        slurm.wait_for_state(job_id, ["RUNNING"], timeout=900)  # may queue behind other developers' jobs
        (view,) = json.loads(cli(cluster_tmp, "status", run_id, "--json").stdout)
        assert (view["state"], view["site"], view["remote"], view["job_id"]) == (
            "running", "ci-cluster", sshd.host, job_id), view
        table = cli(cluster_tmp, "status", run_id).stdout
        assert re.search(rf"^{run_id}\s+ci-cluster@{re.escape(sshd.host)}\s+{job_id}\s+RUNNING\b", table, re.M), table

        run_dir = Path(view["run_dir"])
        logs = [run_dir / f"rank-{rank}.log" for rank in range(RANKS)]
        wait_until("every rank wrote its log",
                   lambda: all(log.exists() and RANK_LINE.search(log.read_text()) for log in logs), timeout=120)
        ranks = {}
        for rank in range(RANKS):
            out = cli(cluster_tmp, "logs", run_id, "--rank", str(rank))
            assert out.returncode == 0, out.stderr
            (line,) = RANK_LINE.findall(out.stdout)
            assert (int(line[0]), int(line[1])) == (rank, RANKS), out.stdout  # one job of 4 tasks
            ranks[rank] = (line[2], int(line[3]))
        assert ranks[3][0] == nodes[3] == "node04"
        # Four hosts, one rank each: a job that fell back to one node would show one hostname four times.
        assert [host for host, _ in ranks.values()] == list(nodes), ranks
        stepd = rf"^slurmstepd: \[{job_id}\."  # the job's step daemons: [ID.batch] on the first node, [ID.0] on each
        for rank, (host, pid) in ranks.items():
            assert processes_on(cluster, host, f"^{marker}") == [pid], (rank, host)
            assert processes_on(cluster, host, stepd), host

        out = cli(cluster_tmp, "cancel", run_id)
        assert out.returncode == 0 and f"{run_id} cancelled job {job_id}" in out.stdout, out.stdout + out.stderr
        cancelled = True
        slurm.wait_for_state(job_id, ["CANCELLED"], timeout=120)
        (view,) = json.loads(cli(cluster_tmp, "status", run_id, "--json").stdout)
        assert view["state"] == "cancelled", view
        assert re.search(rf"^{run_id}\s.*\bCANCELLED\b", cli(cluster_tmp, "status", run_id).stdout, re.M)

        # Every rank and every step daemon of the job gone, on each of its nodes (Slurm's KillWait is the grace
        # time between SIGTERM and SIGKILL: a hang guard well above it) ...
        wait_until("the job's processes ended on every node", lambda: not any(
            processes_on(cluster, node, pattern) for node in nodes for pattern in (f"^{marker}", stepd)), timeout=120)
        # ... and anywhere else on the machine (the PID space is shared; the batch shell's srun names the marker)
        assert subprocess.run(["pgrep", "-f", f"[{marker[0]}]{marker[1:]}"], capture_output=True).returncode == 1
    finally:
        if not cancelled:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
