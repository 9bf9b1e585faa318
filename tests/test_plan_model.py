"""The planner's model, term by term, against cases computed by hand (plain arithmetic in each test)."""

from __future__ import annotations

import math

import pytest

from hpctrain.errors import ConfigError
from hpctrain.planning import collectives as c
from hpctrain.planning.advice import annotate, batch_advice, lr_rule
from hpctrain.planning.model import (
    BucketTiming,
    Workload,
    even_buckets,
    predict,
    reduction_time,
    startup_time,
    step_cost,
    time_to_target,
)
from hpctrain.planning.parameters import SPECS, Param, Parameters, apply_sets, check_value, parse_assignment
from hpctrain.planning.stragglers import expected_max_standard_normal, straggler_delay

LINK = c.Link(alpha=1e-6, beta=1e-9, gamma=1e-10)

BASE = {
    "compute_s": 1.0, "compute_std_s": 0.0, "overlap_window_s": 0.0, "input_s": 0.0, "input_std_s": 0.0,
    "startup_s": 0.0, "grad_bytes": 1e6, "adacomp_ratio": 0.02, "calibration_ranks_per_node": 1,
    "ranks_per_node": 1, "threads_per_rank": 1, "batch_per_rank": 4, "bucket_mb": 4.0, "combiner": "mean",
    "compression": "none", "dasgd_period": 1, "dasgd_delay": 0, "walltime_s": 1e9, "backend": "mpi",
    "node_threads": 8, "background_load": 0.0, "latency_us": 1.0, "nics_per_node": 1, "nic_gbps": 1.0,
    "intra_latency_us": 1.0, "all_core_speed": 1.0, "shared_core_latency_us": 0.0, "rank_speed_spread": 0.0,
    "intra_bandwidth_gbps": 1.0, "reduce_gbps": 10.0, "filesystem_gbps": 100.0, "metadata_ops_per_s": 1000.0,
    "reduction_overlap": True, "input_overlap": False, "input_sharding": "shard", "startup_staged": False,
    "multinode_overhead_s": 0.0, "launch_overhead_s": 0.0, "control_allreduces": 0.0, "half_gamma_factor": 4.0,
    "record_s": 0.0,
    "input_bytes": 0.0, "stream_bytes": 0.0, "env_files": 0.0, "env_bytes": 0.0,
    "allreduce_algorithm": "auto", "fusion_cycle_s": 0.0, "taper_nodes": 0, "taper": 1.0, "hiccup_prob": 0.0,
    "hiccup_s": 0.0,
    "slow_node_fraction": 0.0, "slow_node_slowdown": 0.0, "checkpoint_every_steps": 100, "checkpoint_bytes": 0.0,
}


def params(**changes: object) -> Parameters:
    values = {**BASE, **changes}
    return Parameters({k: Param(k, v, "assumed", "test") for k, v in values.items()})  # type: ignore[arg-type]


def one_bucket(p: Parameters, nbytes: float = 1e6) -> Workload:
    return Workload(p, (BucketTiming(nbytes, 0.0),))


# --- collectives ------------------------------------------------------------------------------------------


def test_ring_allreduce_by_hand() -> None:
    # 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma, p = 4, n = 1 MB
    assert c.ring_allreduce(4, 1e6, LINK) == pytest.approx(6e-6 + 1.5e-3 + 7.5e-5)


def test_rabenseifner_power_of_two_and_folded() -> None:
    assert c.rabenseifner_allreduce(8, 1e6, LINK) == pytest.approx(6e-6 + 2 * 0.875e-3 + 0.875e-4)
    # 6 ranks: 2 extra ranks fold into 4 (before: send n and reduce it, after: send the result back)
    fold = 2 * (1e-6 + 1e-3) + 1e-4
    assert c.rabenseifner_allreduce(6, 1e6, LINK) == pytest.approx(fold + 4e-6 + 1.5e-3 + 0.75e-4)


def test_recursive_doubling_and_tree_by_hand() -> None:
    assert c.recursive_doubling_allreduce(4, 1000, LINK) == pytest.approx(2 * (1e-6 + 1000 * 1.1e-9))
    assert c.tree_allreduce(5, 1e6, LINK) == pytest.approx(6e-6 + 2e-3 + 1e-4)


