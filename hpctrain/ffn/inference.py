"""FFN flood-fill inference: the canvas that grows one object at a time from seeds, and the segment command.

Mirrors google/ffn ``ffn/inference/inference.py`` (``Canvas``: ``init_seed``, ``is_valid_pos``, ``update_at``,
``segment_at``, ``segment_all``) and ``ffn/inference/segmentation.py`` (``clear_dust``,
``make_labels_contiguous``). Positions are (z, y, x); thresholds are probabilities, kept as logits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.plugins.ffn import deltas_problem
from hpctrain.config.precision import PRECISION_REQUESTS
from hpctrain.errors import CheckpointError, ConfigError, DataError, RuntimeFailure
from hpctrain.ffn.agglomeration import agglomerate, contact_pairs, mutual_claims, watershed_fill
from hpctrain.ffn.movement import FaceMaxMovementPolicy
from hpctrain.ffn.seeds import make_seeds, within_margin
from hpctrain.runtime.precision import resolve_precision

Position = tuple[int, int, int]

# google/ffn normalises images as (image - image_mean) / image_stddev; 128 / 33 are its FIB-25 defaults.
DEFAULT_IMAGE_MEAN = 128.0
DEFAULT_IMAGE_STDDEV = 33.0


def logit(p: float) -> float:
    """log(p / (1 - p)) for 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a probability threshold must lie strictly between 0 and 1, got {p}")
    return math.log(p / (1.0 - p))


def _triple(value: int | Sequence[int], name: str) -> Position:
    vals = [int(value)] * 3 if isinstance(value, int) else [int(v) for v in value]
    if len(vals) != 3:
        raise ValueError(f"{name} must be one int or three (z, y, x), got {value!r}")
    return (vals[0], vals[1], vals[2])


# --------------------------------------------------------------------------- segmentation helpers
def clear_dust(seg: np.ndarray, min_size: int) -> np.ndarray:
    """Set objects smaller than ``min_size`` voxels to 0, in place (google/ffn ``clear_dust``)."""
    if min_size <= 1:
        return seg
    ids, sizes = np.unique(seg, return_counts=True)
    small = ids[(sizes < min_size) & (ids != 0)]
    if len(small):
        seg[np.isin(seg, small)] = 0
    return seg


def split_disconnected(seg: np.ndarray, min_size: int = 1) -> np.ndarray:
    """Every object's 6-connected components as objects of their own (ids 1..N, in order of the objects' ids),
    components under ``min_size`` voxels set to 0 (google/ffn ``segmentation.clean_up`` with ``split_cc`` and
    ``min_size``). 0 stays 0."""
    from scipy import ndimage

    out = np.zeros(seg.shape, dtype=np.int64)
    next_id = 0
    ids = np.unique(seg[seg > 0])
    if not len(ids):
        return out.astype(np.uint32)
    dense = np.searchsorted(ids, seg) + 1
    dense[seg <= 0] = 0
    for index, box in enumerate(ndimage.find_objects(dense)):
        if box is None:
            continue
        components, count = ndimage.label(dense[box] == index + 1)  # 6-connected (the default structure)
        sizes = np.bincount(components.ravel(), minlength=count + 1)
        keep = np.flatnonzero(sizes[1:] >= min_size) + 1
        table = np.zeros(count + 1, dtype=np.int64)
        table[keep] = np.arange(next_id + 1, next_id + 1 + len(keep))
        next_id += len(keep)
        view = out[box]
        inside = components > 0
        view[inside] = table[components[inside]]
    return out.astype(np.uint32 if next_id < 2**32 else np.uint64)


def make_labels_contiguous(seg: np.ndarray) -> np.ndarray:
    """Renumber ids to 1..N in order of first id, keeping 0 as 0 (``segmentation.make_labels_contiguous``)."""
    ids, inverse = np.unique(seg, return_inverse=True)
    new = np.arange(len(ids), dtype=np.int64)
    if len(ids) and ids[0] != 0:
        new += 1  # no background present: ids start at 1
    out = new[inverse].reshape(seg.shape)
    return out.astype(np.uint32 if out.max(initial=0) < 2**32 else np.uint64)


# --------------------------------------------------------------------------- driving canvases
# A flood yields lists of (FOV centre, seed logits) and is sent back the model's logits for each, in order: one
# object's flood (``Canvas._flood_object``) one or two FOVs at a time, a canvas's floods (``Canvas.flood``) those of
# every object in flight at once.
FovRequests = Generator[list[tuple[Position, np.ndarray]], list[np.ndarray], int | None]
FovBatches = Generator[list[tuple[Position, np.ndarray]], list[np.ndarray], None]


def check_output(out: Any, input_shape: Sequence[int]) -> Any:
    """The model's output as float32 on the CPU, after checking it has one logit per input voxel."""
    import torch

    if tuple(out.shape) != (input_shape[0], 1, *input_shape[2:]):
        raise RuntimeFailure(
            f"FFN model returned shape {tuple(out.shape)} for an input of {tuple(input_shape)}",
            hint="the model must return (N, 1, Z, Y, X) logits of the input's size ('same' padding)",
        )
    return out.detach().to("cpu", torch.float32)


def run_requests(requests: FovRequests, predict: Callable[[Position, np.ndarray], np.ndarray]) -> Any:
    """Answer every FOV request of one flood with ``predict``, one FOV at a time; returns the generator's value."""
    try:
        batch = next(requests)
        while True:
            batch = requests.send([predict(pos, logit_seed) for pos, logit_seed in batch])
    except StopIteration as stop:
        return stop.value


