"""Subvolume inference: the plan's cores tile the volume, pieces are reconciled across their borders, and a
volume cut into 8 subvolumes scores within 0.05 VOI of the single-process segmentation.

The quality check uses the stand-in oracle of tests/test_ffn_inference.py (it floods voxels of the seed's
intensity) on a synthetic volume painted one intensity per object, so the comparison measures the cutting and
reconciling, not a model's skill. The command-line path runs the pieces as 2 ranks of the local launcher with a
real ConvStack3D checkpoint and must give the same file as the in-process path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_ffn_inference import OracleModel

from hpctrain.config.plugins.ffn_inference import InferenceConfig
from hpctrain.errors import ConfigError, DataError
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
from hpctrain.ffn.inference.agglomeration import contact_pairs
from hpctrain.ffn.inference.runner import segment_volume
from hpctrain.ffn.inference.subvolume_finish import (
    OVERSEGMENTATION,
    assemble,
    assign_pairs,
    count_contacts,
    finish_parts,
    finished_path,
)
from hpctrain.ffn.inference.subvolumes import (
    match_segments,
    mine,
    part_path,
    plan_subvolumes,
    read_plan,
    reconcile,
    segment_parts,
    write_plan,
)
from hpctrain.ffn.model import ConvStack3D
from hpctrain.ffn.synthetic import make_synthetic_volume

REPO = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)


def test_cores_tile_the_volume_and_pieces_overlap() -> None:
    plan = plan_subvolumes((30, 41, 50), (2, 2, 2), 5, min_size=(9, 9, 9))
    assert len(plan) == 8
    owner = np.zeros((30, 41, 50), np.int32)
    for sub in plan:
        core = tuple(slice(a, b) for a, b in zip(sub.core_start, sub.core_stop, strict=True))
        owner[core] += 1
        for a, b, ca, cb, s in zip(sub.start, sub.stop, sub.core_start, sub.core_stop, (30, 41, 50), strict=True):
            assert a == max(ca - 5, 0) and b == min(cb + 5, s)  # the halo, clipped at the volume border
    assert np.all(owner == 1)  # every voxel is written by exactly one piece
    assert sorted(s.index for r in range(3) for s in mine(plan, r, 3)) == list(range(8))
    with pytest.raises(ConfigError, match="less than the FOV"):
        plan_subvolumes((20, 20, 20), (4, 1, 1), 0, min_size=(9, 9, 9))
    with pytest.raises(ConfigError, match="cannot cut"):
        plan_subvolumes((3, 20, 20), (4, 1, 1), 2)


def test_plan_file_round_trip_and_a_bad_file(tmp_path: Path) -> None:
    plan = plan_subvolumes((20, 20, 20), (1, 2, 2), 3)
    write_plan(tmp_path / "plan.json", plan, checkpoint="c.pt", volume="v.h5:image")
    again, settings = read_plan(tmp_path / "plan.json")
    assert again == plan and settings == {"checkpoint": "c.pt", "volume": "v.h5:image"}
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not a subvolume plan"):
        read_plan(tmp_path / "bad.json")


def test_matching_needs_the_majority_of_both_segments() -> None:
    a = np.zeros((4, 10, 10), np.uint32)
    b = np.zeros_like(a)
    a[:, :, :5], a[:, :, 5:] = 1, 2  # a: two objects
    b[:, :, :5], b[:, :, 5:] = 7, 7  # b merged them: 7 holds half of its voxels with each of a's
    b[:, :, 9] = 8
    assert match_segments(a, b, min_fraction=0.6, min_voxels=10) == []  # a merge in b joins nothing
    assert match_segments(a, b, min_fraction=0.5, min_voxels=10) == [(1, 7)]
    c = a.copy()
    c[c == 2] = 5
    assert match_segments(a, c, min_voxels=10) == [(1, 1), (2, 5)]
    assert match_segments(a, c, min_voxels=1000) == []


def _write_part(tmp_path: Path, sub: object, labels: np.ndarray) -> None:
    with h5py.File(part_path(tmp_path, sub), "w") as f:  # type: ignore[arg-type]
        f["segmentation"] = labels


def test_reconcile_joins_an_object_across_the_border_and_keeps_others_apart(tmp_path: Path) -> None:
    plan = plan_subvolumes((10, 10, 20), (1, 1, 2), 3)
    truth = np.zeros((10, 10, 20), np.uint32)
    truth[:, :5, :] = 1  # crosses the border at x = 10
    truth[:, 5:, :6] = 2  # left piece only (the pieces share x = 7..12)
    truth[:, 5:, 14:] = 3  # right piece only
    for sub in plan:
        local = truth[sub.box()].copy()
        local[local > 0] += 10 * sub.index  # each piece numbers its segments its own way
        _write_part(tmp_path, sub, local)
    summary = reconcile(plan, tmp_path, tmp_path / "out.h5", truth.shape)
    with h5py.File(tmp_path / "out.h5") as f:
        out = f["segmentation"][()]
    assert summary["objects"] == 3 and summary["joined_pairs"] == 1
    m = evaluate_segmentation(out, truth)
    assert m["voi"] == pytest.approx(0.0, abs=1e-9) and set(np.unique(out)) == {0, 1, 2, 3}
    part_path(tmp_path, plan[1]).unlink()
    with pytest.raises(DataError, match="subvolume 1 has no segmentation"):
        reconcile(plan, tmp_path, tmp_path / "out2.h5", truth.shape)


def painted_volume(shape: tuple[int, int, int] = (40, 64, 64), seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic labels painted one distinct intensity per object (membranes 0), for the oracle model."""
    _, labels = make_synthetic_volume(shape, seed)
    assert labels.max() < 200
    lut = np.zeros(int(labels.max()) + 1, np.uint8)
    lut[1:] = 50 + np.random.default_rng(0).permutation(200)[: int(labels.max())]
    return lut[labels], labels


