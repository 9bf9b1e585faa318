"""The flood-filling canvas: the object logit map and the segmentation of one volume, grown one object at a time
from seeds by moving the FOV where the model's predicted object reaches a face (google/ffn
``ffn/inference/inference.py``, ``Canvas``: ``is_valid_pos``, ``segment_all``). Several objects may be in flight
at once where none can touch another (``batching.SeedOrder``); their FOVs are batched by ``batching``. Positions
are (z, y, x); thresholds are probabilities, kept as logits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn_fields import deltas_problem
from hpctrain.config.plugins.ffn_inference import ExecutionSettings, FloodSettings, InferenceConfig
from hpctrain.errors import ConfigError, DataError, RuntimeFailure
from hpctrain.ffn.inference.batching import FovBatches, FovRequests, SeedOrder, check_output, flood_together
from hpctrain.ffn.logits import logit
from hpctrain.ffn.movement import FaceMaxMovementPolicy, Position
from hpctrain.ffn.segmentation import make_labels_contiguous


@dataclass
class _Box:
    """A box of the volume, [lo, hi) per axis, grown as a flood writes; plain ints (updated once per FOV)."""

    lo: list[int]
    hi: list[int]

    @classmethod
    def at(cls, pos: Sequence[int]) -> _Box:
        return cls([int(p) for p in pos], [int(p) + 1 for p in pos])

    def slices(self) -> tuple[slice, slice, slice]:
        (z0, y0, x0), (z1, y1, x1) = self.lo, self.hi
        return (slice(z0, z1), slice(y0, y1), slice(x0, x1))

    def cover(self, box: tuple[slice, slice, slice]) -> None:
        for axis, b in enumerate(box):
            self.lo[axis] = min(self.lo[axis], b.start)
            self.hi[axis] = max(self.hi[axis], b.stop)

    def cover_point(self, pos: Sequence[int]) -> None:
        """Bounds of points (``hi`` inclusive here: the visited FOV centres)."""
        for axis, p in enumerate(pos):
            self.lo[axis] = min(self.lo[axis], p)
            self.hi[axis] = max(self.hi[axis], p)


@dataclass
class _Object:
    """One object being flooded: its seed, move queue, the FOV centres it visited and the map box it wrote."""

    start: Position
    movement: FaceMaxMovementPolicy
    visited: _Box
    written: _Box
    began: float
    iters: int = 0
    done: bool = False
    requests: FovRequests | None = None
    next_request: list[tuple[Position, np.ndarray]] | None = None

    @classmethod
    def start_at(cls, start: Position, canvas: Canvas) -> _Object:
        movement = FaceMaxMovementPolicy(canvas.deltas, canvas.move_logit, order=canvas.settings.movement_order)
        movement.reset(start)
        return cls(start=start, movement=movement, visited=_Box(list(start), list(start)), written=_Box.at(start),
                   began=time.perf_counter())


class Canvas:
    """State of flood-filling one volume: the object logit map (``seed``) and the ``segmentation``.

    ``seed`` holds the logits of the objects being flooded (each in its own box, reset when it is committed),
    NaN where no FOV has been yet (the reference's convention); NaN is fed to the model as ``logit(pad_value)``.
    ``segmentation`` holds 0 (empty), -1 (a seed position that failed: too weak or too small) or an object id > 0.
    The canvas takes its ``flood`` settings and its ``execution`` settings whole (``make_canvas``).
    """

    SELF_PREDICTION_MIN_VOXELS = 50  # the check says nothing from fewer object voxels in a FOV
    LOOKAHEAD = 8  # seeds per unit of width that may be taken up before the first waiting one

    def __init__(self, model: Any, image: np.ndarray, flood: FloodSettings,
                 execution: ExecutionSettings | None = None) -> None:
        import torch

        if image.ndim != 3:
            raise DataError(f"inference image has shape {image.shape}; expected a 3-D (z, y, x) volume")
        execution = execution or ExecutionSettings()
        self.settings = flood
        self.fov, self.deltas = flood.fov, flood.deltas
        self.margin = tuple(s // 2 for s in self.fov)
        problem = deltas_problem(self.fov, self.deltas)  # the rule the laptop checks model_args by
        if problem:
            raise ConfigError(problem, key="model_args.deltas", hint="use smaller deltas or a larger fov")
        self.shape = tuple(int(s) for s in image.shape)
        if any(s < f for s, f in zip(self.shape, self.fov, strict=True)):
            raise DataError(f"inference image of shape {self.shape} is smaller than the FOV {self.fov}")

        self.model = model
        self.device = torch.device(execution.device)
        self.image = image
        norm = (image.astype(np.float32) - np.float32(flood.image_mean)) / np.float32(flood.image_stddev)
        self._image_t = torch.from_numpy(norm).to(self.device)

        self.move_logit = logit(flood.move_threshold)
        self.segment_logit = logit(flood.segment_threshold)
        self.init_logit = logit(flood.init_activation)
        self.pad_logit = np.float32(logit(flood.pad_value))

        self.seed = np.full(self.shape, np.nan, dtype=np.float32)
        self.segmentation = np.zeros(self.shape, dtype=np.int32)
        FaceMaxMovementPolicy(self.deltas, self.move_logit, order=flood.movement_order)  # checks the order here
        self.origins: dict[int, dict[str, Any]] = {}  # id -> seed position, iterations, seconds
        self.overlaps: dict[int, dict[int, int]] = {}  # id -> {earlier id: voxels above threshold there}
        self.width = execution.concurrent_floods
        self.speculative = execution.speculative_self_prediction
        self._bare_seed = np.full(self.fov, self.pad_logit, dtype=np.float32)
        self._bare_seed[tuple(f // 2 for f in self.fov)] = self.init_logit
        self._near = None  # the voxels of a FOV the check looks at: all, or those within a radius of its centre
        if flood.self_prediction_radius:
            axes = np.ogrid[tuple(slice(-(f // 2), f // 2 + 1) for f in self.fov)]
            self._near = sum(a.astype(np.float32) ** 2 for a in axes) <= float(flood.self_prediction_radius) ** 2
        self.counters: dict[str, int] = {}
        self._max_id = 0

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _fov_box(self, pos: Sequence[int]) -> tuple[slice, slice, slice]:
        z, y, x = (int(p) - m for p, m in zip(pos, self.margin, strict=True))
        fz, fy, fx = self.fov
        return (slice(z, z + fz), slice(y, y + fy), slice(x, x + fx))

    def is_valid_pos(self, pos: Position, ignore_move_threshold: bool = False, start: Position | None = None) -> bool:
        """Whether to run the FFN at ``pos`` (``Canvas.is_valid_pos``) for the object seeded at ``start``.

        Requires the object probability there >= move threshold (unless starting an object), the whole FOV
        inside the volume, and the voxel not yet part of another object.
        """
        if not ignore_move_threshold and not self.seed[pos] >= self.move_logit:  # NaN fails too
            self.count("skip_threshold")
            return False
        for p, m, s in zip(pos, self.margin, self.shape, strict=True):
            if p - m < 0 or p + m >= s:
                self.count("skip_invalid_pos")
                return False
        if self.segmentation[pos] > 0:
            self.count("skip_invalid_pos")
            return False
        reach = self.settings.max_seed_distance
        if reach and not ignore_move_threshold and start is not None and any(
                abs(p - s) > reach for p, s in zip(pos, start, strict=True)):
            self.count("skip_seed_distance")
            return False
        return True

    def predict_bare(self, positions: Sequence[Position], batch: int = 32) -> np.ndarray:
        """The model's logits from a bare seed at each of ``positions`` (their FOVs inside the volume), batched:
        shape (n, *fov). Agglomeration asks these of the pieces' contacts."""
        import torch

        out = np.empty((len(positions), *self.fov), dtype=np.float32)
        inputs = torch.empty((min(batch, max(1, len(positions))), 2, *self.fov), dtype=torch.float32,
                             device=self.device)
        for start in range(0, len(positions), batch):
            chunk = positions[start : start + batch]
            for i, pos in enumerate(chunk):
                self.fill_input(inputs[i], pos, self._bare_seed)
            with torch.inference_mode():
                logits = check_output(self.model(inputs[: len(chunk)]), inputs[: len(chunk)].shape)
            out[start : start + len(chunk)] = logits[:, 0].numpy()
        self.count("agglomeration_fovs", len(positions))
        return out

    def fill_input(self, target: Any, pos: Position, logit_seed: np.ndarray) -> None:
        """Write the model input of the FOV at ``pos`` (image, seed logits) into ``target`` (2, Z, Y, X)."""
        import torch

        target[0].copy_(self._image_t[self._fov_box(pos)])
        target[1].copy_(torch.from_numpy(logit_seed))

    def seed_at(self, pos: Position) -> np.ndarray:
        """The seed logits of the FOV at ``pos`` as the model sees them: NaN (not predicted yet) as the pad."""
        return np.nan_to_num(self.seed[self._fov_box(pos)], nan=self.pad_logit)

    def write_back(self, pos: Position, logits: np.ndarray, box: _Box) -> None:
        """Overwrite the object map's FOV at ``pos`` with the model's logits; grow ``box`` (the object's written
        box, cleared when it is committed) over it."""
        fov_box = self._fov_box(pos)
        self.seed[fov_box] = logits
        box.cover(fov_box)

    def _flood_object(self, obj: _Object) -> FovRequests:
        """One object's flood as a generator: yields (position, seed logits) for every FOV it needs predicted and
        is sent the model's logits back, so a driver may batch the FOVs of several objects and canvases."""
        start = obj.start
        movement = obj.movement
        movement.append(2.0 * self.move_logit, start)  # any score: it is consumed at once

        def valid(pos: Position) -> bool:
            return self.is_valid_pos(pos, start=start)

        iters = 0
        while True:
            pos = movement.next_position(valid)
            if pos is None:
                break
            if not self.seed[start] >= self.move_logit:
                self.count("seed_got_too_weak")
                break
            checked = self.settings.self_prediction > 0 and pos != start
            if checked:
                # The model's own answer from a bare seed here must claim the object the flood brought here;
                # a flood that crossed a faint membrane meets a neighbour that does not (docs/ffn_inference.md).
                # Speculatively, the seeded FOV is asked in the same call (its input is the same either way) and
                # thrown away when the check refuses the move.
                if self.speculative:
                    bare, logits = yield [(pos, self._bare_seed), (pos, self.seed_at(pos))]
                else:
                    (bare,) = yield [(pos, self._bare_seed)]
                if not self._agrees(pos, bare):
                    self.count("self_prediction_rejects")
                    movement.mark_visited(pos)
                    continue
            if not (checked and self.speculative):
                (logits,) = yield [(pos, self.seed_at(pos))]
            self.write_back(pos, logits, obj.written)
            obj.visited.cover_point(pos)
            iters += 1
            movement.update(logits, pos)
        self.count("ffn_calls", iters)
        obj.iters = iters
        return iters

    def _agrees(self, pos: Position, bare: np.ndarray) -> bool:
        """Whether a bare-seed prediction at ``pos`` claims enough of the object voxels already in its FOV."""
        known = self.seed[self._fov_box(pos)] >= self.segment_logit
        if self._near is not None:
            known &= self._near
        if int(known.sum()) < self.SELF_PREDICTION_MIN_VOXELS:
            return True
        return float(np.mean(bare[known] >= self.segment_logit)) >= self.settings.self_prediction

    def _too_close(self, pos: Position) -> bool:
        sel = tuple(slice(max(p - d, 0), p + d + 1) for p, d in zip(pos, self.settings.min_boundary_dist, strict=True))
        return bool(np.any(self.segmentation[sel] > 0))

    def _mark_failed(self, pos: Position) -> None:
        if self.segmentation[pos] == 0:
            self.segmentation[pos] = -1

    def segment_all(self, seeds: np.ndarray | Sequence[Sequence[int]]) -> None:
        """Try to create one object from every seed, in order (``Canvas.segment_all``); see ``flood``."""
        flood_together(self.model, [(self, self.flood(seeds))])

    def _may_start(self, pos: Position) -> bool:
        """Whether an object may be seeded at ``pos`` now (else the seed is skipped, as the reference does)."""
        if not self.is_valid_pos(pos, ignore_move_threshold=True):
            return False
        if self._too_close(pos):
            self.count("skip_too_close")
            self.segmentation[pos] = -1
            return False
        return True

    def _reach(self) -> Position | None:
        """How far (per axis) from its seed an object's flood reads or writes anything: its FOVs' centres stay within
        ``max_seed_distance`` of the seed, and a FOV reaches ``margin`` beyond its centre. None: unbounded."""
        d = self.settings.max_seed_distance
        if not d:
            return None
        return (d + self.margin[0], d + self.margin[1], d + self.margin[2])

    def flood(self, seeds: np.ndarray | Sequence[Sequence[int]]) -> FovBatches:
        """``segment_all`` as a generator of FOV batches: the FOVs of up to ``concurrent_floods`` objects in flight
        at once.

        A seed is skipped when its FOV leaves the volume, when it already lies in an object, or when an
        object is within ``min_boundary_dist`` of it. After flooding, the object is the voxels of the
        touched box with probability >= segment threshold that are not yet in another object (earlier
        objects keep their voxels; the overlap is recorded in ``overlaps``); it is dropped when it has fewer
        than ``min_segment_size`` such voxels or when the seed voxel itself ended below the move threshold.

        ``concurrent_floods`` > 1 (with ``max_seed_distance`` set, so that a flood stays within ``_reach`` of its seed)
        floods several objects at once, their FOVs in one model call. A seed is taken up (checked, then
        flooded) only when no object in flight and no earlier seed still waiting lies within twice the reach of
        it, and objects are committed in seed order: every object reads and writes exactly what it would one
        after another, and gets the same id; only the model sees a batch. Seeds up to ``LOOKAHEAD`` x width
        places beyond the first waiting one may go first.
        """
        reach = self._reach()
        width = self.width if reach is not None else 1
        queue = [(int(r[0]), int(r[1]), int(r[2])) for r in np.asarray(seeds, dtype=np.int64).reshape(-1, 3)]
        order = SeedOrder(queue, reach, window=1 if width == 1 else self.LOOKAHEAD * width)
        running: list[_Object] = []
        idle = 0
        while True:
            for obj in order.committable():
                self._commit(obj)
            while len(running) < width:
                taken = order.take()
                if taken is None:
                    break
                index, pos = taken
                if not self._may_start(pos):
                    order.skipped(index)
                    continue
                obj = self._start_object(pos)
                order.started(index, obj)
                if not obj.done:
                    running.append(obj)
            if not running:
                if order.finished():
                    return
                idle += 1  # objects done but not committed yet: commit them, then seeds they held back may start
                if idle > 2:  # the smallest seed still waiting clashes with nothing in flight: cannot happen
                    raise RuntimeFailure(f"flood scheduling stalled with seeds {order.pending[:5]} pending")
                order.changed = True
                continue
            idle = 0
            logits = yield [request for obj in running for request in obj.next_request]  # type: ignore[union-attr]
            at = 0
            for obj in running:
                answers, at = logits[at : at + len(obj.next_request)], at + len(obj.next_request)  # type: ignore[arg-type]
                try:
                    obj.next_request = obj.requests.send(answers)  # type: ignore[union-attr]
                except StopIteration:
                    obj.done, obj.next_request = True, None
                    order.changed = True
            running = [obj for obj in running if not obj.done]

    def _start_object(self, pos: Position) -> _Object:
        self.seed[pos] = self.init_logit
        obj = _Object.start_at(pos, self)
        obj.requests = self._flood_object(obj)
        obj.next_request = next(obj.requests, None)
        obj.done = obj.next_request is None
        return obj

    def _commit(self, obj: _Object) -> None:
        """Make a finished object's voxels an object of the segmentation (or mark its seed failed), in seed order;
        then clear what it wrote into the object map."""
        pos = obj.start
        try:
            if obj.iters <= 0:
                return
            if not self.seed[pos] >= self.move_logit:
                self._mark_failed(pos)
                self.count("failed_weak_seed")
                return
            sel = tuple(slice(max(lo - m, 0), hi + m + 1)
                        for lo, hi, m in zip(obj.visited.lo, obj.visited.hi, self.margin, strict=True))
            mask = self.seed[sel] >= self.segment_logit
            seg_box = self.segmentation[sel]  # a view: writes go to the canvas
            ids, counts = np.unique(seg_box[mask], return_counts=True)
            overlapped = {int(i): int(c) for i, c in zip(ids, counts, strict=True) if i > 0}
            mask &= seg_box <= 0
            size = int(mask.sum())
            if size < self.settings.min_segment_size:
                self._mark_failed(pos)
                self.count("failed_too_small")
                return
            self._max_id += 1
            while self._max_id in self.origins:
                self._max_id += 1
            seg_box[mask] = self._max_id
            self.overlaps[self._max_id] = overlapped
            self.origins[self._max_id] = {
                "seed": pos,
                "iters": obj.iters,
                "size": size,
                "seconds": round(time.perf_counter() - obj.began, 4),
            }
            self.count("voxels_segmented", size)
        finally:
            self.seed[obj.written.slices()] = np.nan

    def labels(self) -> np.ndarray:
        """The segmentation as uint32 ids 1..N, 0 for unsegmented voxels (failed-seed markers removed)."""
        return make_labels_contiguous(np.maximum(self.segmentation, 0))




def make_canvas(model: Any, image: np.ndarray, cfg: InferenceConfig) -> Canvas:
    """The one way a segmentation builds its canvas: the flood and execution groups of ``cfg``, whole."""
    return Canvas(model, image, cfg.flood, cfg.execution)