def run_floods(canvas: Canvas, floods: FovBatches) -> None:
    """Answer every batch of FOVs a canvas's floods ask for, each batch in one model call."""
    flood_together(canvas.model, [(canvas, floods)])


def flood_together(model: Any, floods: Sequence[tuple[Canvas, FovBatches]]) -> None:
    """Advance several canvases' floods in lock step, their pending FOVs stacked into one model call.

    Each canvas computes exactly what it would alone (its own FOVs in its own order); only the model sees
    a batch. The canvases must share the FOV size. Used for the pieces of a subvolume plan in one process, and
    for one canvas flooding several objects at once (``Canvas.flood``'s ``width``).
    """
    if not floods:
        return
    fov = floods[0][0].fov
    if any(c.fov != fov for c, _ in floods):
        raise ConfigError("canvases flooded together must have the same FOV")
    pending: list[tuple[Canvas, FovBatches, list[tuple[Position, np.ndarray]]]] = []
    for canvas, requests in floods:
        try:
            pending.append((canvas, requests, next(requests)))
        except StopIteration:
            continue
    predictor = _BatchPredictor(model, floods[0][0].device, fov)
    while pending:
        logits = predictor([(canvas, pos, seed) for canvas, _, batch in pending for pos, seed in batch])
        still, at = [], 0
        for canvas, requests, batch in pending:
            canvas._count("flood_fovs", len(batch))  # the moves' FOVs and the checks' bare-seed FOVs alike
            answers, at = logits[at : at + len(batch)], at + len(batch)
            try:
                still.append((canvas, requests, requests.send(answers)))
            except StopIteration:
                pass
        pending = still


class _BatchPredictor:
    """One model call for a list of (canvas, FOV centre, seed logits); the input buffer is kept between calls."""

    def __init__(self, model: Any, device: Any, fov: Position) -> None:
        self.model, self.device, self.fov = model, device, fov
        self._inputs: Any = None

    def __call__(self, requests: Sequence[tuple[Canvas, Position, np.ndarray]]) -> list[np.ndarray]:
        import torch

        n = len(requests)
        if self._inputs is None or self._inputs.shape[0] < n:
            # Channels-last like the tuned model's weights, so the model's input conversion is a no-op.
            self._inputs = torch.empty((n, 2, *self.fov), dtype=torch.float32, device=self.device).contiguous(
                memory_format=torch.channels_last_3d)
        inputs = self._inputs[:n]
        for i, (canvas, pos, logit_seed) in enumerate(requests):
            canvas.fill_input(inputs[i], pos, logit_seed)
        with torch.inference_mode():
            out = check_output(self.model(inputs), inputs.shape).numpy()
        return [out[i, 0] for i in range(n)]


class _SeedOrder:
    """Which seed a canvas may take up next while other objects are in flight, and which finished objects may be
    committed: seeds are taken up in order except that one may go before earlier seeds still waiting when it lies
    more than twice ``reach`` (per axis, in some axis) from all of them and from every object in flight — then
    none of them reads or writes what it does. Objects commit in seed order."""

    def __init__(self, seeds: list[Position], reach: Position | None, window: int) -> None:
        self.seeds, self.reach, self.window = seeds, reach, window
        self.next = 0  # seeds before this were looked at
        self.waiting: list[int] = []  # looked at, held back (seed order)
        self.flight: dict[int, _Object] = {}  # started, not committed
        self.pending: list[int] = []  # every seed index not yet committed or skipped, in order (waiting + flight)
        self.changed = True  # something finished since the last look: worth looking again

    def _clash(self, a: Position, b: Position) -> bool:
        """Whether floods from ``a`` and ``b`` may touch the same voxels (always, when floods are unbounded)."""
        if self.reach is None:
            return True
        return all(abs(p - q) <= 2 * r for p, q, r in zip(a, b, self.reach, strict=True))

    def take(self) -> tuple[int, Position] | None:
        """The first seed that may be taken up now (it leaves the waiting list), or None."""
        if not self.changed:
            return None
        blockers = [obj.start for obj in self.flight.values()]
        for i in self.waiting:
            pos = self.seeds[i]
            if not any(self._clash(pos, b) for b in blockers):
                self.waiting.remove(i)
                return i, pos
            blockers.append(pos)
        while self.next < len(self.seeds) and len(self.waiting) < self.window:
            i, self.next = self.next, self.next + 1
            pos = self.seeds[i]
            self.pending.append(i)
            if not any(self._clash(pos, b) for b in blockers):
                return i, pos
            self.waiting.append(i)
            blockers.append(pos)
        self.changed = False
        return None

    def skipped(self, index: int) -> None:
        self.pending.remove(index)

    def started(self, index: int, obj: _Object) -> None:
        self.flight[index] = obj
        if obj.done:
            self.changed = True

    def committable(self) -> list[_Object]:
        """The finished objects whose earlier seeds are all committed or skipped, in order (they leave)."""
        out = []
        while self.pending and self.pending[0] in self.flight and self.flight[self.pending[0]].done:
            out.append(self.flight.pop(self.pending.pop(0)))
        if out:
            self.changed = True
        return out

    def finished(self) -> bool:
        return not self.pending and self.next >= len(self.seeds)


