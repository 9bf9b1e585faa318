"""The cluster of namespace nodes itself (scripts/ci/cluster.sh): every node is a host of its own to what runs on
it — hostname, address, /tmp, scratch, name resolution — Slurm places a job's tasks on several of them, and the
controls the other cluster tests use do what they say: a rate limit limits, a cut link cuts, a killed node goes
DOWN in Slurm and a booted one comes back with empty local disks.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster_support import CLUSTER_SH, Cluster, cluster_sh, node_state, srun

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

# Measures what one TCP stream moves between two nodes in ~2 s (standard library only: it runs on the nodes with
# this interpreter, whose site-packages it does not need).
STREAM = """
import socket, sys, time
if sys.argv[1] == "serve":
    server = socket.create_server(("0.0.0.0", int(sys.argv[2])))
    print("ready", flush=True)
    conn, _ = server.accept()
    while conn.recv(1 << 20):
        pass
else:
    conn = socket.create_connection((sys.argv[3], int(sys.argv[2])), timeout=10)
    block, sent, start = b"x" * (1 << 20), 0, time.monotonic()
    while time.monotonic() - start < 2:
        conn.sendall(block)
        sent += len(block)
    conn.close()
    print(sent * 8 / (time.monotonic() - start) / 1e6)
"""


def test_srun_places_tasks_on_nodes_that_are_hosts_of_their_own(cluster: Cluster, cluster_tmp: Path) -> None:
    script = ("touch /tmp/mark-$SLURM_JOB_ID-$(hostname); echo $(hostname) $SLURM_NODEID"
              " $(getent hosts $(hostname) | head -n1 | cut -d' ' -f1) $(cd /tmp && ls -d mark-$SLURM_JOB_ID-*)")
    # These four by name: Slurm would otherwise pass over a node still finishing an earlier test's job.
    out = srun(cluster, ["bash", "-c", script], nodes=4, cwd=cluster_tmp,
               options=[f"--nodelist={','.join(cluster.nodes[:4])}"])
    assert out.returncode == 0, out.stderr
    rows = sorted(line.split() for line in out.stdout.splitlines())
    assert [(host, int(nodeid)) for host, nodeid, *_ in rows] == list(zip(cluster.nodes[:4], range(4), strict=True))
    # Each node resolves its own name to loopback first (as Debian's /etc/hosts does): "my address" is not
    # what the other nodes reach.
    assert [address for _, _, address, _ in rows] == ["127.0.1.1"] * 4, out.stdout
    # Each /tmp holds only its own node's mark, the host's /tmp none of them.
    job = rows[0][3].split("-")[1]
    assert [marks for *_, marks in rows] == [f"mark-{job}-{node}" for node in cluster.nodes[:4]], out.stdout
    assert not list(Path("/tmp").glob(f"mark-{job}-*"))
    for node in cluster.nodes[:4]:
        assert [p.name for p in cluster.local_path(node, "/tmp").glob(f"mark-{job}-*")] == [f"mark-{job}-{node}"]


def test_a_file_on_one_node_is_invisible_to_the_others_and_to_the_host(cluster: Cluster) -> None:
    a, b = cluster.nodes[:2]
    token = f"only-on-{a}"
    for where in ("/tmp", cluster.scratch, "/dev/shm"):
        assert cluster.run(a, "sh", "-c", f"echo {token} > {where}/probe").returncode == 0
        seen = cluster.run(b, "cat", f"{where}/probe")
        assert seen.returncode != 0 and token not in seen.stdout, (where, seen.stdout)
        assert not (Path(where) / "probe").exists() or token not in (Path(where) / "probe").read_text()
        assert cluster.run(a, "rm", f"{where}/probe").returncode == 0


def test_names_resolve_on_every_node_and_a_missing_name_fails_at_once(cluster: Cluster) -> None:
    head = socket.gethostname()
    names = [head, *cluster.nodes]
    for node in cluster.nodes:
        # the first address of each name, as a program asking the resolver for one gets it
        out = cluster.run(node, "sh", "-c", 'for n in "$@"; do getent hosts "$n" | head -n1; done', "-", *names)
        first = dict(reversed(line.split()) for line in out.stdout.splitlines())
        expected = {head: "10.251.0.1"} | {other: f"10.251.0.{10 + i}" for i, other in enumerate(cluster.nodes, 1)}
        expected[node] = "127.0.1.1"  # the node itself by loopback first, the others by their bridge addresses
        assert first == expected, out.stdout
        missing = cluster.run(node, "getent", "hosts", "no-such-host.invalid", timeout=15)
        assert missing.returncode == 2


def test_a_start_binds_the_new_hosts_file_on_a_node_already_up(cluster: Cluster, cluster_tmp: Path) -> None:
    """A node keeps the hosts file it booted with bound on /etc/hosts (the inode, not the name): a start that
    writes a new one (more nodes than were running) must bind it there too, or the running nodes cannot resolve
    the added ones. Here the node's view is made stale by hand, as a start of fewer nodes leaves it."""
    node, added = cluster.nodes[0], cluster.nodes[-1]
    written = (cluster.directory / node / "hosts").read_text()
    stale = cluster_tmp / "hosts-without-the-last-node"
    stale.write_text("".join(line + "\n" for line in written.splitlines() if not line.endswith(f" {added}")))
    bound = cluster.run(node, "sh", "-c", 'umount /etc/hosts && mount --bind "$1" /etc/hosts', "-", str(stale))
    assert bound.returncode == 0, bound.stderr
    assert cluster.run(node, "getent", "hosts", added, timeout=15).returncode == 2  # the stale view
    started = cluster_sh("start", "--nodes", str(len(cluster.nodes)), timeout=300)
    assert started.returncode == 0, started.stderr
    seen = cluster.run(node, "getent", "hosts", added, timeout=15)
    assert seen.stdout.split()[:2] == [cluster.address(added), added], seen.stdout + seen.stderr
    assert cluster.run(node, "cat", "/etc/hosts").stdout == written


