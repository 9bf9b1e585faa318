"""FFN training examples: movement policies, seed update, labels, augmentation, loss, clipping, a run."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.errors import DataError
from hpctrain.ffn.logits import logit
from hpctrain.ffn.model import ConvStack3D
from hpctrain.ffn.synthetic import make_synthetic_volume
from hpctrain.ffn.training.coordinates import build_coordinates, compute_partitions, lom_radius_for
from hpctrain.ffn.training.loss import clip_gradients_, edge_band, fov_loss
from hpctrain.ffn.training.moves import crop, fixed_offsets, fixed_shifts, max_pred_offsets
from hpctrain.ffn.training.stream import (
    ExampleStream,
    FovBatch,
    StreamConfig,
    apply_transform,
    draw_transform,
    epoch_coordinates,
    load_example,
    make_seed,
    voxel_counts,
)

torch.set_num_threads(1)
HIGH, LOW = logit(0.95), logit(0.05)


def test_fixed_shifts_match_the_reference_order() -> None:
    shifts = fixed_shifts((1, 2, 3))
    assert len(shifts) == 26 and len(set(shifts)) == 26
    # FFNModel.shifts loops dx, dy, dz (x outermost); ours are (z, y, x).
    assert shifts[:3] == [(-1, -2, -3), (0, -2, -3), (1, -2, -3)]
    assert sorted(fixed_shifts((1, 2, 3), faces_only=True)) == sorted(
        [(-1, 0, 0), (1, 0, 0), (0, -2, 0), (0, 2, 0), (0, 0, -3), (0, 0, 3)]
    )


def test_fixed_offsets_on_a_hand_made_canvas_is_lazy() -> None:
    canvas = np.full((9, 9, 9), LOW, np.float32)
    canvas[4, 4, 4] = HIGH
    canvas[6, 4, 4] = logit(0.91)  # just above the 0.9 move threshold
    canvas[4, 2, 4] = logit(0.89)  # just below
    canvas[4, 4, 6] = HIGH
    shifts = [(2, 0, 0), (0, -2, 0), (0, 0, 2), (-2, 0, 0)]
    assert list(fixed_offsets(canvas.copy(), shifts)) == [(0, 0, 0), (2, 0, 0), (0, 0, 2)]
    gen = fixed_offsets(canvas, shifts)
    assert next(gen) == (0, 0, 0)
    canvas[2, 4, 4] = HIGH  # a prediction written after the first step opens the -z move
    canvas[4, 4, 6] = LOW  # and closes the +x one
    assert list(gen) == [(2, 0, 0), (-2, 0, 0)]


def test_max_pred_offsets_follows_the_prediction() -> None:
    fov, deltas = (5, 5, 5), (2, 2, 2)
    canvas = make_seed((13, 13, 13))  # fov + 4 * deltas: room for two moves
    gen = max_pred_offsets(canvas, fov, deltas)
    assert next(gen) == (0, 0, 0)
    canvas[6, 6, 8] = HIGH  # +x face of the first FOV
    assert next(gen) == (0, 0, 2)
    canvas[6, 6, 6] = HIGH  # moving back would revisit the quantised start: skipped
    canvas[6, 7, 10] = HIGH  # +x face of the second FOV, one voxel off in y
    assert next(gen) == (0, 1, 4)
    assert list(gen) == []  # the next +x move would leave the 13³ box


def test_load_example_soft_labels_and_bounds() -> None:
    labels = np.zeros((11, 11, 11), np.uint32)
    labels[:, :5] = 3
    labels[:, 6:] = 4
    image = np.full((11, 11, 11), 161, np.uint8)
    img, soft = load_example(image, labels, (5, 3, 5), (5, 5, 5), image_mean=128.0, image_stddev=33.0)
    assert img.shape == soft.shape == (5, 5, 5) and np.allclose(img, 1.0)
    assert np.all(soft[:, :4] == np.float32(0.95)) and np.all(soft[:, 4:] == np.float32(0.05))  # rows 1..5
    _, on_membrane = load_example(image, labels, (5, 5, 5), (5, 5, 5))
    assert np.all(on_membrane == np.float32(0.05))  # centre on label 0: nothing is the object
    with pytest.raises(DataError, match="margin >= \\(2, 2, 2\\)"):
        load_example(image, labels, (1, 5, 5), (5, 5, 5))


def test_permute_and_reflect_applies_one_transform_to_all() -> None:
    rng = np.random.default_rng(0)
    a = np.arange(3 * 4 * 4, dtype=np.float32).reshape(3, 4, 4)
    seen = set()
    for _ in range(30):
        x, y = apply_transform([a, 2 * a], *draw_transform(rng, (1, 2), (0, 1, 2)))
        assert np.array_equal(y, 2 * x) and x.shape == (3, 4, 4)
        assert sorted(x[0].ravel()) == sorted(a[0].ravel()) or sorted(x[0].ravel()) == sorted(a[2].ravel())
        seen.add(x.tobytes())
    assert len(seen) > 8  # permutations and reflections both happen


def _stream(batch_size: int = 1, **kw: object) -> ExampleStream:
    labels = np.ones((20, 20, 20), np.uint32)
    image = np.full((20, 20, 20), 128, np.uint8)
    cfg = StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=batch_size, shuffle_moves=False, **kw)
    return ExampleStream(image, labels, [(10, 10, 10)] * 3, cfg)


def test_seed_update_writes_predictions_where_the_fov_was() -> None:
    stream = _stream()
    first = stream.next_batch()
    assert first.offsets == [(0, 0, 0)]
    assert torch.equal(first.seed[0, 0], torch.from_numpy(make_seed((5, 5, 5))))
    assert first.inputs().shape == (1, 2, 5, 5, 5)
    stream.update(torch.full((1, 1, 5, 5, 5), 5.0))
    second = stream.next_batch()
    assert second.offsets == [(-2, -2, -2)]  # first of the reference's shifts; its centre now predicted
    expected = np.full((5, 5, 5), LOW, np.float32)
    expected[2:, 2:, 2:] = 5.0  # the overlap with the first FOV (canvas 9³, first FOV at 2..6)
    assert np.array_equal(second.seed[0, 0].numpy(), expected)
    stream.update(torch.full((1, 1, 5, 5, 5), -5.0))  # canvas[0:5, 0:5, 0:5] = -5
    # Next shift (0, -2, -2) has its centre (4, 2, 2) at -5 now: skipped. (2, -2, -2): centre (6, 2, 2) = 5.
    assert stream.next_batch().offsets == [(2, -2, -2)]


def test_stream_finishes_examples_and_ends_with_the_coordinates() -> None:
    stream = _stream(batch_size=2)
    steps = 0
    for batch in stream:
        assert len(batch.offsets) == 2
        stream.update(torch.full((2, 1, 5, 5, 5), 5.0))  # always "object": every move is valid
        steps += 1
    assert steps == 27  # centre + 26 shifts; the third coordinate cannot fill both slots
    assert stream.counts.examples == 2 and stream.examples_started == 3
    metrics = stream.counts.metrics()
    assert metrics["precision"] == 1.0 and metrics["recall"] == 1.0  # whole 9³ canvas predicted, all object


def test_epoch_coordinates_resume_where_they_left_off() -> None:
    coords = np.stack([np.arange(10)] * 3, axis=1)
    full = list(itertools.islice(epoch_coordinates(coords, 1, 2, seed=3), 12))
    resumed = list(itertools.islice(epoch_coordinates(coords, 1, 2, seed=3, start=7), 5))
    assert [c[0] for c in resumed] == [c[0] for c in full[7:12]]
    first_epoch = {c[0] for c in full[:5]}
    other_rank = {c[0] for c in itertools.islice(epoch_coordinates(coords, 0, 2, seed=3), 5)}
    assert first_epoch.isdisjoint(other_rank) and len(first_epoch | other_rank) == 10


def test_loss_metrics_and_clipping() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0]])
    labels = torch.tensor([[0.95, 0.05, 0.05, 0.95]])
    p = torch.sigmoid(logits)
    manual = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()
    torch.testing.assert_close(fov_loss(logits, labels), manual)
    # predicted object: voxels 0 and 2; true object: voxels 0 and 3 -> tp 1, fp 1, fn 1
    assert voxel_counts(logits, labels).metrics() == {"precision": 0.5, "recall": 0.5, "f1": 0.5}
    # at 0.9 (logit 2.197) nothing is predicted: no false positive, nothing found
    assert voxel_counts(logits, labels, threshold=0.9).metrics() == {"precision": 1.0, "recall": 0.0, "f1": 0.0}
    assert voxel_counts(torch.full((3,), -4.0), torch.full((3,), 0.05)).metrics()["f1"] == 1.0

    model = torch.nn.Linear(3, 2)
    model.weight.grad = torch.tensor([[5.0, -0.2, -9.0], [0.7, -0.71, 0.0]])
    model.bias.grad = None
    clip_gradients_(model, 0.7)
    assert torch.equal(model.weight.grad, torch.tensor([[0.7, -0.2, -0.7], [0.7, -0.7, 0.0]]))


def test_edge_band_and_the_boundary_weighted_loss_by_hand() -> None:
    # a 1 x 5 x 5 slab: the object is the left two columns; radius 1 marks the voxel on each side of the edge
    # (columns 1 and 2); column 0 touches only the FOV border, which is not an edge
    labels = torch.full((1, 1, 1, 5, 5), 0.05)
    labels[..., :2] = 0.95
    band = edge_band(labels, 1)[0, 0, 0]
    assert torch.equal(band, torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0]] * 5))
    assert edge_band(torch.full((1, 1, 3, 3, 3), 0.05), 1).sum() == 0  # no object: no edge
    logits = torch.linspace(-3, 3, 25).reshape(1, 1, 1, 5, 5)
    per_voxel = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    weights = 1 + 4.0 * band
    torch.testing.assert_close(fov_loss(logits, labels, 4.0, 1), (per_voxel[0, 0, 0] * weights).sum() / weights.sum())
    torch.testing.assert_close(fov_loss(logits, labels, 0.0, 1), per_voxel.mean())  # 0: the reference's loss


@pytest.mark.parametrize(("radius", "shape"), [(1, (2, 1, 7, 8, 9)), (2, (2, 1, 7, 8, 9)), (3, (2, 1, 7, 8, 9)),
                                             (5, (1, 2, 3, 4, 9))])
def test_edge_band_matches_a_voxel_by_voxel_reference(radius: int, shape: tuple[int, ...]) -> None:
    # the band as its definition says, voxel by voxel: some voxel of the cube around it (inside the FOV) is
    # object and some is not — against the separable 1-D maxes edge_band computes (the last case: two channels,
    # a radius wider than two of the axes)
    rng = np.random.default_rng(radius)
    labels = np.where(rng.random(shape) < 0.6, 0.95, 0.05)
    mask = labels > 0.5
    expected = np.zeros_like(labels)
    for n, c, z, y, x in itertools.product(*(range(s) for s in labels.shape)):
        cube = mask[n, c, max(0, z - radius):z + radius + 1, max(0, y - radius):y + radius + 1,
                    max(0, x - radius):x + radius + 1]
        expected[n, c, z, y, x] = float(cube.any() and not cube.all())
    band = edge_band(torch.from_numpy(labels).float(), radius)
    assert torch.equal(band, torch.from_numpy(expected).float())


def test_boundary_weight_reaches_the_task_and_bad_values_name_the_key() -> None:
    from hpctrain.config.plugins.ffn import SCHEMA
    from hpctrain.errors import ConfigError

    args = SCHEMA.parse_model_args({"boundary_weight": 4, "boundary_radius": 3})
    assert (args.boundary_weight, args.boundary_radius) == (4.0, 3)
    for key, bad in [("boundary_weight", -1), ("boundary_radius", 0), ("boundary_radius", 9)]:
        with pytest.raises(ConfigError, match=f"model_args.{key}"):
            SCHEMA.parse_model_args({key: bad})


def _one_process_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: FovBatch) -> dict:
    """The runtime's step on one process, no reduction: forward, ``fov_loss``, backward, clip, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(batch.inputs())
    loss = fov_loss(logits, batch.labels)
    loss.backward()
    clip_gradients_(model, 0.7)
    optimizer.step()
    return {"loss": float(loss.detach()), "logits": logits.detach(), **voxel_counts(logits, batch.labels).metrics()}