def test_backends_choose_as_their_libraries_do() -> None:
    assert c.allreduce("mpi", 4, 2048, LINK)[1] == "recursive doubling"  # MPICH: <= 2048 bytes
    assert c.allreduce("mpi", 4, 2049, LINK)[1] == "reduce-scatter + allgather"
    assert c.allreduce("gloo", 4, 10, LINK)[1] == "recursive doubling"  # hpctrain's p2p all-reduce
    assert c.allreduce("gloo", 4, 2048, LINK)[1] == "reduce-scatter + allgather"  # from 2048 bytes on
    assert c.allreduce("gloo", 4, 2048, LINK, "ring")[1] == "ring"  # gloo's own ring, forced
    slow_latency = c.Link(alpha=1e-3, beta=1e-9, gamma=0.0)
    assert c.allreduce("nccl", 64, 1000, slow_latency)[1] == "tree"  # latency-bound: 12 vs 126 alpha
    assert c.allreduce("nccl", 4, 1e9, LINK)[1] == "ring"  # bandwidth-bound: 1.5 n beta < 2 n beta
    assert c.allreduce("mpi", 1, 1e9, LINK) == (0.0, "none")
    assert c.allreduce("xccl", 64, 1000, slow_latency)[1] == "tree"  # oneCCL: modelled as NCCL


def test_allgather_and_adasum_by_hand() -> None:
    assert c.allgather(4, 1000, LINK) == pytest.approx(3 * (1e-6 + 1e-6))
    assert c.adasum_exchange(4, 1e6, LINK) == pytest.approx(2 * (1e-6 + 1e-3 + 3e-4))
    # 3 ranks: allgather of whole vectors, then two Adasum combinations of three passes each
    assert c.adasum_exchange(3, 1e6, LINK) == pytest.approx(2 * (1e-6 + 1e-3) + 2 * 3e-4)


# --- stragglers -----------------------------------------------------------------------------------------------


def test_expected_maximum_of_normals_matches_closed_forms_and_tables() -> None:
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)
    assert expected_max_standard_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-9)
    # Tabulated expected maxima of normal samples (Harter 1961): n = 10, 100
    assert expected_max_standard_normal(10) == pytest.approx(1.53875, abs=1e-4)
    assert expected_max_standard_normal(100) == pytest.approx(2.50759, abs=1e-4)
    assert straggler_delay(0.1, 2) == pytest.approx(0.1 / math.sqrt(math.pi), abs=1e-9)
    assert straggler_delay(0.1, 1) == 0.0


# --- the step model ---------------------------------------------------------------------------------------


def test_compute_and_straggler_terms() -> None:
    w = one_bucket(params(compute_std_s=0.1, intra_latency_us=0.001, intra_bandwidth_gbps=1e6))
    cost = step_cost(w, 1, 2)
    assert cost.terms["compute"] == 1.0 and cost.terms["oversubscription"] == 0.0
    assert cost.terms["straggler"] == pytest.approx(0.1 / math.sqrt(math.pi), abs=1e-9)


def test_input_spread_counts_only_when_reading_is_not_overlapped() -> None:
    p = params(compute_std_s=0.3, input_s=0.2, input_std_s=0.4)
    plain = step_cost(one_bucket(p), 1, 2)
    assert plain.terms["straggler"] == pytest.approx(0.5 / math.sqrt(math.pi), abs=1e-9)  # sqrt(0.3^2 + 0.4^2)
    assert plain.terms["input"] == 0.2
    hidden = step_cost(one_bucket(p.set_value("input_overlap", True, "set", "t")), 1, 2)
    assert hidden.terms["straggler"] == pytest.approx(0.3 / math.sqrt(math.pi), abs=1e-9)
    assert hidden.terms["input"] == 0.0  # 0.2 s of reading behind 1 s of compute


def test_oversubscribed_ranks_share_the_node() -> None:
    w = one_bucket(params(node_threads=2))
    cost = step_cost(w, 1, 4)  # 4 ranks x 1 thread on 2 hardware threads: each computes at half speed
    assert cost.terms["oversubscription"] == pytest.approx(1.0)
    assert step_cost(w, 1, 2).terms["oversubscription"] == 0.0
    # other work on the node: 2 more runnable threads; 2 ranks then share 2 threads among 4, one rank among 3
    busy = one_bucket(params(node_threads=2, background_load=2.0))
    assert step_cost(busy, 1, 2).terms["oversubscription"] == pytest.approx(4 / 3 - 1)


