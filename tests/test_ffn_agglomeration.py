"""Agglomeration of an FFN over-segmentation (hpctrain/ffn/inference/agglomeration.py): contact pairs, where the bare
seeds of a pair check go, the both-ways rule, the watershed fill, and the whole path in ``segment_volume`` with the
oracle stand-in model of tests/test_ffn_inference.py (bounded floods cut each cube into pieces; the checks join
them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml

from hpctrain.config.plugins.ffn_inference import InferenceConfig
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
from hpctrain.ffn.inference.agglomeration import (
    agglomerate,
    contact_pairs,
    join_groups,
    mutual_claims,
    seed_positions,
    watershed_fill,
)
from hpctrain.ffn.inference.runner import segment_volume
from hpctrain.ffn.logits import logit
from tests.test_ffn_inference import OracleModel, cubes_volume

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


def test_contact_pairs_reach_across_a_membrane_not_further() -> None:
    seg = np.zeros((4, 4, 20), np.int32)
    seg[..., 0:5] = 1
    seg[..., 7:12] = 2  # 2 voxels of membrane between 1 and 2: within reach 3
    seg[..., 16:20] = 3  # 4 voxels between 2 and 3: out of reach
    pairs = contact_pairs(seg, reach=3, min_voxels=1)
    # (1, 2): columns 4 -> 7 (distance 3) and only that, for each of the 16 (z, y) lines
    assert pairs == {(1, 2): 16}
    assert contact_pairs(seg, reach=3, min_voxels=17) == {}
    assert contact_pairs(np.zeros((3, 3, 3), np.int32)) == {}


def test_seed_positions_lie_in_the_source_near_the_target_with_their_fov_inside() -> None:
    seg = np.zeros((21, 21, 40), np.int32)
    seg[..., :20] = 1
    seg[..., 22:] = 2
    positions = seed_positions(seg, 1, 2, margin=(4, 4, 4), count=3)
    assert len(positions) == 3 and len(set(positions)) == 3
    for z, y, x in positions:
        assert seg[z, y, x] == 1 and 22 - 5 <= x <= 22 - 2  # 2..5 voxels from object 2
        assert 4 <= z < 17 and 4 <= y < 17  # the FOV stays inside the volume
    assert seed_positions(seg, 1, 3, margin=(4, 4, 4)) == []  # no object 3


def test_a_distance_cache_gives_the_same_positions_with_one_transform_per_target() -> None:
    """``mutual_claims`` keeps each target's distance transform for every pair it is the target of: the positions
    are those computed without the cache, and a target met twice is transformed once."""
    seg = np.zeros((21, 21, 60), np.int32)
    seg[..., :20], seg[..., 22:38], seg[..., 40:] = 1, 2, 3
    cache: dict = {}
    for source in (1, 3):
        assert (seed_positions(seg, source, 2, margin=(4, 4, 4), distances=cache)
                == seed_positions(seg, source, 2, margin=(4, 4, 4)) != [])
    assert list(cache) == [(2, 5)]  # (target, far): one transform for both sources
    assert seed_positions(seg, 2, 3, margin=(4, 4, 4), far=3, distances=cache) == seed_positions(
        seg, 2, 3, margin=(4, 4, 4), far=3)
    assert sorted(cache) == [(2, 5), (3, 3)]


def test_a_pair_is_joined_only_when_both_sides_claim_each_other() -> None:
    seg = np.zeros((15, 15, 30), np.int32)
    seg[..., :14] = 1
    seg[..., 16:] = 2
    claim = logit(0.6)

    def one_way(positions: list[tuple[int, int, int]]) -> np.ndarray:
        # from object 1 every voxel is claimed (a leak), from object 2 only object 2's own voxels
        out = np.full((len(positions), 9, 9, 9), -8.0, np.float32)
        for i, (z, y, x) in enumerate(positions):
            box = seg[z - 4 : z + 5, y - 4 : y + 5, x - 4 : x + 5]
            out[i] = np.where((box > 0) if seg[z, y, x] == 1 else (box == 2), 8.0, -8.0)
        return out

    scores = mutual_claims(seg, one_way, (9, 9, 9), claim, [(1, 2)])
    assert scores == {(1, 2): 0.0}  # 2 -> 1 claims nothing: the smaller share decides
    assert agglomerate(seg, scores, 0.5).max() == 2

    def both_ways(positions: list[tuple[int, int, int]]) -> np.ndarray:
        return np.full((len(positions), 9, 9, 9), 8.0, np.float32)

    scores = mutual_claims(seg, both_ways, (9, 9, 9), claim, [(1, 2)])
    assert scores == {(1, 2): 1.0}
    joined = agglomerate(seg, scores, 0.5)
    assert set(np.unique(joined)) == {0, 1}


def test_watershed_fill_grows_through_bright_voxels_and_meets_on_the_membrane() -> None:
    image = np.full((3, 3, 21), 200, np.uint8)
    image[..., 10] = 20  # a dark membrane in the middle
    labels = np.zeros(image.shape, np.int32)
    labels[1, 1, 2] = 1
    labels[1, 1, 18] = 2
    filled = watershed_fill(image, labels)
    assert (filled[..., :10] == 1).all() and (filled[..., 11:] == 2).all()
    assert filled[1, 1, 10] in (1, 2)
    assert not watershed_fill(image, np.zeros_like(labels)).any()


def test_bounded_floods_then_agglomeration_recover_the_cubes() -> None:
    """Floods limited to 3 voxels from their seed cut each 17^3 cube of cubes_volume into pieces; the oracle's
    bare-seed answer (voxels of the seed's own intensity) claims the other pieces of its cube and nothing of the
    next cube, so agglomeration joins exactly the pieces of each cube."""
    image, labels = cubes_volume()
    base = {"fov": (9, 9, 9), "deltas": (3, 3, 3), "min_segment_size": 20, "max_seed_distance": 3,
            "reseed_passes": 6, "seed_policy": "grid", "seed_args": {"step": 5, "offsets": [4]},
            "min_boundary_dist": (0, 0, 0)}
    pieces = segment_volume(OracleModel(), image, InferenceConfig(**base))
    cut = evaluate_segmentation(pieces, labels)
    assert cut["n_segments"] > 8 and cut["merging_segments"] == 0
    seg, canvas = segment_volume(OracleModel(), image, InferenceConfig(**base, agglomerate_threshold=0.8),
                                 return_canvas=True)
    m = evaluate_segmentation(seg, labels)
    assert m["n_segments"] == 8 and m["merging_segments"] == 0
    assert m["voi_split"] < cut["voi_split"] - 1.0 and m["adapted_rand_error"] < 0.05
    pieces_n, joined_n = len(np.unique(pieces[pieces > 0])), len(np.unique(seg[seg > 0]))
    assert canvas.counters["agglomeration_joins"] == pieces_n - joined_n > cut["n_segments"] - 8
    assert canvas.counters["agglomeration_fovs"] > 0


def test_average_linkage_keeps_apart_what_one_leaky_pair_would_join() -> None:
    """Pieces 1-2 and 3-4 are two objects' halves (0.9); one pair across them scores 0.8 (a leak), the two other
    pairs across them 0.1. Single linkage at 0.5 joins everything through the leak; average linkage joins the
    halves first, then sees a mean of (0.8 + 0.1 + 0.1) / 3 = 0.33 between the two objects and stops."""
    scores = {(1, 2): 0.9, (3, 4): 0.9, (2, 3): 0.8, (1, 3): 0.1, (2, 4): 0.1}
    single, average = join_groups(scores, 0.5, "single"), join_groups(scores, 0.5, "average")
    assert len({single.find(i) for i in range(1, 5)}) == 1
    assert [average.find(i) for i in range(1, 5)] == [1, 1, 3, 3]
    # the groups' mean follows every merge: at 0.3 the objects join (0.33 >= 0.3)
    assert len({join_groups(scores, 0.3, "average").find(i) for i in range(1, 5)}) == 1
    # a chain of pairs each at or above the threshold is joined by both
    chain = {(1, 2): 0.7, (2, 3): 0.6, (3, 4): 0.55}
    assert len({join_groups(chain, 0.5, "average").find(i) for i in range(1, 5)}) == 1
    seg = np.array([[[1, 2, 0, 3, 4]]], np.uint32)
    np.testing.assert_array_equal(agglomerate(seg, scores, 0.5, "average"), [[[1, 1, 0, 3, 3]]])
    np.testing.assert_array_equal(agglomerate(seg, scores, 0.5), [[[1, 1, 0, 1, 1]]])
    with pytest.raises(ValueError, match="linkage"):
        join_groups(scores, 0.5, "complete")


def test_average_linkage_equals_a_brute_force_reference() -> None:
    """Random graphs: the heap-based merging gives the groups of a direct re-computation of every group mean
    after each merge (the best pair merged first)."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        n = int(rng.integers(3, 12))
        scores = {(a, b): float(rng.random()) for a in range(1, n + 1) for b in range(a + 1, n + 1)
                  if rng.random() < 0.4}
        threshold = float(rng.uniform(0.2, 0.8))
        groups = {i: {i} for i in range(1, n + 1)}
        while True:
            best, pair = -1.0, None
            for x in groups:
                for y in groups:
                    if x < y:
                        between = [s for (a, b), s in scores.items()
                                   if (a in groups[x] and b in groups[y]) or (a in groups[y] and b in groups[x])]
                        if between and np.mean(between) > best:
                            best, pair = float(np.mean(between)), (x, y)
            if pair is None or best < threshold:
                break
            groups[pair[0]] |= groups.pop(pair[1])
        union = join_groups(scores, threshold, "average")
        expected = sorted(sorted(g) for g in groups.values())
        got: dict[int, list[int]] = {}
        for i in range(1, n + 1):
            got.setdefault(union.find(i), []).append(i)
        assert sorted(got.values()) == expected, (scores, threshold)


@pytest.mark.parametrize("bad", [{"agglomerate_threshold": 1.5}, {"watershed_fill": "maybe"}, {"linkage": "complete"},
                                 {"split_pieces": "yes"}])
def test_bad_agglomeration_settings_are_refused_on_the_laptop(bad: dict) -> None:
    from pydantic import ValidationError

    from hpctrain.config.plugins.ffn_inference import InferenceSettings

    with pytest.raises(ValidationError):
        InferenceSettings(**bad)
    assert InferenceSettings(agglomerate_threshold=0.85, watershed_fill=True).watershed_fill


@pytest.mark.processes
def test_segment_command_takes_the_job_s_inference_settings_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """`hpctrain ffn segment --job` floods with the job's data.eval.inference (here the demo job's: bounded
    floods, agglomeration, watershed fill), in one process and in 8 subvolumes; a job with a bad setting is
    refused with one message before anything is written."""
    from tests.test_ffn_subvolumes import segment_command_setup

    ckpt, env = segment_command_setup(tmp_path)

    def segment(job: Path, out: str, *extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "hpctrain", "ffn", "segment", str(ckpt), f"{tmp_path}/vol.h5:image",
                   "-o", str(tmp_path / out), "--job", str(job), "--threads", "1", *extra]
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL)

    demo_job = REPO / "jobs" / "ffn-local.yaml"
    done = segment(demo_job, "one.h5", "--min-segment-size", "10", "--precision", "bfloat16")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with h5py.File(tmp_path / "one.h5") as f:
        config = json.loads(f["segmentation"].attrs["config"])
        labels = f["segmentation"][()]
    expected = yaml.safe_load(demo_job.read_text())["data"]["eval"]["inference"]
    assert config["agglomerate_threshold"] == expected["agglomerate_threshold"] > 0
    assert config["watershed_fill"] is True and config["max_seed_distance"] == expected["max_seed_distance"]
    assert config["min_segment_size"] == 10 and config["precision"] == "bfloat16"  # the flags override the job
    assert (labels > 0).all()  # the watershed fill leaves no voxel unsegmented
    pieces = segment(demo_job, "eight.h5", "--subvolumes", "2", "2", "2")
    assert pieces.returncode == 0 and "pieces: 8" in pieces.stdout, pieces.stderr[-2000:]

    bad = tmp_path / "bad.yaml"
    spec = yaml.safe_load(demo_job.read_text())
    spec["data"]["eval"]["inference"]["agglomerate_threshold"] = 1.5
    bad.write_text(yaml.safe_dump(spec))
    refused = segment(bad, "bad.h5")
    assert refused.returncode != 0 and "agglomerate_threshold" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "bad.h5").exists()
    not_ffn = segment(REPO / "jobs" / "resnet-local.yaml", "resnet.h5")
    assert not_ffn.returncode != 0 and "is not the FFN" in not_ffn.stderr and "Traceback" not in not_ffn.stderr
    assert not (tmp_path / "resnet.h5").exists()