def in_pieces(tmp_path: Path, image: np.ndarray, cfg: InferenceConfig) -> tuple[list, Path, dict, np.ndarray]:
    """The steps of ``hpctrain ffn segment --subvolumes 2 2 2`` with the oracle, as two ranks one after the other:
    plan, flood the pieces, reconcile, count contacts, finish the pieces (agglomeration scores, fill), assemble.
    Returns (plan, plan path, summary, segmentation)."""
    with h5py.File(tmp_path / "vol.h5", "w") as f:
        f["image"] = image
    plan = plan_subvolumes(image.shape, (2, 2, 2), 9, min_size=cfg.flood.fov)
    plan_path = write_plan(tmp_path / "parts" / "plan.json", plan, checkpoint="unused",
                           volume=f"{tmp_path}/vol.h5:image")
    for rank in range(2):
        segment_parts(plan_path, rank, 2, model=OracleModel(), config=cfg)
    assert all(part_path(plan_path.parent, s).exists() for s in plan)
    summary = reconcile(plan, plan_path.parent, plan_path.parent / OVERSEGMENTATION, image.shape)
    assign_pairs(plan, plan_path.parent, image.shape, cfg.joins.min_contact)
    for rank in range(2):
        finish_parts(plan_path, rank, 2, model=OracleModel(), config=cfg)
    summary.update(assemble(plan, plan_path.parent, tmp_path / "pieces.h5", image.shape,
                            cfg.joins.agglomerate_threshold))
    with h5py.File(tmp_path / "pieces.h5") as f:
        return plan, plan_path, summary, f["segmentation"][()]


@pytest.mark.processes
def test_eight_subvolumes_score_within_0_05_voi_of_one_process(tmp_path: Path) -> None:
    image, labels = painted_volume()
    # a grid of seeds: the peaks policy finds few peaks in a flat painted image
    cfg = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=50, watershed_fill=True, seed_policy="grid",
                          seed_args={"step": 6, "offsets": (0, 3)})
    whole = segment_volume(OracleModel(), image, cfg)
    plan, plan_path, summary, pieces = in_pieces(tmp_path, image, cfg)
    single, cut = evaluate_segmentation(whole, labels), evaluate_segmentation(pieces, labels)
    assert single["voi"] < 0.5  # the oracle segments well: a meaningful reference
    assert summary["joined_pairs"] > 0
    assert abs(cut["voi"] - single["voi"]) <= 0.05, (single["voi"], cut["voi"])
    # without reconciling, the objects cut by the borders would be split: the joining is what keeps the score
    unjoined = reconcile(plan, plan_path.parent, tmp_path / "raw.h5", image.shape, min_voxels=10**9)
    with h5py.File(tmp_path / "raw.h5") as f:
        raw = evaluate_segmentation(f["segmentation"][()], labels)
    assert unjoined["joined_pairs"] == 0 and raw["voi_split"] > single["voi_split"] + 0.3
    # a piece whose finishing is missing is named, with the command that writes it, and nothing is written
    finished_path(plan_path.parent, plan[3]).unlink()
    with pytest.raises(DataError, match="subvolume 3 has no finished segmentation.*finish-parts PLAN"):
        assemble(plan, plan_path.parent, tmp_path / "again.h5", image.shape, cfg.joins.agglomerate_threshold)
    assert not (tmp_path / "again.h5").exists()