@pytest.mark.timeout(120)
def test_short_training_lowers_the_loss() -> None:
    torch.manual_seed(0)
    image, labels = make_synthetic_volume((40, 56, 56), seed=1)
    fov, deltas = (17, 17, 17), (4, 4, 4)
    radius = lom_radius_for(fov, deltas)
    coords = build_coordinates(compute_partitions(labels, lom_radius=radius, min_size=300), radius, seed=0)
    cfg = StreamConfig(
        fov=fov, deltas=deltas, batch_size=2, image_mean=float(image.mean()), image_stddev=float(image.std())
    )
    stream = ExampleStream(image, labels, epoch_coordinates(coords, 0, 1, seed=0), cfg)
    model = ConvStack3D(depth=2, features=16, fov=fov)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(60):
        batch = stream.next_batch()
        out = _one_process_step(model, optimizer, batch)
        stream.update(out["logits"])
        losses.append(out["loss"])
        assert set(out) >= {"loss", "logits", "precision", "recall", "f1"}
    assert np.mean(losses[-15:]) < 0.7 * np.mean(losses[:15])
    assert stream.counts.examples > 5


def test_max_pred_moves_stream_uses_the_larger_box() -> None:
    labels = np.ones((30, 30, 30), np.uint32)
    image = np.full((30, 30, 30), 128, np.uint8)
    cfg = StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=1, policy="max_pred_moves")
    assert cfg.training_size() == (13, 13, 13)
    stream = ExampleStream(image, labels, [(15, 15, 15)], cfg)
    offsets = []
    for batch in stream:
        offsets.append(batch.offsets[0])
        stream.update(torch.full((1, 1, 5, 5, 5), 5.0))
    assert offsets[0] == (0, 0, 0) and len(offsets) == len(set(offsets)) > 6
    assert all(max(abs(v) for v in off) <= 4 for off in offsets)  # FOV stays inside the 13³ box


