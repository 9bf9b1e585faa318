"""Rendezvous and collectives across real nodes (the cluster of namespace nodes, srun): MPI through PMI-2, gloo
bootstrapped over MPI, and gloo meeting at a store on the first node of Slurm's node list. Each node resolves its
own name to 127.0.1.1 first, as Debian's /etc/hosts does; gloo left to itself binds to that address and tells the
other nodes to connect there (the control below shows it failing), so hpctrain's ranks must announce the interface
that reaches the other nodes instead.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.cluster_support import Cluster, srun

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "mp_helpers" / "comm_worker.py")
# What a torch.distributed script does when nobody chose an interface: gloo takes the hostname's first address.
PLAIN_GLOO = """
import datetime, os, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://{master}:{port}", rank=int(os.environ["SLURM_PROCID"]),
                        world_size=int(os.environ["SLURM_NTASKS"]), timeout=datetime.timedelta(seconds=15))
print("connected", flush=True)
"""


@pytest.mark.parametrize(("backend", "mpi"), [("mpi", "pmi2"), ("gloo", "pmi2"), ("gloo", "none")],
                         ids=["mpi", "gloo-over-mpi", "gloo-store-on-first-node"])
def test_collectives_across_two_nodes(cluster: Cluster, cluster_tmp: Path, backend: str, mpi: str) -> None:
    out = srun(cluster, [sys.executable, WORKER, "collectives", backend], nodes=2, per_node=2, cwd=cluster_tmp,
               options=[f"--mpi={mpi}"], timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    placed = sorted(re.findall(rf"rank (\d+)/4 {backend} collectives OK on (\S+)", out.stdout))
    # Slurm picks any two idle nodes (one still finishing an earlier job is passed over): two distinct nodes of
    # the cluster, ranks 0-1 on the first and 2-3 on the second (srun's block distribution).
    assert len(placed) == 4, text[-3000:]
    a, b = placed[0][1], placed[2][1]
    assert a != b and {a, b} <= set(cluster.nodes), text[-3000:]
    assert placed == [("0", a), ("1", a), ("2", b), ("3", b)], text[-3000:]
    if backend == "gloo":
        # one line per node (its local rank 0): the interface it announces and the address other nodes reach
        announced = sorted(re.findall(r"gloo uses (\w+) \((\S+)\): (\S+) resolves first to 127\.0\.1\.1", text))
        assert announced == sorted([("eth0", cluster.address(a), a), ("eth0", cluster.address(b), b)]), text[-3000:]


def test_the_mpich_wheel_across_nodes_keeps_each_pmi_request_within_slurms_single_read(
        cluster: Cluster, cluster_tmp: Path) -> None:
    """Slurm's mpi/pmi2 plugin reads a PMI-1 request with one read() of at most 1,024 bytes. The wheel's MPICH
    left to UCX puts a ~4.5 KiB address in segment lines of up to ~1,080 bytes: one that does not compress
    overflows the read and MPI_Init waits for ever (seen in CI). hpctrain starts the wheel over libfabric's tcp
    provider instead; the control (UCX, as a user may choose) shows the relay sees the segments."""
    relay = str(REPO / "tests" / "mp_helpers" / "pmi_relay.py")
    longest: dict[str, int] = {}
    for case, extra in (("hpctrain", {}), ("ucx", {"MPICH_CH4_NETMOD": "ucx"})):
        out_dir = cluster_tmp / case
        out_dir.mkdir()
        out = srun(cluster, [sys.executable, relay, str(out_dir), sys.executable, WORKER, "transport", str(out_dir)],
                   nodes=2, per_node=2, cwd=cluster_tmp, options=["--mpi=pmi2"], timeout=600,
                   env={**os.environ, **extra})
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-4000:]
        ranks = [json.loads((out_dir / f"rank-{r}.json").read_text()) for r in range(4)]
        requests = [json.loads((out_dir / f"pmi-{r}.json").read_text()) for r in range(4)]
        assert all(r["sum"] == [4.0] * 3 for r in ranks), ranks
        assert all(q["requests"] > 5 for q in requests), requests  # the relay saw each rank's PMI traffic
        longest[case] = max(q["longest"] for q in requests)
        if case == "hpctrain":
            assert all(r["set"] == {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": None}
                       and r["ucx_transports"] == [] for r in ranks), ranks
            assert not any(q["segments"] for q in requests) and longest[case] < 200, requests
        else:
            assert any(q["segments"] for q in requests) and all(r["ucx_transports"] for r in ranks), requests
    assert longest["ucx"] > 2 * longest["hpctrain"], longest


def test_a_plain_gloo_script_fails_across_these_nodes(cluster: Cluster, cluster_tmp: Path) -> None:
    """The control: without an interface chosen, rank 1 is told to connect to node01's loopback."""
    script = cluster_tmp / "plain.py"
    script.write_text(PLAIN_GLOO.format(master=cluster.nodes[0], port=29517))
    out = srun(cluster, [sys.executable, str(script)], nodes=2, cwd=cluster_tmp,
               options=["--mpi=none", f"--nodelist={cluster.nodes[0]},{cluster.nodes[1]}"], timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "connected" not in out.stdout, text[-3000:]
    assert "127.0.1.1" in text, text[-3000:]
