"""FFN inference: face-max movement, seed policies, the flood-filling canvas and the segment command.

Stand-in models obey the ConvStack3D contract ((N, 2, Z, Y, X) image + seed logits in, (N, 1, Z, Y, X) logits
out) and are honest tests of the canvas mechanics; the real ConvStack3D is used for the checkpoint path.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from hpctrain.config.plugins.ffn_inference import FloodSettings, InferenceConfig
from hpctrain.errors import CheckpointError, ConfigError, RuntimeFailure
from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
from hpctrain.ffn.inference.canvas import Canvas
from hpctrain.ffn.inference.runner import load_model, pieces_and_claims, run_segment, segment_volume
from hpctrain.ffn.inference.seeds import grid_seeds, make_seeds, peak_seeds, within_margin
from hpctrain.ffn.logits import logit
from hpctrain.ffn.movement import FaceMaxMovementPolicy, face_max_offsets, quantize_position
from hpctrain.ffn.segmentation import clear_dust, make_labels_contiguous, split_disconnected, write_segmentation_hdf5

torch.set_num_threads(1)


def _centre_distance(shape: tuple[int, ...]) -> torch.Tensor:
    axes = [torch.arange(d, dtype=torch.float32) - d // 2 for d in shape]
    zz, yy, xx = torch.meshgrid(*axes, indexing="ij")
    return (zz**2 + yy**2 + xx**2).sqrt()


class OracleModel(nn.Module):
    """Object = FOV voxels whose image value equals that of the voxels the seed already marks (logit > 0).

    Confidence falls off slightly with the distance from the FOV centre (as a trained FFN's does), so face
    maxima are unique rather than ties broken at a face corner.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        img, seed = x[:, 0], x[:, 1]
        conf = 8.0 - 0.05 * _centre_distance(tuple(seed.shape[1:]))
        out = torch.full_like(seed, -8.0)
        for n in range(x.shape[0]):
            marked = seed[n] > 0
            if bool(marked.any()):
                value = img[n][marked].median()
                out[n] = torch.where((img[n] - value).abs() < 1e-3, conf, torch.tensor(-8.0))
        return out[:, None]


class BallModel(nn.Module):
    """Predicts a ball of ``radius`` around the FOV centre, whatever the input."""

    def __init__(self, radius: float) -> None:
        super().__init__()
        self.radius = radius

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = _centre_distance(tuple(x.shape[2:]))
        out = torch.where(d <= self.radius, 8.0, -8.0)
        return out.expand(x.shape[0], 1, *x.shape[2:]).clone()


class ConstantModel(nn.Module):
    def __init__(self, value: float, shrink: bool = False) -> None:
        super().__init__()
        self.value = value
        self.shrink = shrink

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(x[:, :1], self.value)
        return out[..., 1:] if self.shrink else out


def cubes_volume() -> tuple[np.ndarray, np.ndarray]:
    """8 cubes of 17³ with distinct intensities in a 40³ volume, 2-voxel dark membranes and border."""
    image = np.zeros((40, 40, 40), np.uint8)
    labels = np.zeros((40, 40, 40), np.uint32)
    k = 1
    for a in (slice(2, 19), slice(21, 38)):
        for b in (slice(2, 19), slice(21, 38)):
            for c in (slice(2, 19), slice(21, 38)):
                image[a, b, c] = 40 + 20 * k
                labels[a, b, c] = k
                k += 1
    return image, labels


# --------------------------------------------------------------------------- movement
def test_face_max_offsets_hand_made_map() -> None:
    prob = np.zeros((9, 9, 9), np.float64)  # float64 so that 0.90 equals the threshold exactly
    prob[6, 5, 2] = 0.95  # +z face (z = 4 + 2): face pos (y 5-1, x 2-1) -> rel (1, -2)
    prob[3, 1, 7] = 0.92  # on both the -y face (y = 4 - 3) and the +x face (x = 4 + 3): one move
    prob[2, 4, 4] = 0.90  # -z face centre, exactly at the threshold: kept (>=)
    prob[4, 4, 1] = 0.85  # -x face, below threshold
    prob[8, 4, 4] = 0.99  # outside the +/- deltas cuboid: never read
    got = face_max_offsets(prob, (2, 3, 3), 0.9)
    assert [off for _, off in got] == [(2, 1, -2), (-1, -3, 3), (-2, 0, 0)]
    assert [s for s, _ in got] == pytest.approx([0.95, 0.92, 0.90])


def test_face_max_offsets_zero_delta_axis_and_bad_deltas() -> None:
    prob = np.full((5, 5, 5), 0.99, np.float32)
    offsets = [off for _, off in face_max_offsets(prob, (0, 2, 2), 0.5)]
    assert all(off[0] == 0 for off in offsets) and len(offsets) > 0
    with pytest.raises(ValueError, match="do not fit"):
        face_max_offsets(prob, (3, 1, 1), 0.5)


def test_quantize_position_centres_start_in_its_cell() -> None:
    assert quantize_position((10, 10, 10), (10, 10, 10), (4, 4, 4)) == (0, 0, 0)
    assert quantize_position((8, 11, 12), (10, 10, 10), (4, 4, 4)) == (0, 0, 1)
    assert quantize_position((7, 10, 10), (10, 10, 10), (4, 4, 4)) == (-1, 0, 0)


@pytest.mark.parametrize(("order", "first"), [("fifo", (10, 10, 14)), ("score", (10, 10, 6))])
def test_movement_policy_order_and_visited_cells(order: str, first: tuple[int, int, int]) -> None:
    policy = FaceMaxMovementPolicy((2, 2, 2), 0.9, order=order)
    policy.reset((10, 10, 10))
    policy.update(np.zeros((5, 5, 5), np.float32), (10, 10, 10))  # marks cell (0, 0, 0); no moves
    policy.append(0.91, (10, 10, 9))  # same cell as the start: skipped
    policy.append(0.5, (10, 10, 14))
    policy.append(0.95, (10, 10, 6))
    assert policy.next_position(lambda p: True) == first
    rejected: list[tuple[int, int, int]] = []
    assert policy.next_position(lambda p: rejected.append(p) or False) is None
    assert (10, 10, 9) not in rejected and len(rejected) == 1


def test_movement_policy_update_queues_absolute_positions() -> None:
    policy = FaceMaxMovementPolicy((2, 2, 2), 0.9)
    policy.reset((20, 20, 20))
    prob = np.zeros((7, 7, 7), np.float32)
    prob[3, 3, 5] = 0.97
    policy.update(prob, (20, 20, 20))
    assert policy.next_position(lambda p: True) == (20, 20, 22)


# --------------------------------------------------------------------------- seeds
def test_peak_seeds_fall_inside_bright_blobs_deterministically() -> None:
    shape = (40, 48, 48)
    image = np.full(shape, 40, np.uint8)
    zz, yy, xx = np.indices(shape)
    centres = [(12, 14, 14), (26, 34, 14), (20, 24, 34)]
    blobs = []
    for c in centres:
        blob = (zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= 7**2
        image[blob] = 200
        blobs.append(blob)
    seeds = peak_seeds(image)
    assert seeds.dtype == np.int64 and seeds.shape[1] == 3
    np.testing.assert_array_equal(seeds, peak_seeds(image))  # same result on a second call
    assert [tuple(s) for s in seeds] == sorted(tuple(s) for s in seeds)
    for c, blob in zip(centres, blobs, strict=True):
        inside = [s for s in seeds if blob[tuple(s)]]
        assert inside, f"no seed in the blob at {c}"
        assert min(np.linalg.norm(np.array(s) - c) for s in inside) <= 2.0



def test_peak_seeds_in_distance_order_start_with_the_largest_interior() -> None:
    """order='distance' gives the same seeds, farthest from an edge first (the big blob's centre leads)."""
    shape = (40, 48, 48)
    image = np.full(shape, 40, np.uint8)
    zz, yy, xx = np.indices(shape)
    radii = {(12, 14, 14): 4, (26, 34, 14): 9, (20, 24, 36): 6}
    for c, r in radii.items():
        image[(zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= r**2] = 200
    by_zyx, by_distance = peak_seeds(image), peak_seeds(image, order="distance")
    assert sorted(map(tuple, by_distance)) == sorted(map(tuple, by_zyx))
    assert np.linalg.norm(by_distance[0] - np.array((26, 34, 14))) <= 2.0
    with pytest.raises(ValueError, match="order must be"):
        peak_seeds(image, order="size")

def test_grid_seeds_and_margin_filter() -> None:
    got = grid_seeds((4, 4, 4), step=2, offsets=(0, 1))
    first_pass = [(z, y, x) for z in (0, 2) for y in (0, 2) for x in (0, 2)]
    second_pass = [(z, y, x) for z in (1, 3) for y in (1, 3) for x in (1, 3)]
    assert [tuple(s) for s in got] == first_pass + second_pass
    kept = within_margin(got, (4, 4, 4), (1, 1, 1))
    assert [tuple(s) for s in kept] == [(2, 2, 2), (1, 1, 1)]
    with pytest.raises(ValueError, match="unknown seed policy"):
        make_seeds("random", np.zeros((4, 4, 4)))


# --------------------------------------------------------------------------- canvas
def test_oracle_segments_separable_cubes_exactly() -> None:
    image, labels = cubes_volume()
    cfg = InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=100)
    seg, canvas = segment_volume(OracleModel(), image, cfg, return_canvas=True)
    m = evaluate_segmentation(seg, labels)
    assert m["voi_split"] + m["voi_merge"] < 0.05
    assert m["adapted_rand_error"] < 0.01
    assert m["n_segments"] == 8 and m["unsegmented_fraction"] == 0.0
    assert not np.any(seg[labels == 0])  # membranes stay unsegmented
    assert len(canvas.origins) == 8 and all(o["size"] == 17**3 for o in canvas.origins.values())


def test_seeds_in_segmented_voxels_are_skipped() -> None:
    image, _ = cubes_volume()
    canvas = Canvas(OracleModel(), image, FloodSettings(fov=9, deltas=3, min_segment_size=100))
    canvas.segment_all([(10, 10, 10), (12, 12, 12), (10, 10, 29)])
    assert sorted(canvas.origins) == [1, 2]
    assert canvas.origins[1]["seed"] == (10, 10, 10) and canvas.origins[2]["seed"] == (10, 10, 29)


def test_overlap_keeps_earlier_object_and_is_recorded() -> None:
    image = np.zeros((30, 30, 30), np.uint8)
    canvas = Canvas(BallModel(4.0), image, FloodSettings(fov=11, deltas=5, min_segment_size=10))
    canvas.segment_all([(15, 15, 12), (15, 15, 18)])  # balls of radius 4, centres 6 apart
    zz, yy, xx = np.indices(image.shape)
    ball1 = (zz - 15) ** 2 + (yy - 15) ** 2 + (xx - 12) ** 2 <= 16
    ball2 = (zz - 15) ** 2 + (yy - 15) ** 2 + (xx - 18) ** 2 <= 16
    seg = canvas.labels()
    np.testing.assert_array_equal(seg == 1, ball1)
    np.testing.assert_array_equal(seg == 2, ball2 & ~ball1)
    assert canvas.overlaps[2] == {1: int((ball1 & ball2).sum())}


def test_small_and_weak_objects_are_dropped() -> None:
    image = np.zeros((20, 20, 20), np.uint8)
    small = Canvas(BallModel(1.0), image, FloodSettings(fov=7, deltas=2, min_segment_size=10))  # a 7-voxel ball
    small.segment_all([(10, 10, 10)])
    assert small.origins == {} and small.segmentation[10, 10, 10] == -1
    assert small.counters["failed_too_small"] == 1 and small.labels().max() == 0
    weak = Canvas(ConstantModel(-8.0), image, FloodSettings(fov=7, deltas=2, min_segment_size=1))
    weak.segment_all([(10, 10, 10), (2, 10, 10)])  # the second is too close to the border: skipped
    assert weak.counters == {"ffn_calls": 1, "flood_fovs": 1, "failed_weak_seed": 1, "skip_invalid_pos": 1}


def test_canvas_rejects_bad_geometry_and_bad_model_output() -> None:
    image = np.zeros((20, 20, 20), np.uint8)
    with pytest.raises(ConfigError, match="deltas"):
        Canvas(ConstantModel(0.0), image, FloodSettings(fov=7, deltas=4))
    with pytest.raises(ConfigError, match="odd"):
        InferenceConfig.from_mapping({"fov": 8, "deltas": 2})
    canvas = Canvas(ConstantModel(8.0, shrink=True), image, FloodSettings(fov=7, deltas=2))
    with pytest.raises(RuntimeFailure, match="returned shape"):
        canvas.segment_all([(10, 10, 10)])


def test_config_from_mapping_lists_valid_keys() -> None:
    cfg = InferenceConfig.from_mapping({"fov": 9, "deltas": [2, 3, 3]})
    assert cfg.flood.fov == (9, 9, 9) and cfg.flood.deltas == (2, 3, 3)
    assert InferenceConfig.from_mapping(cfg.flat()) == cfg and cfg.replace(linkage="average").joins.linkage == "average"
    with pytest.raises(ConfigError, match="valid keys: fov"):
        InferenceConfig.from_mapping({"move_treshold": 0.8})


def test_segmentation_helpers() -> None:
    seg = np.array([0, 5, 5, 9, 7, 7, 7], np.int64)
    cleared = clear_dust(seg, 2)
    np.testing.assert_array_equal(cleared, [0, 5, 5, 0, 7, 7, 7])
    np.testing.assert_array_equal(seg, [0, 5, 5, 9, 7, 7, 7])  # the input is left as it is
    seg = cleared
    np.testing.assert_array_equal(make_labels_contiguous(seg), [0, 1, 1, 0, 2, 2, 2])
    np.testing.assert_array_equal(make_labels_contiguous(np.array([4, 4, 9])), [1, 1, 2])
    assert logit(0.5) == 0.0


def test_split_disconnected_by_hand() -> None:
    seg = np.zeros((3, 4, 6), np.int64)
    seg[0, 0, 0:3] = 5  # object 5: a 3-voxel run ...
    seg[2, 3, 5] = 5  # ... and a stray voxel far away
    seg[1, 1, 1] = 9  # object 9: two voxels touching only along an edge (not 6-connected)
    seg[1, 2, 2] = 9
    seg[2, 0, 3:6] = 2  # object 2: connected
    seg[2, 1, 3] = 2
    out = split_disconnected(seg)
    assert out.dtype == np.uint32 and np.array_equal(out == 0, seg == 0)
    # components numbered in the order of the objects' ids, then of their first voxel
    assert set(out[seg == 2]) == {1} and set(out[0, 0, 0:3]) == {2} and out[2, 3, 5] == 3
    assert {out[1, 1, 1], out[1, 2, 2]} == {4, 5}
    kept = split_disconnected(seg, min_size=3)
    assert set(np.unique(kept)) == {0, 1, 2} and set(kept[seg == 2]) == {1} and set(kept[0, 0, 0:3]) == {2}
    assert kept[2, 3, 5] == 0 and kept[1, 1, 1] == 0  # components under min_size are left unsegmented
    assert split_disconnected(np.zeros((2, 2, 2), np.int64)).max() == 0


class BallAndStrayModel(nn.Module):
    """A ball of radius 2.5 at the FOV centre (short of the move positions 3 voxels out: the flood stays one
    FOV) and a stray 2×2×2 cube at a corner of the FOV, whatever the input:
    a flood whose box holds voxels above the segment threshold that are not connected to its seed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.where(_centre_distance(tuple(x.shape[2:])) <= 2.5, 8.0, -8.0)
        out[:2, :2, :2] = 8.0
        return out.expand(x.shape[0], 1, *x.shape[2:]).clone()


def test_split_pieces_leaves_a_flood_only_its_connected_part() -> None:
    """The canvas keeps the reference's object (every voxel of the flood's box at or above the threshold), so the
    stray cube is part of the flood's object; with ``split_pieces`` it is a component of 8 voxels, under the
    minimum size, and left unsegmented before any join or fill."""
    image = np.zeros((21, 21, 21), np.uint8)
    base = InferenceConfig(fov=(11, 11, 11), deltas=(3, 3, 3), min_segment_size=20, max_seed_distance=0)
    canvas = Canvas(BallAndStrayModel(), image, base.flood)
    canvas.segment_all([(10, 10, 10)])
    raw, _ = pieces_and_claims(canvas, base.joins)
    split, _ = pieces_and_claims(canvas, base.replace(split_pieces=True).joins)
    assert raw[5, 5, 5] == raw[10, 10, 10] == 1  # the stray cube at the first FOV's corner: the same object
    assert split[10, 10, 10] == 1 and split[5, 5, 5] == 0
    assert int((raw == 1).sum()) - int((split == 1).sum()) == 8
    assert InferenceConfig.from_mapping({"split_pieces": True}).joins.split_pieces


# --------------------------------------------------------------------------- checkpoint + command
def _save_checkpoint(path, model: nn.Module, model_args: dict) -> None:
    torch.save({"model": model.state_dict(), "model_args": model_args}, path)


def test_run_segment_with_convstack_checkpoint(tmp_path) -> None:
    from hpctrain.ffn.model import ConvStack3D
    from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5

    torch.manual_seed(0)
    model_args = {"depth": 2, "features": 4, "fov": [9, 9, 9], "deltas": [3, 3, 3]}
    model = ConvStack3D(depth=2, features=4, fov=(9, 9, 9))
    ckpt = tmp_path / "ckpt.pt"
    _save_checkpoint(ckpt, model, model_args)
    image, _ = make_synthetic_volume((20, 24, 24), seed=1)
    write_hdf5(tmp_path / "vol.h5", image, np.zeros_like(image, np.uint32))

    cfg = {"min_segment_size": 5, "seed_policy": "grid", "seed_args": {"step": 6, "offsets": [4]}}
    summary = run_segment(ckpt, f"{tmp_path / 'vol.h5'}:image", tmp_path / "out" / "seg.h5:seg", config=cfg)
    with h5py.File(tmp_path / "out" / "seg.h5", "r") as f:
        written = f["seg"][...]
        assert f["seg"].attrs["checkpoint"] == str(ckpt)
        assert '"fov": [9, 9, 9]' in f["seg"].attrs["config"]
    assert written.shape == image.shape and written.dtype == np.uint32
    assert summary["objects"] == int(written.max()) and summary["ffn_calls"] > 0

    # Same numbers as running the canvas directly with the same weights and settings.
    loaded, args, _ = load_model(ckpt)
    direct = segment_volume(loaded, image, InferenceConfig.from_mapping({**cfg, "fov": 9, "deltas": 3}))
    np.testing.assert_array_equal(written, direct)
    assert args["deltas"] == [3, 3, 3]


def test_bfloat16_inference_gives_float32_logits_within_rounding_and_segments(tmp_path) -> None:
    """``precision: bfloat16`` (inference settings): the model's forward under autocast, its logits float32 and
    within bfloat16's rounding of the float32 model's; ``auto`` follows the hardware; a bad name is refused."""
    from hpctrain.ffn.inference.runner import prepare_inference
    from hpctrain.ffn.model import ConvStack3D
    from hpctrain.ffn.perf import BFloat16Inference
    from hpctrain.ffn.synthetic import make_synthetic_volume
    from hpctrain.runtime.precision import native_bf16

    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt.pt"
    model = ConvStack3D(depth=2, features=8, fov=(9, 9, 9))
    with torch.no_grad():
        model.conv_lom.bias.fill_(30.0)  # every voxel object: each flood visits what it can reach
    _save_checkpoint(ckpt, model, {"depth": 2, "features": 8, "fov": [9, 9, 9], "deltas": [3, 3, 3]})
    full, _, _ = prepare_inference(ckpt, {})
    half, cfg, _ = prepare_inference(ckpt, {"precision": "bfloat16"})
    untuned, _, _ = prepare_inference(ckpt, {"precision": "bfloat16"}, tune=False)
    auto, auto_cfg, _ = prepare_inference(ckpt, {"precision": "auto"})
    assert auto_cfg.execution.precision == ("bfloat16" if native_bf16(torch.device("cpu")) else "float32")  # what ran
    assert isinstance(half, BFloat16Inference) and isinstance(untuned, BFloat16Inference)
    assert not isinstance(full, BFloat16Inference)
    assert isinstance(auto, BFloat16Inference) is native_bf16(torch.device("cpu"))
    x = torch.randn(3, 2, 9, 9, 9)
    with torch.inference_mode():
        want, got, got_untuned = full(x), half(x), untuned(x)
    assert got.dtype == got_untuned.dtype == torch.float32
    assert not torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
    torch.testing.assert_close(got, got_untuned)  # channels-last changes only the layout
    image, _ = make_synthetic_volume((20, 24, 24), seed=1)
    settings = cfg.replace(min_segment_size=5, seed_policy="grid", seed_args={"step": 6, "offsets": [4]},
                           max_seed_distance=4)
    seg = segment_volume(half, image, settings)
    # Several bounded floods through the bfloat16 model, covering the volume as the float32 model's do (where they
    # go differs: bfloat16 rounds the logits the movement policy compares into ties).
    assert seg.max() > 1
    assert (seg > 0).mean() == pytest.approx((segment_volume(full, image, settings) > 0).mean(), abs=0.1)
    with pytest.raises(ConfigError, match=r"precision: Input should be 'float32', 'bfloat16' or 'auto' \(got 'fp16'\)"):
        InferenceConfig.from_mapping({"precision": "fp16"})


def test_zero_weight_convstack_passes_the_seed_through(tmp_path) -> None:
    from hpctrain.ffn.model import ConvStack3D

    model = ConvStack3D(depth=1, features=2, fov=(7, 7, 7))
    for p in model.parameters():
        nn.init.zeros_(p)
    image = np.random.default_rng(0).integers(0, 255, (16, 16, 16), dtype=np.uint8)
    canvas = Canvas(model, image, FloodSettings(fov=7, deltas=2, min_segment_size=1))
    canvas.segment_all([(8, 8, 8)])
    # output = seed logits: only the seed voxel is above the segment threshold; no move passes 0.9.
    assert canvas.counters["ffn_calls"] == 1
    assert canvas.labels().sum() == 1 and canvas.labels()[8, 8, 8] == 1


def test_load_model_errors_name_the_fix(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "missing.pt")
    bad = tmp_path / "bad.pt"
    torch.save({"state": {}}, bad)
    with pytest.raises(CheckpointError, match="'model_args'"):
        load_model(bad)


def test_write_segmentation_hdf5_round_trip(tmp_path) -> None:
    seg = np.arange(24, dtype=np.uint32).reshape(2, 3, 4)
    out = write_segmentation_hdf5(tmp_path / "s.h5", seg, {"n": 3, "cfg": {"a": [1, "x"]}, "fov": [9, 9, 9]})
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["segmentation"][...], seg)
        assert f["segmentation"].attrs["n"] == 3
        assert f["segmentation"].attrs["cfg"] == '{"a": [1, "x"]}'
        assert list(f["segmentation"].attrs["fov"]) == [9, 9, 9]
    assert [p.name for p in tmp_path.iterdir()] == ["s.h5"]  # no temporary left behind


class LeakyOracle(nn.Module):
    """Strict from a bare seed (voxels of the seed's own intensity), leaky once the seed holds an object: then
    every voxel within 25 grey levels of it (normalised 25/33) counts, as a trained FFN copying its canvas
    across a faint membrane would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        img, seed = x[:, 0], x[:, 1]
        conf = 8.0 - 0.05 * _centre_distance(tuple(seed.shape[1:]))  # unique face maxima, as OracleModel
        out = torch.full_like(seed, -8.0)
        for n in range(x.shape[0]):
            marked = seed[n] > 0
            value = img[n][marked].median()
            tolerance = 1e-3 if int(marked.sum()) == 1 else 25 / 33
            out[n] = torch.where((img[n] - value).abs() < tolerance, conf, torch.tensor(-8.0))
        return out[:, None]


def test_self_prediction_check_stops_a_flood_at_a_faint_membrane() -> None:
    """Two slabs of intensity 60 and 80 touch through a membrane of 70: the leaky flood from the first takes
    both; with the check, a bare seed placed where the flood wants to move claims none of the first slab's
    voxels already in its FOV, so the move is refused: the first object keeps only the strip of the second
    that FOVs centred in its own slab saw, and the second slab is flooded from its own seed."""
    image = np.full((27, 27, 48), 60, np.uint8)
    image[:, :, 25:] = 80
    image[:, :, 23:25] = 70
    labels = np.where(image == 60, 1, np.where(image == 80, 2, 0)).astype(np.uint32)
    seeds = np.array([[13, 13, 8], [13, 13, 38]])
    base = {"fov": (9, 9, 9), "deltas": (3, 3, 3), "min_segment_size": 100}
    leaky = evaluate_segmentation(segment_volume(LeakyOracle(), image, InferenceConfig(**base), seeds=seeds), labels)
    assert leaky["n_segments"] == 1 and leaky["merging_segments"] == 1  # the second seed lay in the first object
    seg, canvas = segment_volume(LeakyOracle(), image, InferenceConfig(**base, self_prediction=0.5), seeds=seeds,
                                 return_canvas=True)
    m = evaluate_segmentation(seg, labels)
    assert m["n_segments"] == 2 and canvas.counters["self_prediction_rejects"] > 0
    second = next(o for o in m["objects"] if o["gt_id"] == 2)
    assert second["best_segment"] == 2 and second["overlap"] > 0.7
    assert m["adapted_rand_error"] < leaky["adapted_rand_error"] - 0.2
    with pytest.raises(ConfigError, match="unknown inference setting"):
        InferenceConfig.from_mapping({"self_predicton": 0.5})


# --------------------------------------------------------------------------- several objects at once
def _cells_volume(shape: tuple[int, int, int], cells: int, seed: int) -> np.ndarray:
    """Voronoi cells with random intensities, a few of them close enough for a leaky flood to cross."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 1, (cells, 3)) * np.array(shape)
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1).astype(np.float32)
    owner = np.argmin(((grid[..., None, :] - centres) ** 2).sum(-1), axis=-1)
    values = rng.choice(np.arange(40, 220, 12), cells)
    return values[owner].astype(np.uint8)


class _BatchSizes(nn.Module):
    """Wraps a model and records the batch size of every call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.sizes = model, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(int(x.shape[0]))
        return self.model(x)


@pytest.mark.parametrize(("width", "speculative"), [(2, False), (4, False), (1, True), (3, True)])
def test_objects_flooded_at_once_are_the_objects_flooded_one_at_a_time(width: int, speculative: bool) -> None:
    """Bounded, leaky floods with the self-prediction check and reseed passes over Voronoi cells: every object, id,
    overlap and counter is the same whether 1 or ``width`` objects are in flight, and whether each move's seeded FOV
    is asked with its check's bare-seed FOV or after it; the batches prove they were. (LeakyOracle computes each
    FOV on its own, so a batch changes no float.)"""
    image = _cells_volume((30, 64, 64), 40, seed=5)
    cfg = {"fov": (9, 9, 9), "deltas": (3, 3, 3), "min_segment_size": 30, "max_seed_distance": 4,
           "self_prediction": 0.5, "reseed_passes": 2, "seed_args": {"order": "distance"}}
    one = _BatchSizes(LeakyOracle())
    seg1, canvas1 = segment_volume(one, image, InferenceConfig(**cfg), return_canvas=True)
    many = _BatchSizes(LeakyOracle())
    seg2, canvas2 = segment_volume(many, image, InferenceConfig(**cfg, concurrent_floods=width,
                                                                speculative_self_prediction=speculative),
                                   return_canvas=True)
    assert set(one.sizes) == {1} and max(many.sizes) > 1 and max(many.sizes) <= width * (1 + speculative)
    wasted = canvas1.counters["self_prediction_rejects"] if speculative else 0  # seeded FOVs of refused moves
    assert sum(many.sizes) == sum(one.sizes) + wasted and len(many.sizes) < 0.9 * len(one.sizes)
    assert np.array_equal(canvas1.segmentation, canvas2.segmentation) and np.array_equal(seg1, seg2)
    strip = [{k: v for k, v in o.items() if k != "seconds"} for o in canvas1.origins.values()]
    assert strip == [{k: v for k, v in o.items() if k != "seconds"} for o in canvas2.origins.values()]
    assert list(canvas1.origins) == list(canvas2.origins) and canvas1.overlaps == canvas2.overlaps
    # every counter the same, but the FOVs the model was asked: the speculative ones of refused moves are more
    assert (canvas1.counters["flood_fovs"], canvas2.counters["flood_fovs"]) == (sum(one.sizes), sum(many.sizes))
    assert ({k: v for k, v in canvas1.counters.items() if k != "flood_fovs"}
            == {k: v for k, v in canvas2.counters.items() if k != "flood_fovs"})
    assert len(canvas1.origins) >= 15 and any(canvas1.overlaps.values())  # many objects, and they compete
    assert canvas1.counters["self_prediction_rejects"] > 0 and np.isnan(canvas2.seed).all()


def test_unbounded_floods_go_one_at_a_time() -> None:
    """Without max_seed_distance a flood may reach anywhere: concurrent_floods cannot apply."""
    image, _ = cubes_volume()
    model = _BatchSizes(OracleModel())
    segment_volume(model, image, InferenceConfig(fov=(9, 9, 9), deltas=(3, 3, 3), min_segment_size=100,
                                                 concurrent_floods=4))
    assert set(model.sizes) == {1}
    with pytest.raises(ConfigError, match="concurrent_floods"):
        segment_volume(model, image, {"fov": (9, 9, 9), "deltas": (3, 3, 3), "concurrent_floods": 0})


def test_seed_order_lets_a_seed_go_first_only_clear_of_everything_before_it() -> None:
    from hpctrain.ffn.inference.batching import SeedOrder
    from hpctrain.ffn.inference.canvas import _Box, _Object

    def started(pos: tuple[int, int, int]) -> _Object:
        return _Object(start=pos, movement=None, visited=_Box.at(pos), written=_Box.at(pos), began=0.0)  # type: ignore[arg-type]

    seeds = [(10, 10, 10), (10, 10, 15), (10, 10, 40), (10, 10, 20)]
    order = SeedOrder(seeds, reach=(3, 3, 3), window=8)  # clash: within 6 voxels on every axis
    assert order.take() == (0, seeds[0])
    a = started(seeds[0])
    order.started(0, a)
    # Seed 1 lies within 6 of seed 0 (waits); seed 2 is clear of both; seed 3 is clear of 0 but not of waiting 1.
    assert order.take() == (2, seeds[2])
    c = started(seeds[2])
    order.started(2, c)
    assert order.take() is None and order.waiting == [1, 3]
    c.done = True
    assert order.committable() == []  # seed 2 commits after seeds 0 and 1
    a.done = True
    assert order.committable() == [a]
    assert order.take() == (1, seeds[1])  # seed 1 first: seed 3 still clashes with it
    order.skipped(1)
    assert order.committable() == [c]
    assert order.take() == (3, seeds[3]) and order.take() is None
    order.skipped(3)
    assert order.finished()


def test_canvases_flooded_together_each_with_objects_at_once_match_each_alone() -> None:
    """Subvolume pieces in one process (``segment_volumes_together``) with ``concurrent_floods``: the model sees
    the FOVs of every object in flight on every canvas in one call, and each canvas ends as it would alone."""
    from hpctrain.ffn.inference.runner import segment_volumes_together

    image = _cells_volume((30, 64, 64), 40, seed=7)
    pieces = [image[:, :40, :], image[:, 24:, :]]
    cfg = {"fov": (9, 9, 9), "deltas": (3, 3, 3), "min_segment_size": 30, "max_seed_distance": 4,
           "self_prediction": 0.5, "reseed_passes": 1, "seed_args": {"order": "distance"}}
    alone = [segment_volume(LeakyOracle(), piece, InferenceConfig(**cfg)) for piece in pieces]
    model = _BatchSizes(LeakyOracle())
    together = segment_volumes_together(model, pieces, InferenceConfig(**cfg, concurrent_floods=3,
                                                                      speculative_self_prediction=True))
    assert max(model.sizes) > 2 * 2  # more FOVs in a call than one canvas with one object could ask
    for one, both in zip(alone, together, strict=True):
        assert np.array_equal(one, both) and one.max() >= 5


def test_both_ffn_schemas_read_a_zyx_the_same_way() -> None:
    """One integer is a cube, three are (z, y, x); a fractional size is refused by the training schema and the
    inference settings alike, not truncated."""
    from pydantic import ValidationError

    from hpctrain.config.plugins.ffn import FFNModelArgs

    assert FFNModelArgs(fov=9, deltas=[2, 3, 3]).fov == InferenceConfig(fov=9, deltas=[2, 3, 3]).flood.fov == (9, 9, 9)
    with pytest.raises(ValidationError, match="one integer or three"):
        FFNModelArgs(fov=[9.5, 9, 9])
    with pytest.raises(ConfigError, match="one integer or three"):
        InferenceConfig.from_mapping({"fov": [9.5, 9, 9]})
    with pytest.raises(ConfigError, match="one integer or three"):
        InferenceConfig.from_mapping({"min_boundary_dist": [True, 1, 1]})