def test_single_fov_examples_are_one_bare_seed_fov_each_then_the_policy_moves() -> None:
    """The first ``single_fov_examples`` examples (counting ``examples_before``) give only their centre FOV even
    where the fixed policy would move (everything predicted inside); later ones move as usual."""
    labels = np.ones((30, 30, 30), np.uint32)
    image = np.full((30, 30, 30), 128, np.uint8)
    coords = [(15, 15, 15)] * 50

    def offsets_per_example(stream: ExampleStream, steps: int) -> list[list[tuple[int, int, int]]]:
        examples: list[list[tuple[int, int, int]]] = []
        started = 0
        for _ in range(steps):
            batch = stream.next_batch()
            if stream.examples_started != started:
                started = stream.examples_started
                examples.append([])
            examples[-1].append(batch.offsets[0])
            stream.update(torch.full((1, 1, 5, 5, 5), 5.0))  # p > 0.99: every fixed-policy move is taken
        return examples

    cfg = StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=1, single_fov_examples=3)
    examples = offsets_per_example(ExampleStream(image, labels, iter(coords), cfg), 3 + 27 + 1)
    assert examples[:3] == [[(0, 0, 0)]] * 3
    assert len(examples[3]) == 27 and examples[3][0] == (0, 0, 0)  # the centre and all 26 shifts
    resumed = ExampleStream(image, labels, iter(coords), cfg, examples_before=2)
    examples = offsets_per_example(resumed, 1 + 27)
    assert examples[0] == [(0, 0, 0)] and len(examples[1]) == 27