def test_a_rate_limit_limits_and_a_cut_link_cuts(cluster: Cluster, cluster_tmp: Path) -> None:
    a, b = cluster.nodes[:2]
    script = cluster_tmp / "stream.py"
    script.write_text(STREAM)

    def measure(port: int) -> float:
        server = subprocess.Popen(["bash", str(CLUSTER_SH), "exec", a, sys.executable, str(script), "serve", str(port)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            out = cluster.run(b, sys.executable, str(script), "send", str(port), a)
            assert out.returncode == 0, out.stderr
            return float(out.stdout)
        finally:
            server.kill()
            server.wait()

    free = measure(5301)
    cluster.link(b, "rate", "50mbit")
    limited = measure(5302)
    # htb holds the stream at the rate (with a burst at its start); the free link moves far more.
    assert 25 < limited < 75, limited
    assert free > 4 * limited, (free, limited)
    cluster.link(b, "cut")
    probe = f"import socket; socket.create_connection(('{a}', 6818), timeout=3)"
    cut = cluster.run(b, sys.executable, "-c", probe, timeout=30)
    assert cut.returncode != 0 and "timed out" in cut.stderr, cut.stderr
    cluster.link(b, "restore")
    assert cluster.run(b, sys.executable, "-c", probe, timeout=30).returncode == 0


def test_a_killed_node_goes_down_in_slurm_and_boots_with_empty_local_disks(cluster: Cluster) -> None:
    node = cluster.nodes[-1]
    assert cluster.run(node, "touch", "/tmp/before-kill").returncode == 0
    cluster.kill(node)
    assert cluster_sh("exec", node, "true").returncode != 0  # nothing left to enter
    assert node_state(node).startswith(("idle", "down"))
    # SlurmdTimeout is 30 s: a hang guard well above it, not a speed check.
    assert cluster.wait_for_node(node, ["down"], timeout=240).startswith("down")
    cluster.boot(node)
    assert node_state(node).startswith("idle")
    assert cluster.run(node, "ls", "-A", "/tmp").stdout == ""
    assert cluster.run(node, "hostname").stdout.strip() == node


def test_controls_refuse_what_they_cannot_do() -> None:
    for args, message in ((["link", "node99", "cut"], "no node 'node99'"),
                          (["link", "node01", "rate", "fast"], "give a rate as tc reads it"),
                          (["node", "node01", "reboot"], "usage: cluster.sh node NODE kill|start"),
                          (["start", "--nodes", "0"], "--nodes must be 1 ... 99")):
        out = cluster_sh(*args, timeout=30)
        assert out.returncode != 0 and message in out.stderr, (args, out.stderr)