def test_a_busier_node_computes_slower_per_thread() -> None:
    # 8 hardware threads, all_core_speed 0.8: 1/0.8 = 1.25x slower with all 8 busy, linear from 1 busy thread
    w = one_bucket(params(all_core_speed=0.8))
    assert step_cost(w, 1, 8).terms["oversubscription"] == pytest.approx(0.25)
    assert step_cost(w, 1, 5).terms["oversubscription"] == pytest.approx(0.25 * 4 / 7)
    # calibrated with 2 ranks busy: the compute it measured already carries 1/7 of the slowdown
    cal = one_bucket(params(all_core_speed=0.8, calibration_ranks_per_node=2))
    assert step_cost(cal, 1, 8).terms["oversubscription"] == pytest.approx(1.25 / (1 + 0.25 / 7) - 1)
    assert step_cost(cal, 1, 1).terms["oversubscription"] == pytest.approx(1 / (1 + 0.25 / 7) - 1)
    # beyond all threads busy it is the time-sharing term alone (x2 for 16 ranks on 8 threads) on top
    assert step_cost(w, 1, 16).terms["oversubscription"] == pytest.approx(2 * 1.25 - 1)


def test_ranks_sharing_cores_wait_for_them_in_every_message() -> None:
    # 4 ranks on 2 hardware threads (share 2): each message step (of hpctrain's p2p all-reduce, or of gloo's
    # ring) pays 1 x 500 us more
    p = params(node_threads=2, backend="gloo", shared_core_latency_us=500.0, reduction_overlap=False)
    shared = c.Link(1e-6 + 500e-6, 1e-9, 1e-10)
    assert reduction_time(one_bucket(p), 1, 4, 1.0)[0] == pytest.approx(c.rabenseifner_allreduce(4, 1e6, shared))
    assert reduction_time(one_bucket(p), 1, 2, 1.0)[0] == pytest.approx(c.rabenseifner_allreduce(2, 1e6, LINK))
    ring = p.set_value("allreduce_algorithm", "ring", "set", "t")
    assert reduction_time(one_bucket(ring), 1, 4, 1.0)[0] == pytest.approx(c.ring_allreduce(4, 1e6, shared))


def test_the_ranks_own_speed_spread_adds_to_the_straggler_wait() -> None:
    # per-step noise 0.03 s and ranks 4 % apart on a 1 s step: sqrt(0.03^2 + 0.04^2) = 0.05
    w = one_bucket(params(compute_std_s=0.03, rank_speed_spread=0.04))
    assert step_cost(w, 1, 2).terms["straggler"] == pytest.approx(0.05 / math.sqrt(math.pi), abs=1e-9)
    assert step_cost(w, 1, 1).terms["straggler"] == 0.0


def test_the_stop_vote_is_one_small_allreduce_per_step() -> None:
    p = params(control_allreduces=1.0, launch_overhead_s=20e-6)
    # mpi, 4 ranks, 16 bytes: recursive doubling, 2 rounds of (alpha + 16 (beta + gamma)); plus the launch
    vote = 2 * (1e-6 + 16 * 1.1e-9) + 20e-6
    gradient = reduction_time(one_bucket(p), 1, 4, 1.0)[0]
    assert step_cost(one_bucket(p), 1, 4).terms["reduction"] == pytest.approx(gradient + vote)
    assert step_cost(one_bucket(p), 1, 1).terms["reduction"] == 0.0


def test_fractions_are_checked() -> None:
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match="all_core_speed"):
            apply_sets(params(), [f"all_core_speed={bad}"])
    assert apply_sets(params(), ["all_core_speed=1"]).num("all_core_speed") == 1.0