@pytest.mark.processes
@pytest.mark.parametrize("split_pieces", [False, True])
def test_bounded_floods_agglomerated_after_reconciling_match_one_process(tmp_path: Path, split_pieces: bool) -> None:
    """The demo's kind of inference (bounded floods, then agglomeration by the FFN's mutual claims and the
    watershed fill) in 8 pieces: the pieces only flood, and agglomeration and fill run after reconciling, so
    the result matches one process though objects are cut into many floods across the borders. With
    ``split_pieces`` (the demo's) each piece splits its floods' objects into connected parts before reconciling."""
    image, labels = painted_volume()
    cfg = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=20, seed_policy="grid",
                          seed_args={"step": 6, "offsets": (0, 3)}, max_seed_distance=4, agglomerate_threshold=0.5,
                          watershed_fill=True, split_pieces=split_pieces)
    whole = evaluate_segmentation(segment_volume(OracleModel(), image, cfg), labels)
    floods = evaluate_segmentation(segment_volume(OracleModel(), image, cfg.replace(agglomerate_threshold=0.0)),
                                   labels)
    assert floods["voi_split"] > 2.0 and whole["voi"] < 0.1  # bounded floods over-segment; agglomeration joins
    _, _, summary, pieces = in_pieces(tmp_path, image, cfg)
    cut = evaluate_segmentation(pieces, labels)
    assert summary["agglomerated_pairs"] > 50 and summary["scored_pairs"] >= summary["agglomerated_pairs"]
    assert abs(cut["voi"] - whole["voi"]) <= 0.05, (whole, cut)
    assert (pieces > 0).all()  # the fill reached every voxel, across the borders too


def test_contacts_counted_by_the_cores_add_up_to_the_whole_volume_s(tmp_path: Path) -> None:
    blocks = np.random.default_rng(3).integers(0, 60, (6, 12, 11))  # 0: unsegmented
    labels = blocks.repeat(4, 0).repeat(4, 1).repeat(4, 2)[:, :46, :]  # objects of 4-voxel blocks
    with h5py.File(tmp_path / OVERSEGMENTATION, "w") as f:
        f["segmentation"] = labels
    plan = plan_subvolumes(labels.shape, (2, 2, 3), 4)
    by_piece = count_contacts(plan, tmp_path / OVERSEGMENTATION, labels.shape)
    summed = {pair: sum(counts.values()) for pair, counts in by_piece.items()}
    assert summed == contact_pairs(labels, min_voxels=1) and len(summed) > 500
    assert max(len(counts) for counts in by_piece.values()) > 1  # some contacts cross a border
    assign_pairs(plan, tmp_path, labels.shape, 40)
    assigned = json.loads((tmp_path / "pairs.json").read_text())["pieces"]
    flat = sorted(tuple(p) for pairs in assigned.values() for p in pairs)
    assert flat == sorted(p for p, n in summed.items() if n >= 40)  # each pair once, by its largest holder
    for index, pairs in assigned.items():
        for a, b in pairs:
            assert by_piece[(a, b)][int(index)] == max(by_piece[(a, b)].values())


def everything_model(path: Path) -> Path:
    """A real ConvStack3D checkpoint whose every voxel is object (last bias +10): each piece floods wholly."""
    torch.manual_seed(0)
    model = ConvStack3D(depth=1, features=2, fov=(7, 7, 7))
    with torch.no_grad():
        model.conv_lom.weight.zero_()
        model.conv_lom.bias.fill_(10.0)
    torch.save({"model": model.state_dict(), "model_args": {"depth": 1, "features": 2, "fov": [7, 7, 7],
                                                             "deltas": [2, 2, 2]}}, path)
    return path