# --------------------------------------------------------------------------- the canvas
@dataclass
class _Box:
    """A box of the volume, [lo, hi) per axis, grown as a flood writes; plain ints (updated once per FOV)."""

    lo: list[int]
    hi: list[int]

    @classmethod
    def at(cls, pos: Sequence[int]) -> _Box:
        return cls([int(p) for p in pos], [int(p) + 1 for p in pos])

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
        movement = FaceMaxMovementPolicy(canvas.deltas, canvas.move_logit, order=canvas.movement_order)
        movement.reset(start)
        return cls(start=start, movement=movement, visited=_Box(list(start), list(start)), written=_Box.at(start),
                   began=time.perf_counter())


class Canvas:
    """State of flood-filling one volume: the object logit map (``seed``) and the ``segmentation``.

    ``seed`` holds the current object's logits, NaN where the FOV has not been yet (the reference's
    convention); NaN is fed to the model as ``logit(pad_value)``. ``segmentation`` holds 0 (empty),
    -1 (a seed position that failed: too weak or too small) or an object id > 0.
    """

    def __init__(
        self,
        model: Any,
        image: np.ndarray,
        fov: int | Sequence[int],
        deltas: int | Sequence[int],
        *,
        move_threshold: float = 0.9,
        segment_threshold: float = 0.6,
        min_segment_size: int = 1000,
        init_activation: float = 0.95,
        pad_value: float = 0.05,
        min_boundary_dist: int | Sequence[int] = 1,
        image_mean: float = DEFAULT_IMAGE_MEAN,
        image_stddev: float = DEFAULT_IMAGE_STDDEV,
        movement_order: str = "fifo",
        device: str = "cpu",
        max_seed_distance: int = 0,
        self_prediction: float = 0.0,
        self_prediction_min_voxels: int = 50,
        self_prediction_radius: int = 0,
        speculative_self_prediction: bool = False,
    ) -> None:
        import torch

        if image.ndim != 3:
            raise DataError(f"inference image has shape {image.shape}; expected a 3-D (z, y, x) volume")
        self.fov = _triple(fov, "fov")
        self.deltas = _triple(deltas, "deltas")
        if any(s % 2 == 0 or s < 1 for s in self.fov):
            raise ConfigError(f"fov {self.fov} must be odd sizes", key="model_args.fov")
        self.margin = tuple(s // 2 for s in self.fov)
        problem = deltas_problem(self.fov, self.deltas)  # the rule the laptop checks model_args by
        if problem:
            raise ConfigError(problem, key="model_args.deltas", hint="use smaller deltas or a larger fov")
        if image_stddev <= 0:
            raise ConfigError(f"image_stddev must be > 0, got {image_stddev}", key="image_stddev")
        self.shape = tuple(int(s) for s in image.shape)
        if any(s < f for s, f in zip(self.shape, self.fov, strict=True)):
            raise DataError(f"inference image of shape {self.shape} is smaller than the FOV {self.fov}")

        self.model = model
        self.device = torch.device(device)
        self.image = image
        norm = (image.astype(np.float32) - np.float32(image_mean)) / np.float32(image_stddev)
        self._image_t = torch.from_numpy(norm).to(self.device)
        # Channels-last like the tuned model's weights, so the model's input conversion is a no-op.
        self._input = torch.empty((1, 2, *self.fov), dtype=torch.float32, device=self.device).contiguous(
            memory_format=torch.channels_last_3d)

        self.move_logit = logit(move_threshold)
        self.segment_logit = logit(segment_threshold)
        self.init_logit = logit(init_activation)
        self.pad_logit = np.float32(logit(pad_value))
        self.min_segment_size = int(min_segment_size)
        self.min_boundary_dist = _triple(min_boundary_dist, "min_boundary_dist")

        self.seed = np.full(self.shape, np.nan, dtype=np.float32)
        self.segmentation = np.zeros(self.shape, dtype=np.int32)
        self.movement_order = movement_order
        FaceMaxMovementPolicy(self.deltas, self.move_logit, order=movement_order)  # checks the order here
        self.origins: dict[int, dict[str, Any]] = {}  # id -> seed position, iterations, seconds
        self.overlaps: dict[int, dict[int, int]] = {}  # id -> {earlier id: voxels above threshold there}
        self.max_seed_distance = int(max_seed_distance)
        self.self_prediction = float(self_prediction)
        self.self_prediction_min_voxels = int(self_prediction_min_voxels)
        self.speculative = bool(speculative_self_prediction)
        self._bare_seed = np.full(self.fov, self.pad_logit, dtype=np.float32)
        self._bare_seed[tuple(f // 2 for f in self.fov)] = self.init_logit
        self._near = None  # the voxels of a FOV the check looks at: all, or those within a radius of its centre
        if self_prediction_radius:
            axes = np.ogrid[tuple(slice(-(f // 2), f // 2 + 1) for f in self.fov)]
            self._near = sum(a.astype(np.float32) ** 2 for a in axes) <= float(self_prediction_radius) ** 2
        self.counters: dict[str, int] = {}
        self._max_id = 0
        self._dirty: _Box | None = None  # the seed box ``segment_at`` left written (cleared by the next seed)

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _fov_box(self, pos: Sequence[int]) -> tuple[slice, slice, slice]:
        z, y, x = (int(p) - m for p, m in zip(pos, self.margin, strict=True))
        fz, fy, fx = self.fov
        return (slice(z, z + fz), slice(y, y + fy), slice(x, x + fx))

    def init_seed(self, pos: Position) -> None:
        """Reset the object map to NaN and put ``logit(init_activation)`` at ``pos`` (``Canvas.init_seed``).

        Only the box written since the last reset is cleared: the rest is still NaN, so this equals the
        reference's full reset at a fraction of the cost.
        """
        if self._dirty is not None:
            self._clear(self._dirty)
        self.seed[pos] = self.init_logit
        self._dirty = _Box.at(pos)

    def _clear(self, box: _Box) -> None:
        (z0, y0, x0), (z1, y1, x1) = box.lo, box.hi
        self.seed[z0:z1, y0:y1, x0:x1] = np.nan

    def is_valid_pos(self, pos: Position, ignore_move_threshold: bool = False, start: Position | None = None) -> bool:
        """Whether to run the FFN at ``pos`` (``Canvas.is_valid_pos``) for the object seeded at ``start``.

        Requires the object probability there >= move threshold (unless starting an object), the whole FOV
        inside the volume, and the voxel not yet part of another object.
        """
        if not ignore_move_threshold and not self.seed[pos] >= self.move_logit:  # NaN fails too
            self._count("skip_threshold")
            return False
        for p, m, s in zip(pos, self.margin, self.shape, strict=True):
            if p - m < 0 or p + m >= s:
                self._count("skip_invalid_pos")
                return False
        if self.segmentation[pos] > 0:
            self._count("skip_invalid_pos")
            return False
        if self.max_seed_distance and not ignore_move_threshold and start is not None and any(
                abs(p - s) > self.max_seed_distance for p, s in zip(pos, start, strict=True)):
            self._count("skip_seed_distance")
            return False
        return True

    def predict(self, pos: Position, logit_seed: np.ndarray) -> np.ndarray:
        """Run the model once on the FOV at ``pos`` with ``logit_seed``; returns the logits (z, y, x)."""
        import torch

        self.fill_input(self._input[0], pos, logit_seed)
        with torch.inference_mode():
            out = self.model(self._input)
        return check_output(out, self._input.shape)[0, 0].numpy()

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
        self._count("agglomeration_fovs", len(positions))
        return out

    def fill_input(self, target: Any, pos: Position, logit_seed: np.ndarray) -> None:
        """Write the model input of the FOV at ``pos`` (image, seed logits) into ``target`` (2, Z, Y, X)."""
        import torch

        target[0].copy_(self._image_t[self._fov_box(pos)])
        target[1].copy_(torch.from_numpy(logit_seed))

    def update_at(self, pos: Position) -> np.ndarray:
        """Predict at ``pos`` and write the logits into the object map (``Canvas.update_at``).

        The reference's self-consistency iterations, disconnected-seed bias and self-prediction halting are
        off by default there and are not implemented here.
        """
        logits = self.predict(pos, self.seed_at(pos))
        self.write_back(pos, logits)
        return logits

    def seed_at(self, pos: Position) -> np.ndarray:
        """The seed logits of the FOV at ``pos`` as the model sees them: NaN (not predicted yet) as the pad."""
        return np.nan_to_num(self.seed[self._fov_box(pos)], nan=self.pad_logit)

    def write_back(self, pos: Position, logits: np.ndarray, box: _Box | None = None) -> None:
        """Overwrite the object map's FOV at ``pos`` with the model's logits; grow ``box`` (the object's written
        box; by default the one ``segment_at`` clears at the next seed) over it."""
        fov_box = self._fov_box(pos)
        self.seed[fov_box] = logits
        box = box if box is not None else self._dirty
        if box is not None:
            box.cover(fov_box)
        else:
            self._dirty = _Box([b.start for b in fov_box], [b.stop for b in fov_box])

    def segment_at(self, start: Position) -> int:
        """Flood one object from ``start`` until the move queue is empty; returns the FFN call count.

        Mirrors ``Canvas.segment_at``: stops early when the seed voxel itself drops below the move threshold.
        The object map keeps its logits until the next seed.
        """
        self.init_seed(start)
        obj = _Object.start_at(start, self)
        obj.written = self._dirty
        return run_requests(self._flood_object(obj), self.predict)

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
                self._count("seed_got_too_weak")
                break
            checked = self.self_prediction > 0 and pos != start
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
                    self._count("self_prediction_rejects")
                    movement.mark_visited(pos)
                    continue
            if not (checked and self.speculative):
                (logits,) = yield [(pos, self.seed_at(pos))]
            self.write_back(pos, logits, obj.written)
            obj.visited.cover_point(pos)
            iters += 1
            movement.update(logits, pos)
        self._count("ffn_calls", iters)
        obj.iters = iters
        return iters

    def _agrees(self, pos: Position, bare: np.ndarray) -> bool:
        """Whether a bare-seed prediction at ``pos`` claims enough of the object voxels already in its FOV."""
        known = self.seed[self._fov_box(pos)] >= self.segment_logit
        if self._near is not None:
            known &= self._near
        if int(known.sum()) < self.self_prediction_min_voxels:
            return True
        return float(np.mean(bare[known] >= self.segment_logit)) >= self.self_prediction

    def _too_close(self, pos: Position) -> bool:
        sel = tuple(slice(max(p - d, 0), p + d + 1) for p, d in zip(pos, self.min_boundary_dist, strict=True))
        return bool(np.any(self.segmentation[sel] > 0))

    def _mark_failed(self, pos: Position) -> None:
        if self.segmentation[pos] == 0:
            self.segmentation[pos] = -1

    def segment_all(self, seeds: np.ndarray | Sequence[Sequence[int]], width: int = 1) -> None:
        """Try to create one object from every seed, in order (``Canvas.segment_all``); see ``flood``."""
        run_floods(self, self.flood(seeds, width))

    def _may_start(self, pos: Position) -> bool:
        """Whether an object may be seeded at ``pos`` now (else the seed is skipped, as the reference does)."""
        if not self.is_valid_pos(pos, ignore_move_threshold=True):
            return False
        if self._too_close(pos):
            self._count("skip_too_close")
            self.segmentation[pos] = -1
            return False
        return True

    def _reach(self) -> Position | None:
        """How far (per axis) from its seed an object's flood reads or writes anything: its FOVs' centres stay within
        ``max_seed_distance`` of the seed, and a FOV reaches ``margin`` beyond its centre. None: unbounded."""
        if not self.max_seed_distance:
            return None
        d = self.max_seed_distance
        return (d + self.margin[0], d + self.margin[1], d + self.margin[2])

    def flood(self, seeds: np.ndarray | Sequence[Sequence[int]], width: int = 1) -> FovBatches:
        """``segment_all`` as a generator of FOV batches: the FOVs of up to ``width`` objects in flight at once.

        A seed is skipped when its FOV leaves the volume, when it already lies in an object, or when an
        object is within ``min_boundary_dist`` of it. After flooding, the object is the voxels of the
        touched box with probability >= segment threshold that are not yet in another object (earlier
        objects keep their voxels; the overlap is recorded in ``overlaps``); it is dropped when it has fewer
        than ``min_segment_size`` such voxels or when the seed voxel itself ended below the move threshold.

        ``width`` > 1 (with ``max_seed_distance`` set, so that a flood stays within ``_reach`` of its seed)
        floods several objects at once, their FOVs in one model call. A seed is taken up (checked, then
        flooded) only when no object in flight and no earlier seed still waiting lies within twice the reach of
        it, and objects are committed in seed order: every object reads and writes exactly what it would one
        after another, and gets the same id; only the model sees a batch. Seeds up to ``LOOKAHEAD`` x width
        places beyond the first waiting one may go first.
        """
        reach = self._reach()
        if width < 1:
            raise ConfigError(f"concurrent_floods must be >= 1, got {width}", key="concurrent_floods")
        if reach is None:
            width = 1
        queue = [(int(r[0]), int(r[1]), int(r[2])) for r in np.asarray(seeds, dtype=np.int64).reshape(-1, 3)]
        order = _SeedOrder(queue, reach, window=1 if width == 1 else self.LOOKAHEAD * width)
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

    LOOKAHEAD = 8  # seeds per unit of width that may be taken up before the first waiting one

    def _start_object(self, pos: Position) -> _Object:
        if self._dirty is not None:  # a box ``segment_at`` left written
            self._clear(self._dirty)
            self._dirty = None
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
                self._count("failed_weak_seed")
                return
            sel = tuple(slice(max(lo - m, 0), hi + m + 1)
                        for lo, hi, m in zip(obj.visited.lo, obj.visited.hi, self.margin, strict=True))
            mask = self.seed[sel] >= self.segment_logit
            seg_box = self.segmentation[sel]  # a view: writes go to the canvas
            ids, counts = np.unique(seg_box[mask], return_counts=True)
            overlapped = {int(i): int(c) for i, c in zip(ids, counts, strict=True) if i > 0}
            mask &= seg_box <= 0
            size = int(mask.sum())
            if size < self.min_segment_size:
                self._mark_failed(pos)
                self._count("failed_too_small")
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
            self._count("voxels_segmented", size)
        finally:
            self._clear(obj.written)

    def labels(self) -> np.ndarray:
        """The segmentation as uint32 ids 1..N, 0 for unsegmented voxels (failed-seed markers removed)."""
        return make_labels_contiguous(np.maximum(self.segmentation, 0))


# --------------------------------------------------------------------------- config + drivers
@dataclass
class InferenceConfig:
    """Settings of one segmentation run (the reference's ``InferenceOptions`` plus seed policy and FOV)."""

    fov: tuple[int, int, int] = (33, 33, 33)
    deltas: tuple[int, int, int] = (8, 8, 8)
    move_threshold: float = 0.9
    segment_threshold: float = 0.6
    min_segment_size: int = 1000
    init_activation: float = 0.95
    pad_value: float = 0.05
    min_boundary_dist: tuple[int, int, int] = (1, 1, 1)
    seed_policy: str = "peaks"
    seed_args: dict[str, Any] = field(default_factory=dict)
    image_mean: float = DEFAULT_IMAGE_MEAN
    image_stddev: float = DEFAULT_IMAGE_STDDEV
    movement_order: str = "fifo"
    device: str = "cpu"
    # Not in the reference (both 0 = off): after the policy's seeds are used, ``reseed_passes`` more passes of
    # the peaks policy over the still-unsegmented voxels (segmented ones count as edges); then every object
    # grown by up to ``expand_labels`` voxels into unsegmented ones, nearest object first (as the baseline).
    reseed_passes: int = 0
    expand_labels: int = 0
    # Not in the reference (0 = off): FOVs stay within ``max_seed_distance`` voxels (per axis) of their object's
    # seed, so a flood that leaks through a faint membrane takes a piece of the neighbour, not all of it; pieces
    # within 3 voxels of each other over ``min_contact`` voxel pairs or more are then joined where the FFN, run
    # from a bare seed inside each near the other, claims at least ``agglomerate_threshold`` of the other's
    # voxels in its FOV both ways (``agglomeration.py``). ``watershed_fill``: every voxel left unsegmented then
    # goes to the object whose intensity watershed reaches it (before ``expand_labels``, which it makes moot).
    max_seed_distance: int = 0
    self_prediction: float = 0.0
    self_prediction_radius: int = 0
    agglomerate_threshold: float = 0.0
    min_contact: int = 20
    watershed_fill: bool = False
    # Not in the reference's canvas (its segmentation.clean_up does it): after the floods, every object is split
    # into its 6-connected components and those under ``min_segment_size`` voxels are left unsegmented, before
    # pieces are joined or filled. A flood's object is every voxel of its box at or above the segment threshold,
    # connected to the seed or not: stray voxels inside a neighbour would otherwise join their flood's piece to
    # the neighbour (its bare seeds sit in the neighbour and claim it).
    split_pieces: bool = False
    # How scored pairs become joins (``agglomeration.join_groups``): "single" joins every pair at or above
    # ``agglomerate_threshold``, transitively; "average" joins groups of pieces best first while the mean score of
    # the pairs between them reaches it, so one leaky pair cannot join two objects that other pairs keep apart.
    linkage: str = "single"
    # Not in the reference (None = off): a logistic model over each claimed pair's features (the claim, and what the
    # image shows between the two pieces: ``join_model.FEATURES``), fitted on a labelled volume's pieces
    # (``JoinModel.as_dict``); its probability that the pair is one object replaces the claim as the pair's score.
    join_model: dict[str, Any] | None = None
    # Not in the reference (1 = one object at a time): with ``max_seed_distance`` set, up to this many objects are
    # flooded at once, far enough apart that none reads what another writes, their FOVs in one model call; the
    # objects are the same as one at a time up to the float32 sums of a batched convolution (``Canvas.flood``).
    concurrent_floods: int = 1
    # Not in the reference (False = off): with ``self_prediction``, each move's seeded FOV is asked in the same model
    # call as the check's bare-seed FOV and thrown away when the check refuses the move — the same objects from
    # fewer, larger calls (a GPU's gain; on a CPU a batch of two costs what two single FOVs do).
    speculative_self_prediction: bool = False
    # Not in the reference ("float32"): "bfloat16" runs the model's forward under bfloat16 autocast (its logits
    # still float32), "auto" does where the device computes bfloat16 natively (runtime/precision.py): ~1.7x the
    # demo's FOVs/s, ~5x the published model's on an AMX CPU (benchmarks/ffn.py); the objects may differ.
    precision: str = "float32"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "inference config") -> InferenceConfig:
        """Build from a mapping; unknown keys raise ConfigError listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(
                f"unknown inference setting(s) {unknown}", path=where, hint=f"valid keys: {', '.join(names)}"
            )
        kwargs = dict(data)
        if kwargs.get("precision", "float32") not in PRECISION_REQUESTS:
            raise ConfigError(f"inference precision {kwargs['precision']!r} is not one of "
                              f"{', '.join(PRECISION_REQUESTS)}",
                              path=where, hint="use float32 (the default), bfloat16 or auto")
        for key in ("fov", "deltas", "min_boundary_dist"):
            if key in kwargs:
                kwargs[key] = _triple(kwargs[key], key)
        if kwargs.get("join_model") is not None:
            from hpctrain.ffn.join_model import JoinModel

            kwargs["join_model"] = JoinModel.from_mapping(kwargs["join_model"], f"{where}: join_model").as_dict()
        return cls(**kwargs)

    def unbatched(self) -> InferenceConfig:
        """These settings with one object in flight and no speculative FOVs: the same objects, because
        ``concurrent_floods`` and ``speculative_self_prediction`` change how FOVs are batched, not what is flooded."""
        return dataclasses.replace(self, concurrent_floods=1, speculative_self_prediction=False)

    def canvas_kwargs(self) -> dict[str, Any]:
        return {
            "move_threshold": self.move_threshold,
            "segment_threshold": self.segment_threshold,
            "min_segment_size": self.min_segment_size,
            "init_activation": self.init_activation,
            "pad_value": self.pad_value,
            "min_boundary_dist": self.min_boundary_dist,
            "image_mean": self.image_mean,
            "image_stddev": self.image_stddev,
            "movement_order": self.movement_order,
            "device": self.device,
            "max_seed_distance": self.max_seed_distance,
            "self_prediction": self.self_prediction,
            "self_prediction_radius": self.self_prediction_radius,
            "speculative_self_prediction": self.speculative_self_prediction,
        }


def _as_config(cfg: InferenceConfig | Mapping[str, Any] | None) -> InferenceConfig:
    if cfg is None:
        return InferenceConfig()
    return cfg if isinstance(cfg, InferenceConfig) else InferenceConfig.from_mapping(cfg)


def segment_volume(
    model: Any,
    image: np.ndarray,
    cfg: InferenceConfig | Mapping[str, Any] | None = None,
    *,
    seeds: np.ndarray | None = None,
    return_canvas: bool = False,
) -> np.ndarray | tuple[np.ndarray, Canvas]:
    """Segment ``image`` with ``model``: seeds from ``cfg.seed_policy`` (or ``seeds``) → canvas → labels."""
    cfg = _as_config(cfg)
    model.eval()
    canvas = Canvas(model, image, cfg.fov, cfg.deltas, **cfg.canvas_kwargs())
    run_floods(canvas, _segmentation(canvas, cfg, seeds))
    labels = _finish(canvas, cfg)
    return (labels, canvas) if return_canvas else labels


def segment_volumes_together(model: Any, images: Sequence[np.ndarray],
                             cfg: InferenceConfig | Mapping[str, Any] | None = None) -> list[np.ndarray]:
    """``segment_volume`` of several images (e.g. subvolumes), their FOVs batched into shared model calls.

    Each result equals ``segment_volume`` of that image alone up to the float32 summation order of a batched
    convolution."""
    cfg = _as_config(cfg)
    model.eval()
    canvases = [Canvas(model, image, cfg.fov, cfg.deltas, **cfg.canvas_kwargs()) for image in images]
    flood_together(model, [(c, _segmentation(c, cfg, None)) for c in canvases])
    return [_finish(c, cfg) for c in canvases]


def _segmentation(canvas: Canvas, cfg: InferenceConfig, seeds: np.ndarray | None) -> FovBatches:
    """Every flood of one segmentation: the policy's seeds, then ``reseed_passes`` passes of the peaks policy
    over the voxels still unsegmented; ``cfg.concurrent_floods`` objects in flight at once."""
    image = canvas.image
    width = cfg.concurrent_floods
    if seeds is None:
        seeds = make_seeds(cfg.seed_policy, image, **cfg.seed_args)
    yield from canvas.flood(within_margin(seeds, canvas.shape, canvas.margin), width)
    peak_args = cfg.seed_args if cfg.seed_policy == "peaks" else {}
    for _ in range(cfg.reseed_passes):
        before = len(canvas.origins)
        more = make_seeds("peaks", image, **{**peak_args, "mask": canvas.segmentation > 0})
        yield from canvas.flood(within_margin(more, canvas.shape, canvas.margin), width)
        if len(canvas.origins) == before:
            break
    return None


def _finish(canvas: Canvas, cfg: InferenceConfig) -> np.ndarray:
    """The canvas's objects as labels: joined by agglomeration, filled by watershed and grown by
    ``expand_labels`` when set."""
    pieces, scores = pieces_and_scores(canvas, cfg)
    return join_and_fill(canvas.image, pieces, scores, cfg, canvas.counters)


def pieces_and_scores(canvas: Canvas, cfg: InferenceConfig) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """The flooded canvas's objects (ids 1..N) and, when ``cfg`` agglomerates, the score of every pair of them in
    contact (``pair_scores``): what any join threshold is applied to."""
    labels, claims = pieces_and_claims(canvas, cfg)
    return labels, pair_scores(canvas.image, labels, claims, cfg)


def pieces_and_claims(canvas: Canvas, cfg: InferenceConfig) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """The flooded canvas's objects (ids 1..N; split into connected pieces where ``cfg.split_pieces``) and, when
    ``cfg`` agglomerates, the mutual bare-seed claim of every two of them in contact (``mutual_claims``)."""
    labels = canvas.labels()
    if cfg.split_pieces:
        labels = split_disconnected(labels, cfg.min_segment_size)
    if cfg.agglomerate_threshold <= 0:
        return labels, {}
    pairs = sorted(contact_pairs(labels, min_voxels=cfg.min_contact))
    canvas.counters["agglomeration_pairs"] = len(pairs)
    return labels, mutual_claims(labels, canvas.predict_bare, canvas.fov, canvas.segment_logit, pairs)


def pair_scores(image: np.ndarray, pieces: np.ndarray, claims: Mapping[tuple[int, int], float],
                cfg: InferenceConfig) -> dict[tuple[int, int], float]:
    """The score each claimed pair is joined by: its claim, or ``cfg.join_model``'s probability."""
    if cfg.join_model is None:
        return dict(claims)
    from hpctrain.ffn.join_model import JoinModel, join_scores

    return join_scores(image, pieces, claims, JoinModel.from_mapping(cfg.join_model))


def join_and_fill(image: np.ndarray, pieces: np.ndarray, scores: Mapping[tuple[int, int], float],
                  cfg: InferenceConfig, counters: dict[str, int] | None = None) -> np.ndarray:
    """``pieces`` joined where their score reaches ``cfg.agglomerate_threshold``, then watershed-filled and
    grown by ``expand_labels`` as ``cfg`` says."""
    labels = pieces
    if cfg.agglomerate_threshold > 0:
        joined = agglomerate(pieces, scores, cfg.agglomerate_threshold, cfg.linkage)
        if counters is not None:
            counters["agglomeration_joins"] = (len(np.unique(pieces[pieces > 0]))
                                               - len(np.unique(joined[joined > 0])))
        labels = make_labels_contiguous(joined)
    if cfg.watershed_fill:
        labels = watershed_fill(image, labels)
    if cfg.expand_labels > 0:
        from skimage.segmentation import expand_labels

        labels = expand_labels(labels, distance=cfg.expand_labels)
    return labels


def _split_h5(path: str | Path, default_dataset: str) -> tuple[Path, str]:
    text = str(path)
    for suffix in (".h5:", ".hdf5:", ".hdf:"):
        at = text.rfind(suffix)
        if at >= 0:
            return Path(text[: at + len(suffix) - 1]), text[at + len(suffix) :] or default_dataset
    return Path(text), default_dataset


def _attr_value(value: Any) -> Any:
    if isinstance(value, str | int | float | bool | np.integer | np.floating):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, int | float) for v in value):
        return np.asarray(value)
    return json.dumps(value, default=str)


def write_segmentation_hdf5(
    path: str | Path, seg: np.ndarray, attrs: Mapping[str, Any] | None = None, dataset: str = "segmentation"
) -> Path:
    """Write ``seg`` to ``path`` (``file.h5`` or ``file.h5:dataset``) atomically, gzip-chunked, with attrs.

    Attribute values that HDF5 cannot hold directly (mappings, mixed lists) are stored as JSON text.
    """
    import h5py

    file, name = _split_h5(path, dataset)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            ds = f.create_dataset(name, data=seg, chunks=True, compression="gzip", compression_opts=1)
            for key, value in (attrs or {}).items():
                ds.attrs[key] = _attr_value(value)
        os.replace(tmp, file)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"could not write segmentation to {file}: {e}", hint="check the output path") from e
    return file


def load_model(
    checkpoint_path: str | Path, device: str = "cpu"
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Load ``torch.save({'model': state_dict, 'model_args': {...}})``; returns (model, model_args, ckpt).

    A checkpoint directory written by training is accepted: the newest checkpoint whose shared file matches
    the manifest (``checkpoint.manifest.newest_shared_file``) is used. ``model_args`` keys that
    ``ConvStack3D`` does not take (``deltas``, ...) are kept for the caller but not passed to it.
    """
    import inspect

    import torch

    from hpctrain.checkpoint.manifest import newest_shared_file
    from hpctrain.ffn.model import ConvStack3D

    path = Path(checkpoint_path)
    if path.is_dir():  # a run's checkpoint directory: the newest checkpoint the manifest vouches for
        path, _ = newest_shared_file(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist", hint="pass the .pt file training wrote")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises pickle/zip/runtime errors for a bad file
        raise CheckpointError(f"checkpoint {path} could not be read: {e}") from e
    if not isinstance(ckpt, Mapping) or "model" not in ckpt or "model_args" not in ckpt:
        keys = sorted(ckpt) if isinstance(ckpt, Mapping) else type(ckpt).__name__
        raise CheckpointError(
            f"checkpoint {path} has {keys}; expected a mapping with 'model' (state_dict) and 'model_args'",
            hint="save with torch.save({'model': model.state_dict(), 'model_args': {...}}, path)",
        )
    model_args = dict(ckpt["model_args"])
    accepted = set(inspect.signature(ConvStack3D.__init__).parameters) - {"self"}
    kwargs = {k: v for k, v in model_args.items() if k in accepted}
    if "fov" in kwargs:
        kwargs["fov"] = _triple(kwargs["fov"], "model_args.fov")
    model = ConvStack3D(**kwargs)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path} does not match ConvStack3D({kwargs}): {e}") from e
    model.to(device).eval()
    return model, model_args, dict(ckpt)


def prepare_inference(
    checkpoint_path: str | Path,
    config: InferenceConfig | Mapping[str, Any] | None = None,
    *,
    threads: int | None = None,
    tune: bool = True,
) -> tuple[Any, InferenceConfig, dict[str, Any]]:
    """The model (tuned for CPU inference unless ``tune`` is False), the settings and the checkpoint's
    ``model_args``. FOV and deltas come from ``model_args`` unless ``config`` sets them; image_mean and
    image_stddev from the checkpoint (top level or ``model_args``) unless ``config`` sets them."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    given = dict(config) if isinstance(config, Mapping) else {}
    cfg = _as_config(config)
    model, model_args, ckpt = load_model(checkpoint_path, cfg.device)
    updates: dict[str, Any] = {}
    for key in ("fov", "deltas"):
        if key not in given and key in model_args and not isinstance(config, InferenceConfig):
            updates[key] = _triple(model_args[key], f"model_args.{key}")
    for key in ("image_mean", "image_stddev"):
        if key not in given and not isinstance(config, InferenceConfig):
            value = ckpt.get(key, model_args.get(key))
            if value is not None:
                updates[key] = float(value)
    cfg = dataclasses.replace(cfg, **updates)
    precision = resolve_precision(cfg.precision, torch.device(cfg.device))
    cfg = dataclasses.replace(cfg, precision=precision)  # what ran: the segmentation's attributes record it
    if tune and cfg.device == "cpu":
        from hpctrain.ffn.perf import tune_for_inference

        model = tune_for_inference(model, torch.zeros((1, 2, *cfg.fov), dtype=torch.float32), precision=precision)
    elif precision == "bfloat16":
        from hpctrain.ffn.perf import BFloat16Inference

        model = BFloat16Inference(model)
    return model, cfg, model_args


def run_segment(
    checkpoint_path: str | Path,
    volume_spec: Any,
    out_path: str | Path,
    *,
    config: InferenceConfig | Mapping[str, Any] | None = None,
    threads: int | None = None,
    tune: bool = True,
) -> dict[str, Any]:
    """`hpctrain ffn segment`: checkpoint + image volume → segmentation HDF5; returns a summary dict.

    Settings as ``prepare_inference``; ``tune`` runs a copy of the model with the CPU inference settings of
    ``hpctrain.ffn.perf`` (oneDNN convolutions, channels-last; the same float32 sums up to their order).
    """
    from hpctrain.ffn.volume import load_volume

    model, cfg, model_args = prepare_inference(checkpoint_path, config, threads=threads, tune=tune)
    image = np.asarray(load_volume(volume_spec))
    if image.ndim != 3:
        raise DataError(f"image {volume_spec} has shape {image.shape}; expected a 3-D (z, y, x) volume")
    t0 = time.perf_counter()
    labels, canvas = segment_volume(model, image, cfg, return_canvas=True)
    seconds = time.perf_counter() - t0
    attrs = {
        "checkpoint": str(checkpoint_path),
        "image": str(volume_spec),
        "config": dataclasses.asdict(cfg),
        "model_args": model_args,
        "seconds": round(seconds, 3),
    }
    written = write_segmentation_hdf5(out_path, labels, attrs)
    return {
        "out": str(written),
        "objects": int(labels.max(initial=0)),
        "segmented_fraction": float((labels > 0).mean()),
        "ffn_calls": canvas.counters.get("ffn_calls", 0),
        "seconds": seconds,
        "counters": dict(canvas.counters),
    }