def test_reduction_pipeline_hides_buckets_ready_early() -> None:
    # intra-node link: alpha 1 us, 1 GB/s, gamma 0.1 ns/B; mpi, 2 ranks: Rabenseifner = 2a + n b + n g / 2
    p = params()
    cost = 2e-6 + 1e6 * 1e-9 + 0.5e6 * 1e-10  # of one 1 MB bucket
    early = Workload(p, (BucketTiming(1e6, 0.5), BucketTiming(1e6, 0.0)))
    exposed, total, _ = reduction_time(early, 1, 2, 1.0)
    assert total == pytest.approx(2 * cost)
    assert exposed == pytest.approx(cost)  # the first finished 0.5 - cost before backward ended
    late = Workload(p, (BucketTiming(1e6, 0.0005), BucketTiming(1e6, 0.0)))
    exposed, _, _ = reduction_time(late, 1, 2, 1.0)
    assert exposed == pytest.approx(cost - 0.0005 + cost)  # the second waits for the first
    serial = Workload(p.set_value("reduction_overlap", False, "set", "t"), early.buckets)
    assert reduction_time(serial, 1, 2, 1.0)[0] == pytest.approx(2 * cost)


def test_several_ranks_per_node_reduce_within_the_node_first() -> None:
    p = params(latency_us=2.0, nic_gbps=4.0, nics_per_node=2, intra_bandwidth_gbps=100.0)
    w = one_bucket(p.set_value("reduction_overlap", False, "set", "t"))
    # 2 nodes x 2 ranks, mpi: reduce-scatter and allgather within the node (ring of 2 over 100 GB/s), then each
    # rank's half (500 kB) all-reduced across the 2 nodes by Rabenseifner, the two ranks sharing the node's 8 GB/s
    within = (1e-6 + 5e5 / 100e9) + 0.5 * 1e6 * 1e-10 + (1e-6 + 5e5 / 100e9)
    across = 2 * 2e-6 + 2 * 0.5 * 5e5 * (2 / 8e9) + 0.5 * 5e5 * 1e-10
    assert reduction_time(w, 2, 2, 1.0)[0] == pytest.approx(within + across)
    # the node's network carries the gradient about once, however many ranks it holds: 8 ranks per node cost
    # about what 1 does across the nodes, not 8 times as much
    one_per_node = reduction_time(w, 16, 1, 1.0)[0]
    eight_per_node = reduction_time(w, 16, 8, 1.0)[0]
    assert eight_per_node < 1.5 * one_per_node


def test_nccl_costs_its_ring_with_its_own_step_latencies() -> None:
    intra, inter = c.Link(3.4e-6, 1 / 50e9, 0.0), c.Link(2e-6, 1 / 12.5e9, 0.0)
    # 4 nodes x 8 GPUs, a small message: 6 of the 62 ring steps cross the network at NCCL's 9.6 us, 56 stay
    # on NVLink; plus NCCL's 8.4 us launch
    small = 1e3
    ring, name = c.nccl_allreduce(4, 8, small, intra, inter, "ring")
    bandwidth = 2 * 31 / 32 * small / 12.5e9
    assert name == "ring"
    assert ring == pytest.approx(8.4e-6 + 56 * 3.4e-6 + 6 * 9.6e-6 + bandwidth)
    # at least P/16 x 64 KiB across nodes: the latency takes NCCL's plateau factor 1.9
    big = 32 / 16 * 65536
    assert c.nccl_allreduce(4, 8, big, intra, inter, "ring")[0] == pytest.approx(
        8.4e-6 + 1.9 * (56 * 3.4e-6 + 6 * 9.6e-6) + 2 * 31 / 32 * big / 12.5e9)
    # a site latency above NCCL's is kept; on one node there is no network step and no plateau
    slow = c.Link(1e-3, 1 / 12.5e9, 0.0)
    assert c.nccl_allreduce(2, 1, small, intra, slow, "ring")[0] == pytest.approx(
        8.4e-6 + 2 * 1e-3 + small / 12.5e9)
    assert c.nccl_allreduce(1, 8, big, intra, inter, "ring")[0] == pytest.approx(
        8.4e-6 + c.ring_allreduce(8, big, intra))