@pytest.mark.processes
def test_one_step_on_two_ranks_equals_one_rank_on_the_whole_batch(tmp_path: Path) -> None:
    """Data parallel FFN step (mean combiner, gloo, 2 real processes) = single process on the full batch."""
    repo = Path(__file__).resolve().parents[1]
    helper = repo / "tests" / "mp_helpers" / "ffn_step.py"
    env = {**os.environ, "PYTHONPATH": str(repo)}
    for ranks in (1, 2):
        out = subprocess.run([sys.executable, "-m", "hpctrain.submission.launchers.local_launch",
                              "--nprocs", str(ranks), "--",
                              sys.executable, str(helper), str(tmp_path / f"r{ranks}.pt"), "4"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    one, two = torch.load(tmp_path / "r1.pt"), torch.load(tmp_path / "r2.pt")
    torch.manual_seed(0)  # the helper's initial weights
    initial = ConvStack3D(depth=2, features=8, fov=(9, 9, 9))
    assert any(not torch.equal(one[k], initial.state_dict()[k]) for k in one)  # the step changed something
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-6)


def test_training_example_options_come_from_model_args_and_bad_ones_name_the_key() -> None:
    from hpctrain.errors import ConfigError
    from hpctrain.ffn.training.task import model_config, stream_options

    args = {"fov": 15, "deltas": 3, "fov_policy": "max_pred_moves", "fov_moves": 2, "faces_only": True,
            "move_threshold": 0.8, "permutable_axes": [0, 1, 2], "reflectable_axes": [1, 2]}
    assert model_config(args)["fov"] == (15, 15, 15)  # the options are accepted beside the model's keys
    opts = stream_options(args)
    cfg = StreamConfig(fov=(15, 15, 15), deltas=(3, 3, 3), **opts)
    assert (cfg.policy, cfg.fov_moves, cfg.faces_only, cfg.threshold) == ("max_pred_moves", 2, True, 0.8)
    assert cfg.permutable_axes == (0, 1, 2) and cfg.reflectable_axes == (1, 2)
    assert stream_options({"depth": 4}) == {}
    assert model_config({"single_fov_steps": 100}) and stream_options({"single_fov_steps": 100}, 4) == {
        "single_fov_examples": 400}  # one FOV per example and step: steps x batch per rank
    for key, bad in [("fov_policy", "random"), ("fov_moves", 0), ("faces_only", "yes"), ("move_threshold", 1.0),
                     ("permutable_axes", [0, 0]), ("reflectable_axes", [3]), ("single_fov_steps", -1),
                     ("single_fov_steps", 2.5)]:
        with pytest.raises(ConfigError) as err:
            stream_options({key: bad})
        assert f"model_args.{key}" in str(err.value.key if hasattr(err.value, "key") else err.value)
    with pytest.raises(ConfigError):
        model_config({"fov_polcy": "fixed"})


def test_ffn_task_single_fov_steps_survive_a_resume(tmp_path: Path) -> None:
    """model_args.single_fov_steps reaches the task's stream as steps x batch examples, and a task restored from
    a checkpoint's state counts the examples already consumed, so movement starts at the same step."""
    from hpctrain.ffn.training.task import FFNTask
    from hpctrain.models.task import TaskContext

    def make_task() -> FFNTask:
        ctx = TaskContext(model_args={"depth": 1, "features": 4, "fov": 5, "deltas": 1, "single_fov_steps": 3},
                          data={"train": {"synthetic": {"shape": [20, 24, 24], "seed": 3}}, "margin": 3},
                          batch_per_rank=2, seed=0, rank=0, world_size=1, run_dir=tmp_path, device=torch.device("cpu"))
        return FFNTask(ctx)

    def step(task: FFNTask) -> None:
        batch = task.next_batch()
        task.observe(batch, torch.full((len(batch.offsets), 1, 5, 5, 5), 5.0))  # every fixed-policy move taken

    task = make_task()
    assert task.stream.config.single_fov_examples == 6
    for _ in range(2):  # two bare-seed steps: one new example per slot per step
        step(task)
    state = task.state_dict()
    assert state["coordinates_consumed"] == 4
    resumed = make_task()
    resumed.load_state_dict(state)
    assert resumed.stream.examples_before == 4
    step(resumed)  # the third and last bare-seed step
    assert resumed.stream.examples_started == 2
    step(resumed)  # now each slot takes a new example that moves ...
    started = resumed.stream.examples_started
    step(resumed)  # ... and keeps it for the next step
    assert resumed.stream.examples_started == started == 4


def test_bare_seed_steps_may_use_a_smaller_fov() -> None:
    """single_fov: the bare-seed batches are that FOV around the seed, then the moving examples the full FOV."""
    image, labels = make_synthetic_volume((20, 28, 28), seed=3)
    coords = np.array([[10, 14, 14]] * 12)
    cfg = StreamConfig(fov=(7, 7, 7), deltas=(2, 2, 2), batch_size=2, single_fov_examples=4, single_fov=(5, 5, 5),
                       shuffle_moves=False)
    stream = ExampleStream(image, labels, iter(coords), cfg)
    shapes = []
    for _ in range(4):
        batch = stream.next_batch()
        shapes.append(tuple(batch.image.shape))
        assert batch.seed.shape == batch.labels.shape == batch.image.shape
        stream.update(torch.full(batch.image.shape, 5.0))
    assert shapes == [(2, 1, 5, 5, 5)] * 2 + [(2, 1, 7, 7, 7)] * 2
    full = ExampleStream(image, labels, iter(coords), StreamConfig(fov=(7, 7, 7), deltas=(2, 2, 2), batch_size=2,
                                                                   single_fov_examples=4, shuffle_moves=False))
    small = ExampleStream(image, labels, iter(coords), cfg)
    a, b = full.next_batch(), small.next_batch()
    assert np.array_equal(crop(a.image[0, 0].numpy(), (0, 0, 0), (5, 5, 5)), b.image[0, 0].numpy())  # same centre
    with pytest.raises(ValueError, match="do not match the last batch"):
        small.update(torch.zeros(2, 1, 7, 7, 7))
    with pytest.raises(ValueError, match="no larger than fov"):
        ExampleStream(image, labels, iter(coords), StreamConfig(fov=(7, 7, 7), deltas=(2, 2, 2), single_fov=(9, 9, 9)))


def test_dilations_reach_the_model_and_its_checkpoint_and_bad_ones_name_the_key(tmp_path: Path) -> None:
    """model_args.dilations builds a dilated ConvStack3D in the task, is written into the checkpoint's model_args,
    and inference rebuilds the same network from it (a dilated model's weights fit an undilated one too, so only
    equal outputs show the dilations arrived)."""
    from hpctrain.errors import ConfigError
    from hpctrain.ffn.inference.runner import load_model
    from hpctrain.ffn.training.task import FFNTask, model_config
    from hpctrain.models.task import TaskContext

    assert model_config({"depth": 3}).get("dilations") is None  # absent: the reference's network
    with pytest.raises(ConfigError, match="2 values for depth 3"):
        model_config({"depth": 3, "dilations": [1, 2, 2]})
    with pytest.raises(ConfigError, match="model_args"):
        model_config({"depth": 3, "dilations": [1, 0]})

    ctx = TaskContext(model_args={"depth": 3, "features": 4, "fov": 7, "deltas": 1, "dilations": [1, 2]},
                      data={"train": {"synthetic": {"shape": [20, 24, 24], "seed": 3}}, "margin": 4},
                      batch_per_rank=1, seed=0, rank=0, world_size=1, run_dir=tmp_path, device=torch.device("cpu"))
    task = FFNTask(ctx)
    assert [m.dilation for m in task.model.residual_a] == [(1, 1, 1), (2, 2, 2)]
    assert task.model_args["dilations"] == [1, 2]
    path = tmp_path / "ckpt.pt"
    torch.save({"model": task.model.state_dict(), "model_args": task.model_args}, path)
    loaded, _, _ = load_model(path)
    assert [m.dilation for m in loaded.residual_b] == [(1, 1, 1), (2, 2, 2)]
    x = torch.randn(1, 2, 7, 7, 7)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), task.model.eval()(x.contiguous(memory_format=torch.channels_last_3d)))


