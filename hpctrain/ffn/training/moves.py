"""Where one training example's FOV goes next: the fixed and max-prediction policies of google/ffn ``train.py``.

Each policy is an object whose whole position is a few integers (``state_dict``), so an example that is half
way through its moves when a checkpoint is taken resumes at the same move. Offsets are (z, y, x) from the
centre of the example's training box; the canvas holds logits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_fields import Zyx, zyx
from hpctrain.ffn.logits import logit
from hpctrain.ffn.movement import face_max_offsets


def box_slices(shape: Sequence[int], offset: Sequence[int], crop_shape: Sequence[int]) -> tuple[slice, ...]:
    """Slices of the ``crop_shape`` box centred ``offset`` away from the centre of an array of ``shape``."""
    start = np.array(shape) // 2 - np.array(crop_shape) // 2 + np.array(offset)
    end = start + np.array(crop_shape)
    if np.any(start < 0) or np.any(end > np.array(shape)):
        raise ValueError(
            f"crop {tuple(crop_shape)} at offset {tuple(offset)} leaves an array of shape {tuple(shape)}"
        )
    return tuple(slice(int(s), int(e)) for s, e in zip(start, end, strict=True))


def crop(data: np.ndarray, offset: Sequence[int], crop_shape: Sequence[int]) -> np.ndarray:
    """View of ``crop_shape`` centred ``offset`` away from ``data``'s centre (mask.crop_and_pad, no pad)."""
    return data[box_slices(data.shape, offset, crop_shape)]


def fixed_shifts(deltas: Sequence[int], faces_only: bool = False) -> list[Zyx]:
    """The fixed policy's FOV shifts: all 26 of ``{-d, 0, +d}³ \\ 0`` as google/ffn ``FFNModel.shifts``
    (x outermost, as the reference loops), or only the 6 face shifts ``±d`` along one axis."""
    dz, dy, dx = (int(d) for d in deltas)
    shifts: list[Zyx] = []
    for sx in (-dx, 0, dx):
        for sy in (-dy, 0, dy):
            for sz in (-dz, 0, dz):
                if (sz, sy, sx) == (0, 0, 0):
                    continue
                if faces_only and sum(v != 0 for v in (sz, sy, sx)) != 1:
                    continue
                shifts.append((sz, sy, sx))
    return shifts


class BareSeed:
    """One FOV at the centre, no movement (the bare-seed examples of ``single_fov_examples``)."""

    kind = "single"

    def __init__(self) -> None:
        self.given = False

    def next(self, canvas: np.ndarray) -> Zyx | None:
        if self.given:
            return None
        self.given = True
        return (0, 0, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "given": self.given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.given = bool(state["given"])


class FixedMoves:
    """train.py ``fixed_offsets``: the centre, then each shift whose new centre voxel on the canvas is
    ``>= logit(threshold)``, tested when reached (predictions written since the last move decide the next)."""

    kind = "fixed"

    def __init__(self, shifts: Sequence[Zyx], threshold: float = 0.9) -> None:
        self.order = [(0, 0, 0), *(zyx(s) for s in shifts)]
        self.limit = logit(threshold)
        self.index = 0

    def next(self, canvas: np.ndarray) -> Zyx | None:
        centre = np.array(canvas.shape) // 2
        while self.index < len(self.order):
            offset = self.order[self.index]
            self.index += 1
            if canvas[tuple(centre + np.array(offset))] >= self.limit:
                return offset
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])


class MaxPredMoves:
    """train.py ``max_pred_offsets`` (policy 'max_pred_moves', as in inference): breadth-first from the centre
    over face-maximum moves of the current prediction (``movement.face_max_offsets``), each quantised position
    visited once, never leaving the loaded training box. The moves out of an FOV are read from the canvas
    when the next one is asked for, i.e. after the model's prediction there was written back."""

    kind = "max_pred"

    def __init__(self, fov: Sequence[int], deltas: Sequence[int], threshold: float = 0.9) -> None:
        self.fov = zyx(fov)
        self.deltas = zyx(deltas)
        self.limit = logit(threshold)
        self.queue: deque[Zyx] = deque([(0, 0, 0)])
        self.done: set[Zyx] = set()
        self.pending: Zyx | None = None  # the FOV just given; its moves are read at the next call

    def next(self, canvas: np.ndarray) -> Zyx | None:
        if self.pending is not None:
            current = crop(canvas, self.pending, self.fov)
            for _, rel in face_max_offsets(current, self.deltas, self.limit):  # sorted, best first
                self.queue.append(zyx([r + o for r, o in zip(rel, self.pending, strict=True)]))
            self.pending = None
        fov_r = np.array(self.fov) // 2
        box_r = np.array(canvas.shape) // 2
        step = np.maximum(np.array(self.deltas), 1)
        while self.queue:
            offset = self.queue.popleft()
            if np.any(np.abs(np.array(offset)) + fov_r > box_r):
                continue
            quantized = zyx(np.array(offset) // step)
            if quantized in self.done:
                continue
            self.done.add(quantized)
            self.pending = offset
            return offset
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "queue": [list(q) for q in self.queue], "done": sorted(list(d) for d in self.done),
                "pending": None if self.pending is None else list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue = deque(zyx(q) for q in state["queue"])
        self.done = {zyx(d) for d in state["done"]}
        self.pending = None if state["pending"] is None else zyx(state["pending"])


Moves = BareSeed | FixedMoves | MaxPredMoves


def _offsets(moves: Moves, canvas: np.ndarray) -> Iterator[Zyx]:
    while (offset := moves.next(canvas)) is not None:
        yield offset


def fixed_offsets(canvas: np.ndarray, shifts: Sequence[Zyx], threshold: float = 0.9) -> Iterator[Zyx]:
    """``FixedMoves`` as a lazy generator over ``canvas`` (train.py ``fixed_offsets``)."""
    return _offsets(FixedMoves(shifts, threshold), canvas)


def max_pred_offsets(
    canvas: np.ndarray, fov: Sequence[int], deltas: Sequence[int], threshold: float = 0.9
) -> Iterator[Zyx]:
    """``MaxPredMoves`` as a lazy generator over ``canvas`` (train.py ``max_pred_offsets``)."""
    return _offsets(MaxPredMoves(fov, deltas, threshold), canvas)