def test_horovod_fusion_grows_with_a_slow_network() -> None:
    """Each cycle fuses what backward has produced since the last all-reduce: with a fast network the gradient
    goes out in many small all-reduces hidden behind backward; with a slow one each all-reduce takes longer,
    the next one carries more, and what is left after backward is exposed."""
    window = 0.1
    p = params(backend="mpi", fusion_cycle_s=0.01, bucket_mb=1e4, grad_bytes=1e8, latency_us=1.0)
    w = Workload(p, even_buckets(1e8, 1e4 * 2**20, window) + (BucketTiming(0.0, window),))
    assert w.grad_bytes == 1e8
    fast = Workload(p.set_value("nic_gbps", 1e3, "set", "t"), w.buckets)
    slow = Workload(p.set_value("nic_gbps", 0.05, "set", "t"), w.buckets)
    exposed_fast, total_fast, _ = reduction_time(fast, 2, 1, 1.0)
    exposed_slow, total_slow, _ = reduction_time(slow, 2, 1, 1.0)
    # the fast network: ticks half a cycle into backward, then every cycle: 1e7/2 bytes, nine of 1e7, and
    # the last 1e7/2 half a cycle after backward
    link = c.Link(1e-6, 1 / 1e12, 1 / 10e9)
    one, half = c.allreduce("mpi", 2, 1e7, link)[0], c.allreduce("mpi", 2, 5e6, link)[0]
    assert total_fast == pytest.approx(9 * one + 2 * half)
    assert exposed_fast == pytest.approx(0.005 + half)
    # the slow network: every byte still sent once, fewer and larger all-reduces, most of it exposed
    whole = c.allreduce("mpi", 2, 1e8, c.Link(1e-6, 1 / 5e7, 1 / 10e9))[0]
    assert total_slow == pytest.approx(whole, rel=0.05)
    assert exposed_slow > whole - window
    # a gradient in one bucket still comes out of backward across the overlap window
    whole_bucket = Workload(fast.params.set_value("overlap_window_s", window, "set", "t"), (BucketTiming(1e8, 0.0),))
    assert reduction_time(whole_bucket, 2, 1, 1.0)[:2] == pytest.approx((exposed_fast, total_fast))
    # no overlap: one fused all-reduce of the whole gradient at the first tick after backward
    flat = Workload(slow.params.set_value("reduction_overlap", False, "set", "t"), w.buckets)
    assert reduction_time(flat, 2, 1, 1.0)[0] == pytest.approx(0.005 + whole)


def test_algorithm_can_be_forced_and_taper_cuts_bandwidth_beyond_a_group() -> None:
    p = params(backend="nccl", reduction_overlap=False, latency_us=1000.0)
    w = one_bucket(p, 1e3)
    assert reduction_time(w, 64, 1, 1.0)[2] == "tree"  # latency-bound: the backend's own choice
    forced = Workload(p.set_value("allreduce_algorithm", "ring", "set", "t"), w.buckets)
    assert reduction_time(forced, 64, 1, 1.0)[2] == "ring"
    ring = c.ring_allreduce(64, 1e3, c.Link(1e-3, 1e-9, 1e-10))  # the site's 1 ms latency is above NCCL's 9.6 us
    assert reduction_time(forced, 64, 1, 1.0)[0] == pytest.approx(c.NCCL_RING_BASE_S + ring)
    big = one_bucket(params(reduction_overlap=False, taper_nodes=16, taper=0.25), 1e8)
    inside, outside = reduction_time(big, 16, 1, 1.0)[0], reduction_time(big, 32, 1, 1.0)[0]
    assert outside > 3.5 * inside  # a quarter of the bandwidth once the job leaves its group


def test_heavy_tail_slow_nodes_and_checkpoints() -> None:
    w = one_bucket(params(hiccup_prob=0.01, hiccup_s=0.5))
    # one stall of 0.5 s in a step of P ranks with probability 1 - 0.99^P
    assert step_cost(w, 1, 1).terms["straggler"] == pytest.approx(0.5 * 0.01)
    assert step_cost(w, 100, 1).terms["straggler"] == pytest.approx(0.5 * (1 - 0.99**100))
    slow = one_bucket(params(slow_node_fraction=0.001, slow_node_slowdown=0.3))
    assert step_cost(slow, 1000, 1).terms["straggler"] == pytest.approx(0.3 * (1 - 0.999**1000))
    ckpt = one_bucket(params(checkpoint_bytes=3e9, checkpoint_every_steps=100, filesystem_gbps=10.0))
    # 3 GB through the node's 1 GB/s network (slower than the file system) every 100 steps
    assert step_cost(ckpt, 4, 1).terms["checkpoint"] == pytest.approx(3.0 / 100)


