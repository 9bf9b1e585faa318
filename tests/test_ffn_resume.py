"""Exact FFN resume: the training examples in flight at a checkpoint (canvas, move position, augmentation) are
saved with the task, so a run stopped by the walltime path and resumed on the same ranks ends bit-identical
to an uninterrupted one.

The 2-rank test goes through the real stop path of the other models' resume tests (tests/test_resume.py):
``HPCTRAIN_STOP_AT_STEP`` raises the stop flag after that step exactly as the walltime signal does, the ranks
commit a checkpoint and exit 75, and ``hpctrain run`` on the same run directory resumes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from test_resume import assert_bit_identical, comparable, final_state, finished, launch, stopped

from hpctrain.ffn.synthetic import make_synthetic_volume
from hpctrain.ffn.training.coordinates import build_coordinates, compute_partitions, lom_radius_for
from hpctrain.ffn.training.stream import ExampleStream, StreamConfig, epoch_coordinates

STEPS, STOP_AT = 8, 5


def ffn_spec(path: Path, precision: str = "float32") -> Path:
    # move_threshold 0.04 is below the pad value's probability: an untrained model takes nearly every fixed
    # move, so each example spans many steps and some are always half done at the stop.
    spec = {
        "name": "ffn-resume",
        "model": "ffn",
        "model_args": {"depth": 2, "features": 4, "fov": [7, 7, 7], "deltas": [2, 2, 2], "single_fov_steps": 2,
                       "move_threshold": 0.04},
        "data": {"train": {"synthetic": {"shape": [20, 28, 28], "seed": 3}}},
        "train": {"steps": STEPS, "batch_per_rank": 2, "lr": 0.002, "optimizer": {"name": "adam"},
                  "log_every": 2, "seed": 3, "collective_timeout_s": 60, "precision": precision},
        "checkpoint": {"every_steps": 2, "keep": 3},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_ffn_run_stopped_and_resumed_on_two_ranks_is_bit_identical(tmp_path: Path, precision: str) -> None:
    """In bfloat16 too (``train.precision``): autocast's casts are as deterministic as float32's sums."""
    spec = ffn_spec(tmp_path / "spec.yaml", precision)
    stopped(launch(spec, tmp_path / "run", stop_at=STOP_AT), STOP_AT)
    at_stop = final_state(tmp_path / "run", step=STOP_AT)
    for rank in ("rank-00000.pt", "rank-00001.pt"):
        slots = at_stop[rank]["task"]["stream"]["slots"]
        # examples past their first FOV were in flight: without their state the resumed run would differ
        assert any(s is not None and s["moves"]["kind"] == "fixed" and s["moves"]["index"] > 1 for s in slots)
    out = finished(launch(spec, tmp_path / "run"))
    assert f"(step {STOP_AT})" in out and "resumed from" in out
    finished(launch(spec, tmp_path / "ref"))
    got, want = comparable(final_state(tmp_path / "run")), comparable(final_state(tmp_path / "ref"))
    assert got.keys() == want.keys() == {"shared.pt", "rank-00000.pt", "rank-00001.pt"}
    assert assert_bit_identical(got, want) > 0  # model, optimizer, RNGs and the task's canvases


def _volume() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    image, labels = make_synthetic_volume((20, 28, 28), seed=4)
    fov, deltas = (5, 5, 5), (2, 2, 2)
    parts = compute_partitions(labels, lom_radius=lom_radius_for(fov, deltas), min_size=50)
    return image, labels, build_coordinates(parts, [8, 8, 8], seed=0)  # room for max_pred_moves, 2 moves


def _fake_logits(batch: Any, step: int) -> torch.Tensor:
    """A deterministic 'prediction' that differs per voxel and step, high where the labels say object."""
    g = torch.Generator().manual_seed(step)
    return (batch.labels - 0.5) * 8.0 + torch.randn(batch.labels.shape, generator=g)


@pytest.mark.parametrize("policy", ["fixed", "max_pred_moves"])
def test_stream_state_round_trip_continues_the_same_batches(policy: str) -> None:
    image, labels, coords = _volume()
    cfg = StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=3, policy=policy, fov_moves=2, threshold=0.6,
                       single_fov_examples=2, seed=7)

    def stream(start: int = 0) -> ExampleStream:
        return ExampleStream(image, labels, epoch_coordinates(coords, 0, 1, 5, start=start), cfg,
                             examples_before=start)

    original = stream()
    for step in range(6):
        original.update(_fake_logits(original.next_batch(), step))
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)  # the checkpoint store's format, read back as it does
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert any(s is not None and s["moves"]["kind"] != "single" for s in state["slots"])
    resumed = stream(original.examples_started)
    resumed.load_state_dict(state)
    for step in range(6, 30):
        a, b = original.next_batch(), resumed.next_batch()
        assert a.offsets == b.offsets, step
        for name in ("image", "seed", "labels"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (step, name)
        logits = _fake_logits(a, step)
        original.update(logits)
        resumed.update(logits)
    assert original.counts == resumed.counts and original.counts.examples > 0


def test_stream_without_the_in_flight_state_starts_other_examples() -> None:
    """The contrast that makes the round trip meaningful: reopening at the coordinate count alone (what was
    saved before) gives different batches."""
    image, labels, coords = _volume()
    cfg = StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=2, threshold=0.6, seed=7)
    original = ExampleStream(image, labels, epoch_coordinates(coords, 0, 1, 5), cfg)
    for step in range(3):
        original.update(_fake_logits(original.next_batch(), step))
    reopened = ExampleStream(image, labels, epoch_coordinates(coords, 0, 1, 5, start=original.examples_started),
                             cfg, examples_before=original.examples_started)
    a, b = original.next_batch(), reopened.next_batch()
    assert a.offsets != b.offsets or not torch.equal(a.image, b.image)


def test_stream_state_of_another_batch_size_is_refused() -> None:
    image, labels, coords = _volume()
    cfg = StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=2, seed=7)
    state = ExampleStream(image, labels, iter(coords), cfg).state_dict()
    other = ExampleStream(image, labels, iter(coords), StreamConfig(fov=(5, 5, 5), deltas=(2, 2, 2), batch_size=3))
    with pytest.raises(ValueError, match="2 slots cannot resume one of 3"):
        other.load_state_dict(state)