def test_the_task_hands_the_model_its_batches_on_the_ranks_device(tmp_path: Path) -> None:
    """A GPU rank's model lives on the GPU; the stream builds batches on the CPU. The task moves them (found by
    benchmarks/device_check.py on an H200: the first step failed with CPU inputs to CUDA weights). ``meta`` stands
    in for the GPU here: a tensor left on the CPU keeps its device and the assertion fails."""
    from hpctrain.ffn.training.task import FFNTask
    from hpctrain.models.task import TaskContext

    ctx = TaskContext(model_args={"depth": 1, "features": 4, "fov": 7, "deltas": 1},
                      data={"train": {"synthetic": {"shape": [20, 24, 24], "seed": 3}}, "margin": 4},
                      batch_per_rank=2, seed=0, rank=0, world_size=1, run_dir=tmp_path, device=torch.device("meta"))
    batch = FFNTask(ctx).next_batch()
    assert {t.device.type for t in (batch.image, batch.seed, batch.labels, batch.inputs())} == {"meta"}
    assert tuple(batch.inputs().shape) == (2, 2, 7, 7, 7) and len(batch.offsets) == 2


def test_a_bfloat16_task_keeps_torchs_convolutions_and_gives_the_stream_float32_logits(tmp_path: Path) -> None:
    """``train.precision: bfloat16`` reaches the FFN task as ``ctx.precision``: its convolutions stay torch's own
    (the oneDNN wrapper would run them in float32 under autocast), and the logits the canvas is updated with
    are float32. The loss on the same batch differs from the float32 task's by bfloat16's rounding only."""
    from hpctrain.ffn.perf import OneDNNConv3d
    from hpctrain.ffn.training.task import FFNTask
    from hpctrain.models.task import TaskContext
    from hpctrain.runtime.precision import forward_context

    def make_task(precision: str, run_dir: Path) -> FFNTask:
        ctx = TaskContext(model_args={"depth": 2, "features": 8, "fov": 7, "deltas": 1},
                          data={"train": {"synthetic": {"shape": [20, 24, 24], "seed": 3}}, "margin": 4},
                          batch_per_rank=2, seed=0, rank=0, world_size=1, run_dir=run_dir,
                          device=torch.device("cpu"), precision=precision)
        return FFNTask(ctx)

    full, half = make_task("float32", tmp_path / "f32"), make_task("bfloat16", tmp_path / "bf16")
    assert any(isinstance(m, OneDNNConv3d) for m in full.model.modules())
    assert not any(isinstance(m, OneDNNConv3d) for m in half.model.modules())
    assert all(isinstance(m, torch.nn.Conv3d) for m in half.model.residual_a)
    batch_full, batch_half = full.next_batch(), half.next_batch()
    assert torch.equal(batch_full.inputs(), batch_half.inputs())  # the same seed: the same examples
    loss_full, logits_full = full.forward_loss(batch_full)
    with forward_context("bfloat16", torch.device("cpu")):
        loss_half, logits_half = half.forward_loss(batch_half)
    assert logits_half.dtype == loss_half.dtype == torch.float32
    assert loss_half.item() != loss_full.item()
    assert loss_half.item() == pytest.approx(loss_full.item(), rel=2e-2)
    half.observe(batch_half, logits_half)  # the canvas takes them