def test_half_precision_adacomp_adasum_and_dasgd_by_hand() -> None:
    one = c.Link(1e-6, 1e-9, 1e-10)
    half = c.Link(1e-6, 1e-9, 4e-10)  # half_gamma_factor 4
    fp16 = one_bucket(params(compression="fp16", reduction_overlap=False))
    convert = 2 * 1e6 * 1e-10
    assert reduction_time(fp16, 1, 4, 1.0)[0] == pytest.approx(c.rabenseifner_allreduce(4, 5e5, half) + convert)
    ada = one_bucket(params(combiner="adacomp", reduction_overlap=False))
    sent = 1e6 * 0.02
    assert reduction_time(ada, 1, 4, 1.0)[0] == pytest.approx(c.allgather(4, sent, one) + 4 * sent * 1e-10)
    adasum = one_bucket(params(combiner="adasum"))
    assert reduction_time(adasum, 1, 4, 1.0)[0] == pytest.approx(c.adasum_exchange(4, 1e6, one))
    dasgd = one_bucket(params(combiner="dasgd", dasgd_period=2, dasgd_delay=1))
    full = c.rabenseifner_allreduce(4, 1e6, one)
    assert reduction_time(dasgd, 1, 4, 1e-3)[0] == pytest.approx((full - 1e-3) / 2)
    assert reduction_time(dasgd, 1, 4, 1.0)[0] == 0.0  # one step of compute hides it


def test_overhead_only_across_nodes_and_input_stream_read_whole() -> None:
    p = params(multinode_overhead_s=0.05, input_sharding="whole", record_s=1e-3, input_s=0.01)
    w = one_bucket(p)
    assert step_cost(w, 1, 4).terms["overhead"] == 0.0
    assert step_cost(w, 3, 1).terms["overhead"] == 0.05
    # 3 ranks each read 3 x 4 records per step, keeping their 4: 2 x 4 records more than alone
    assert step_cost(w, 3, 1).terms["input"] == pytest.approx(0.01 + 8e-3)
    shared = one_bucket(params(input_s=0.01, input_bytes=1e9, filesystem_gbps=100.0))
    assert step_cost(shared, 16, 1).terms["input"] == pytest.approx(0.16)  # 16 GB over 100 GB/s


def test_startup_unstaged_staged_and_amortised() -> None:
    p = params(startup_s=10.0, env_files=1000.0, metadata_ops_per_s=1000.0, env_bytes=1e9, filesystem_gbps=10.0,
               latency_us=1.0, nic_gbps=1.0)
    assert startup_time(p, 5, 1) == pytest.approx(10 + 4)  # 4 ranks more, each opening 1000 files at 1000/s
    staged = p.set_value("startup_staged", True, "set", "t")
    assert startup_time(staged, 5, 1) == pytest.approx(10 + 0.1 + 3 * (1e-6 + 1.0))  # read once, 3 tree levels
    whole = p.updated(Param("input_sharding", "whole", "set", "t"), Param("stream_bytes", 1e9, "set", "t"))
    assert startup_time(whole, 2, 1) == pytest.approx(10 + 1 + 0.1)
    w = one_bucket(p.set_value("walltime_s", 110.0, "set", "t"))
    cost = step_cost(w, 1, 1)
    assert cost.terms["startup"] == pytest.approx(cost.steady_s * 10 / 100)
    too_long = step_cost(one_bucket(p.set_value("walltime_s", 9.0, "set", "t")), 1, 1)
    assert too_long.terms["startup"] == math.inf


def test_efficiency_and_losses_add_up_to_one() -> None:
    w = one_bucket(params(compute_std_s=0.05, multinode_overhead_s=0.02, input_s=0.1, startup_s=100.0,
                          walltime_s=3600.0, env_files=5000.0))
    pred = predict(w, 64)
    assert pred.efficiency + sum(pred.losses.values()) == pytest.approx(1.0)
    assert pred.efficiency == pytest.approx(pred.reference.total_s / pred.cost.total_s)
    assert pred.samples_per_s == pytest.approx(64 * 4 / pred.cost.total_s)
    assert pred.dominant_loss == max(pred.losses, key=pred.losses.__getitem__)


def test_time_to_target_restarts_jobs_and_pays_startup_each_time() -> None:
    w = one_bucket(params(startup_s=100.0, walltime_s=1100.0))
    cost = step_cost(w, 1, 1)
    assert time_to_target(cost, 2500, 1100.0) == pytest.approx(2500 + 3 * 100)  # 1000 useful s per job
    pred = predict(w, 2, target_samples=8 * 100)  # 2 ranks x 4 samples: 100 steps
    assert pred.time_to_target_s == pytest.approx(100 * pred.step_s + pred.cost.startup_s)