def segment_command_setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A 24x30x30 noise volume at ``tmp_path``/vol.h5:image, the every-voxel model's checkpoint, and the
    environment for an ``hpctrain ffn segment`` subprocess (this repository, one thread, no rank variables)."""
    image = np.random.default_rng(1).integers(100, 200, (24, 30, 30)).astype(np.uint8)
    with h5py.File(tmp_path / "vol.h5", "w") as f:
        f["image"] = image
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return everything_model(tmp_path / "m.pt"), env


@pytest.mark.slow
def test_segment_command_in_pieces_on_two_ranks_equals_one_process(tmp_path: Path) -> None:
    ckpt, env = segment_command_setup(tmp_path)
    outs = {}
    for ranks in (2, 1):
        out = tmp_path / f"seg{ranks}.h5"
        proc = subprocess.run([sys.executable, "-m", "hpctrain", "ffn", "segment", str(ckpt),
                               f"{tmp_path}/vol.h5:image", "-o", str(out), "--subvolumes", "2", "2", "2",
                               "--overlap", "4", "--ranks", str(ranks),
                               "--min-segment-size", "10"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=500, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "pieces: 8" in proc.stdout and "Traceback" not in proc.stderr
        if ranks == 2:
            assert "rank 1 of 2: 4 pieces segmented" in proc.stdout
        assert not (tmp_path / f"seg{ranks}.parts").exists()  # removed after reconciling
        with h5py.File(out) as f:
            outs[ranks] = f["segmentation"][()]
    assert np.array_equal(outs[1], outs[2])  # the ranks' pieces are exactly the in-process ones
    joined = [int(line.split()[-1]) for line in proc.stdout.splitlines() if line.startswith("joined_pairs:")]
    assert joined and joined[0] > 0 and outs[1].max() > 0


@pytest.mark.slow
def test_segment_command_agglomerates_and_fills_after_the_ranks_reconcile(tmp_path: Path) -> None:
    """``--job`` settings with bounded floods, agglomeration and fill: the 2 ranks flood their pieces, the
    pieces are reconciled, the ranks score their pairs and fill their boxes, and one table joins them. The
    every-voxel model claims every neighbour, so all floods end as one object covering the volume."""
    import yaml

    ckpt, env = segment_command_setup(tmp_path)
    job = yaml.safe_load((REPO / "jobs/ffn-local.yaml").read_text())
    job["data"]["eval"]["inference"] = {"min_segment_size": 10, "max_seed_distance": 2, "agglomerate_threshold": 0.5,
                                        "watershed_fill": True}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out = tmp_path / "seg.h5"
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "ffn", "segment", str(ckpt), f"{tmp_path}/vol.h5:image",
                           "-o", str(out), "--subvolumes", "2", "2", "2", "--overlap", "4", "--ranks", "2",
                           "--job", str(tmp_path / "job.yaml"), "--keep-parts"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=500, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 1 of 2: 4 pieces segmented" in proc.stdout and "rank 1 of 2: 4 pieces finished" in proc.stdout
    with h5py.File(tmp_path / "seg.parts" / OVERSEGMENTATION) as f:
        floods = f["segmentation"][()]
    with h5py.File(out) as f:
        seg = f["segmentation"][()]
    summary = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert floods.max() > 8 and int(summary["agglomerated_pairs"]) > 8  # many floods, joined by the FFN's claims
    assert np.all(seg == 1)


class CountingOracle(OracleModel):
    """The oracle, recording the batch size of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(int(x.shape[0]))
        return super().forward(x)


def test_pieces_flooded_together_equal_each_alone() -> None:
    from hpctrain.ffn.inference.runner import segment_volumes_together

    image, _ = painted_volume((24, 40, 40), seed=6)
    pieces = [image[:, :24, :24], image[:, 16:, :24], image[:, 8:32, 16:]]
    cfg = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=30, seed_policy="grid",
                          seed_args={"step": 6, "offsets": (0, 3)}, reseed_passes=1)
    model = CountingOracle()
    together = segment_volumes_together(model, pieces, cfg)
    assert max(model.batches) == 3 and min(model.batches) >= 1  # FOVs of all three shared model calls
    calls_together = len(model.batches)
    alone = [segment_volume(model, piece, cfg) for piece in pieces]
    for a, b in zip(together, alone, strict=True):
        assert np.array_equal(a, b)
    assert sum(int(a.max()) for a in together) > len(pieces)  # objects were segmented
    assert calls_together < len(model.batches) - calls_together  # fewer calls than one piece at a time
