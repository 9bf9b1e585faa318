"""FFN field-of-view movement: face-maximum move scoring and the per-object move queue.

Mirrors google/ffn ``ffn/inference/movement.py`` (``get_scored_move_offsets``, ``FaceMaxMovementPolicy``).
All positions, shapes and deltas are (z, y, x).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from hpctrain.config.plugins.ffn_fields import deltas_problem

Offset = tuple[int, int, int]
Position = tuple[int, int, int]


def face_max_offsets(prob: np.ndarray, deltas: Sequence[int], threshold: float) -> list[tuple[float, Offset]]:
    """Scored moves from the maxima of the 6 cuboid faces at +/- deltas around the centre of ``prob``.

    Mirrors google/ffn ``get_scored_move_offsets``: the working cuboid is the centre +/- deltas; for each
    axis with a nonzero delta and each sign, the face of that cuboid at ``centre +/- delta`` is taken, its
    maximum voxel found (first in C order on ties), and the move kept if ``score >= threshold``. The offset is
    relative to the centre of ``prob``. ``prob`` may be probabilities or logits as long as ``threshold`` is
    in the same space (the order of moves is the same). Unlike the reference generator, the result is
    sorted the way the reference's ``FaceMaxMovementPolicy.update`` consumes it: by (score, offset)
    descending, duplicates removed.
    """
    if prob.ndim != 3:
        raise ValueError(f"face_max_offsets: prob must be 3-D (z, y, x), got shape {prob.shape}")
    centre = np.array(prob.shape) // 2
    deltas = [int(d) for d in deltas]
    problem = deltas_problem(prob.shape, deltas)  # the rule the laptop checks model_args by
    if problem:
        raise ValueError(f"face_max_offsets: deltas do not fit inside a map of shape {prob.shape}: {problem}")
    cuboid = [slice(c - d, c + d + 1) for c, d in zip(centre, deltas, strict=True)]

    found: set[tuple[float, Offset]] = set()
    for axis, delta in enumerate(deltas):
        if delta == 0:
            continue
        for axis_offset in (-delta, delta):
            sel = list(cuboid)
            sel[axis] = int(centre[axis] + axis_offset)
            face = prob[tuple(sel)]
            face_pos = np.unravel_index(int(np.argmax(face)), face.shape)
            score = float(face[face_pos])
            if not score >= threshold:  # also rejects NaN
                continue
            rel = [int(face_pos[0] - face.shape[0] // 2), int(face_pos[1] - face.shape[1] // 2)]
            rel.insert(axis, axis_offset)
            found.add((score, (rel[0], rel[1], rel[2])))
    return sorted(found, reverse=True)


def quantize_position(pos: Sequence[int], start: Sequence[int], deltas: Sequence[int]) -> Position:
    """Cell of ``pos`` on a lattice of step ``deltas`` centred on ``start`` (google/ffn ``quantize_pos``).

    Shifting by half a delta puts the start in the middle of its cell, so all directions are treated alike.
    Plain ints rather than numpy: this runs once per queued candidate.
    """
    z, y, x = (
        (int(p) - int(s) + int(d) // 2) // max(int(d), 1) for p, s, d in zip(pos, start, deltas, strict=True)
    )
    return (z, y, x)


class FaceMaxMovementPolicy:
    """Queue of candidate FOV positions for one object (google/ffn ``FaceMaxMovementPolicy``).

    ``order="fifo"`` is the reference behaviour: each ``update`` appends its moves, sorted by score, to the
    back of a FIFO queue (a breadth-first flood). ``order="score"`` pops the best-scoring candidate across
    all updates first (a priority queue). Candidates whose quantised cell was already visited are skipped,
    as are those the canvas rejects through ``is_valid``.
    """

    def __init__(self, deltas: Sequence[int], score_threshold: float, order: str = "fifo") -> None:
        if order not in ("fifo", "score"):
            raise ValueError(f"movement order must be 'fifo' or 'score', got {order!r}")
        self.deltas = tuple(int(d) for d in deltas)
        self.score_threshold = float(score_threshold)
        self.order = order
        self._fifo: deque[tuple[float, Position]] = deque()
        self._heap: list[tuple[float, int, Position]] = []
        self._counter = 0
        self.done: set[Position] = set()
        self._start: Position = (0, 0, 0)

    def reset(self, start: Sequence[int]) -> None:
        """Forget all candidates and visited cells; quantise relative to ``start`` (``reset_state``)."""
        self._fifo.clear()
        self._heap.clear()
        self._counter = 0
        self.done = set()
        self._start = (int(start[0]), int(start[1]), int(start[2]))

    def __len__(self) -> int:
        return len(self._fifo) if self.order == "fifo" else len(self._heap)

    def append(self, score: float, pos: Sequence[int]) -> None:
        """Queue ``pos`` with ``score``."""
        p = (int(pos[0]), int(pos[1]), int(pos[2]))
        if self.order == "fifo":
            self._fifo.append((score, p))
        else:
            # heapq is a min-heap: negate the score; the counter keeps equal scores in insertion order.
            heapq.heappush(self._heap, (-score, self._counter, p))
            self._counter += 1

    def _pop(self) -> Position:
        if self.order == "fifo":
            return self._fifo.popleft()[1]
        return heapq.heappop(self._heap)[2]

    def next_position(self, is_valid: Callable[[Position], bool]) -> Position | None:
        """Pop candidates until one is in an unvisited cell and ``is_valid``; None when the queue is empty."""
        while len(self):
            pos = self._pop()
            if quantize_position(pos, self._start, self.deltas) in self.done:
                continue
            if is_valid(pos):
                return pos
        return None

    def mark_visited(self, pos: Sequence[int]) -> None:
        """Count ``pos``'s cell as visited without queueing moves from it (a rejected FOV)."""
        self.done.add(quantize_position(pos, self._start, self.deltas))

    def update(self, prob: np.ndarray, pos: Sequence[int]) -> None:
        """Mark ``pos`` visited and queue the face-maximum moves of the prediction ``prob`` centred there."""
        self.done.add(quantize_position(pos, self._start, self.deltas))
        for score, off in face_max_offsets(prob, self.deltas, self.score_threshold):
            self.append(score, (pos[0] + off[0], pos[1] + off[1], pos[2] + off[2]))