def test_even_bucket_layout() -> None:
    layout = even_buckets(10 * 2**20, 4 * 2**20, 0.6)
    assert [b.nbytes for b in layout] == [4 * 2**20, 4 * 2**20, 2 * 2**20]
    assert [b.lead_s for b in layout] == pytest.approx([0.6, 0.3, 0.0])


# --- advice -----------------------------------------------------------------------------------------------


def test_lr_rule_follows_the_ffn_study() -> None:
    assert lr_rule(8, "sqrt", "linear").endswith("set train.lr_scaling: linear")
    assert "linear with warm-up up to 16 ranks" in lr_rule(8, "sqrt", "linear")
    assert lr_rule(8, "linear", "linear").endswith("fits")
    assert lr_rule(8, "linear", "none").endswith("set a train.warmup")  # linear needs a warm-up
    assert lr_rule(8, "none", "none").endswith("set train.lr_scaling: linear and a train.warmup")
    assert lr_rule(64, "sqrt", "none").endswith("fits")
    assert lr_rule(64, "linear", "linear").endswith("set train.lr_scaling: sqrt")
    assert lr_rule(1, "linear", "none") == "one rank: no LR scaling"
    assert "from one study: FFN on Theta" in lr_rule(8, "linear", "linear")


def test_lr_rule_only_where_the_study_holds() -> None:
    for other in (lr_rule(8, "linear", "linear", "resnet"), lr_rule(8, "linear", "linear", "ffn", "adasum"),
                  lr_rule(4096, "sqrt", "none", "ffn")):
        assert other.startswith("no rule for this job") and "set train" not in other
    assert lr_rule(64, "sqrt", "none", "hpctrain.ffn.model:FFN").endswith("fits")


def test_batch_advice_amortises_a_fixed_per_step_cost() -> None:
    w = one_bucket(params(multinode_overhead_s=0.5))
    pred = predict(w, 2)
    assert pred.steady_efficiency == pytest.approx(1 / 1.5, rel=1e-3)
    text = batch_advice(w, pred)
    assert text.startswith("32 per rank (x8")  # 4*1/(4+0.5) = 0.89 < 0.9 <= 8/(8+0.5)


def test_warnings_name_the_dominant_term_and_what_to_do() -> None:
    w = one_bucket(params(input_sharding="whole", record_s=1e-3))
    pred = annotate(w, predict(w, 64), "sqrt", "none")
    assert pred.dominant_loss == "input"
    assert any(x.startswith("input costs") and "shard it" in x for x in pred.warnings)


# --- parameters -------------------------------------------------------------------------------------------


def test_set_parses_and_refuses_with_the_valid_keys() -> None:
    assert parse_assignment("latency_us=2.5") == ("latency_us", "2.5")
    with pytest.raises(ConfigError, match="did you mean latency_us"):
        parse_assignment("latency_ms=2")
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_assignment("latency_us")
    with pytest.raises(ConfigError, match="latency_us: 'fast' is not a number"):
        check_value("latency_us", "fast")
    with pytest.raises(ConfigError, match="whole number"):
        check_value("ranks_per_node", "1.5")
    with pytest.raises(ConfigError, match="not one of mpi, gloo, nccl"):
        check_value("backend", "tcp")
    assert check_value("startup_staged", "yes") is True
    p = apply_sets(params(), ["compute_s=2", "backend=gloo"])
    assert p["compute_s"].value == 2.0 and p["compute_s"].source == "set" and p.value("backend") == "gloo"
    assert set(BASE) <= set(SPECS)


def test_a_combiner_without_a_cost_model_is_refused_not_costed_as_a_mean() -> None:
    from hpctrain.config.backends import COMBINERS

    assert SPECS["combiner"].kind == tuple(COMBINERS)  # the planner's choices are the registry's
    for name in COMBINERS:  # every built-in has a cost
        assert step_cost(one_bucket(params(combiner=name)), 2, 1).terms["reduction"] > 0
    with pytest.raises(ConfigError, match="no cost model for combiner 'topk'"):
        step_cost(one_bucket(params(combiner="topk")), 2, 1)  # a plug-in's, registered but not modelled
