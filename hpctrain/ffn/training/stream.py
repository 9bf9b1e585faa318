"""FFN training examples with FOV movement, batched per step, and their per-step voxel metrics.

Mirrors google/ffn ``train.py`` (``define_data_input``, ``get_example``, ``get_batch``), ``ffn/training/mask.py``,
``inputs.soften_labels`` and ``augmentation``; the movement policies are ``moves``, the loss and the step
``loss``. All shapes, offsets and coordinates are (z, y, x).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hpctrain.config.plugins.ffn_fields import Zyx, zyx
from hpctrain.errors import DataError
from hpctrain.ffn.logits import logit
from hpctrain.ffn.training.coordinates import shard
from hpctrain.ffn.training.moves import BareSeed, FixedMoves, MaxPredMoves, Moves, box_slices, crop, fixed_shifts

# --------------------------------------------------------------------------------------------- mask helpers


def make_seed(shape: Sequence[int], pad: float = 0.05, seed: float = 0.95) -> np.ndarray:
    """Seed canvas in logits: ``logit(seed)`` at ``shape // 2``, ``logit(pad)`` elsewhere (mask.make_seed)."""
    canvas = np.full(tuple(shape), logit(pad), dtype=np.float32)
    canvas[tuple(np.array(shape) // 2)] = logit(seed)
    return canvas


def update_at(canvas: np.ndarray, offset: Sequence[int], new_value: np.ndarray) -> None:
    """Paste ``new_value`` centred ``offset`` away from ``canvas``'s centre, in place (mask.update_at)."""
    canvas[box_slices(canvas.shape, offset, new_value.shape)] = new_value


def soften_labels(mask: np.ndarray, softness: float = 0.05) -> np.ndarray:
    """Boolean object mask -> float32 ``1 - softness`` / ``softness`` (inputs.soften_labels)."""
    return np.where(mask, np.float32(1.0 - softness), np.float32(softness)).astype(np.float32)


# ------------------------------------------------------------------------------------- examples and batches


def load_example(
    image: Any,
    labels: Any,
    centre: Sequence[int],
    size: Sequence[int],
    *,
    image_mean: float = 128.0,
    image_stddev: float = 33.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Read the training box of ``size`` around ``centre`` -> (normalised image float32, soft labels).

    As train.py ``define_data_input``: labels become the object at the centre voxel (0.95) vs everything
    else (0.05); a centre on background (label 0) gives an all-0.05 target. Reads only the box.
    """
    centre = np.array(centre, dtype=np.int64)
    size = np.array(size, dtype=np.int64)
    start = centre - (size - 1) // 2
    end = start + size
    if np.any(start < 0) or np.any(end > np.array(labels.shape)):
        raise DataError(
            f"training box of size {tuple(size)} around {tuple(centre)} leaves the volume "
            f"{tuple(labels.shape)}",
            hint=f"build coordinates with margin >= {tuple(int(v) for v in size // 2)} (fov // 2 + deltas)",
        )
    box = tuple(slice(int(s), int(e)) for s, e in zip(start, end, strict=True))
    lab = np.asarray(labels[box])
    centre_label = lab[tuple(size // 2)]
    mask = (lab > 0) & (lab == centre_label)
    img = (np.asarray(image[box], dtype=np.float32) - image_mean) / image_stddev
    return img, soften_labels(mask)


def draw_transform(
    rng: np.random.Generator, permutable_axes: Sequence[int], reflectable_axes: Sequence[int]
) -> tuple[list[int], list[int]]:
    """augmentation.PermuteAndReflect's random draw: (axis permutation, axes to reflect)."""
    perm = list(range(3))
    shuffled = rng.permutation(list(permutable_axes)) if permutable_axes else []
    for src, dst in zip(permutable_axes, shuffled, strict=True):
        perm[src] = int(dst)
    flips = [ax for ax in reflectable_axes if rng.random() < 0.5]
    return perm, flips


def apply_transform(arrays: Sequence[np.ndarray], perm: Sequence[int], flips: Sequence[int]) -> list[np.ndarray]:
    """Transpose every array by ``perm``, then reflect it along ``flips`` (contiguous copies)."""
    out = []
    for a in arrays:
        a = np.transpose(a, list(perm))
        if flips:
            a = np.flip(a, axis=list(flips))
        out.append(np.ascontiguousarray(a))
    return out


@dataclass
class FovBatch:
    """One step's batch: (B, 1, Z, Y, X) tensors, and each element's FOV offset from its example centre."""

    image: torch.Tensor
    seed: torch.Tensor
    labels: torch.Tensor
    offsets: list[Zyx]

    def inputs(self) -> torch.Tensor:
        """The model input (B, 2, Z, Y, X): image then seed logits."""
        return torch.cat([self.image, self.seed], dim=1)

    def to(self, device: torch.device) -> FovBatch:
        """The batch with its tensors on ``device`` (the stream builds them on the CPU, from numpy)."""
        return FovBatch(image=self.image.to(device), seed=self.seed.to(device), labels=self.labels.to(device),
                        offsets=self.offsets)


@dataclass
class _Slot:
    """One example in flight: its coordinate and augmentation (enough to reload its box), canvas and moves."""

    coord: Zyx
    transform: tuple[list[int], list[int]]
    image: np.ndarray
    labels: np.ndarray
    canvas: np.ndarray
    moves: Moves
    offset: Zyx | None = None


@dataclass
class VoxelCounts:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    examples: int = 0

    def add(self, other: VoxelCounts) -> None:
        self.tp, self.fp, self.fn, self.tn = (
            self.tp + other.tp,
            self.fp + other.fp,
            self.fn + other.fn,
            self.tn + other.tn,
        )
        self.examples += other.examples

    def metrics(self) -> dict[str, float]:
        return _prf(self.tp, self.fp, self.fn)


@dataclass
class StreamConfig:
    """The training-example options of google/ffn ``train.py`` flags, same defaults (FIB-25 image stats)."""

    fov: Zyx = (33, 33, 33)
    deltas: Zyx = (8, 8, 8)
    batch_size: int = 4
    policy: str = "fixed"  # fixed | max_pred_moves   (--fov_policy)
    faces_only: bool = False  # fixed policy: 6 face shifts instead of the reference's 26
    fov_moves: int = 1  # --fov_moves (max_pred_moves only; the fixed policy moves once)
    threshold: float = 0.9  # --threshold: probability needed at a new FOV centre to move there
    seed_pad: float = 0.05  # --seed_pad
    shuffle_moves: bool = True  # --shuffle_moves: shuffle the fixed shifts once, at start
    image_mean: float = 128.0
    image_stddev: float = 33.0
    permutable_axes: tuple[int, ...] = (1, 2)  # --permutable_axes (y, x); add 0 for isotropic voxels
    reflectable_axes: tuple[int, ...] = (0, 1, 2)  # --reflectable_axes
    eval_threshold: float = 0.5  # probability threshold of the final-mask metrics
    seed: int = 0
    # Not in the reference: the first ``single_fov_examples`` examples of the stream are one FOV each (the bare
    # seed at the centre, no movement), then the policy moves as usual. Most moved FOVs start from a seed
    # canvas that already holds the object, which teaches copying; bare-seed FOVs teach the FFN's core skill
    # (which voxels connect to the seed) several times faster (docs/ffn.md, "Training the demo's model").
    single_fov_examples: int = 0
    # The FOV of those bare-seed examples (None: ``fov``). The network is fully convolutional, so a smaller one
    # teaches the same local skill for fewer voxels per example (a batch of bare seeds only; docs/ffn.md).
    single_fov: Zyx | None = None

    def training_size(self) -> Zyx:
        """Box loaded per example: fov + 2·deltas·moves (train_image_size / train_canvas_size)."""
        moves = self.fov_moves + 1 if self.policy == "max_pred_moves" else 1
        return tuple(int(f) + 2 * int(d) * moves for f, d in zip(self.fov, self.deltas, strict=True))  # type: ignore[return-value]


class ExampleStream:
    """Per-FOV training batches with the seed update in between: ``next_batch()`` then ``update(logits)``.

    Mirrors train.py ``get_batch``/``get_example``: ``batch_size`` independent example slots, each loading a
    training box around its next coordinate, starting from a clean seed canvas, and visiting the FOV offsets
    its movement policy yields; ``update`` pastes the model's logits back into each slot's canvas at the
    offset just used, so the policy's next decision and the next seed see them. A slot whose policy is
    exhausted scores its final canvas against its labels (``counts``) and loads the next coordinate. The
    stream ends when a slot needs a coordinate and ``coords`` has none left. While fewer than
    ``config.single_fov_examples`` examples have started (``examples_before`` included), each example is its
    first FOV only.
    """

    def __init__(
        self,
        image: Any,
        labels: Any,
        coords: Iterable[Sequence[int]],
        config: StreamConfig,
        *,
        examples_before: int = 0,
    ) -> None:
        if config.policy not in ("fixed", "max_pred_moves"):
            raise ValueError(f"policy must be 'fixed' or 'max_pred_moves', got {config.policy!r}")
        size = config.training_size()
        for a, b in (
            (x, y) for i, x in enumerate(config.permutable_axes) for y in config.permutable_axes[i + 1 :]
        ):
            if size[a] != size[b]:
                raise ValueError(
                    f"permutable axes {a} and {b} need equal fov and deltas, got training box {size}"
                )
        self.image = image
        self.labels = labels
        self.config = config
        self.size = size
        self._coords = iter(coords)
        self._rng = np.random.default_rng(config.seed)
        self._shifts = fixed_shifts(config.deltas, config.faces_only)
        if config.shuffle_moves:
            self._shifts = [self._shifts[i] for i in self._rng.permutation(len(self._shifts))]
        self._slots: list[_Slot | None] = [None] * config.batch_size
        self._batch_fov: Zyx = tuple(config.fov)  # type: ignore[assignment]
        if config.single_fov is not None and any(
                s > f or s % 2 == 0 for s, f in zip(config.single_fov, config.fov, strict=True)):
            raise ValueError(f"single_fov {config.single_fov} must be odd and no larger than fov {config.fov}")
        self.counts = VoxelCounts()
        self.examples_started = 0
        # Examples this stream's coordinates had already given (a resumed run): counts toward single_fov_examples.
        self.examples_before = int(examples_before)

    def _load(self, coord: Zyx, transform: tuple[list[int], list[int]]) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        img, lab = load_example(self.image, self.labels, coord, self.size,
                                image_mean=cfg.image_mean, image_stddev=cfg.image_stddev)
        img, lab = apply_transform([img, lab], *transform)
        return img, lab

    def _moves(self, kind: str | None = None) -> Moves:
        """The movement policy of a new example (``kind`` given: the one a saved example used)."""
        cfg = self.config
        if kind is None:
            bare = self.examples_before + self.examples_started < cfg.single_fov_examples
            kind = "single" if bare else "fixed" if cfg.policy == "fixed" else "max_pred"
        if kind == "single":
            return BareSeed()
        if kind == "fixed":
            return FixedMoves(self._shifts, cfg.threshold)
        return MaxPredMoves(cfg.fov, cfg.deltas, cfg.threshold)

    def _new_slot(self) -> _Slot:
        try:
            coord = tuple(int(v) for v in next(self._coords))
        except StopIteration:
            raise StopIteration from None
        cfg = self.config
        transform = draw_transform(self._rng, cfg.permutable_axes, cfg.reflectable_axes)
        img, lab = self._load(coord, transform)  # type: ignore[arg-type]
        canvas = make_seed(self.size, pad=cfg.seed_pad)
        moves = self._moves()
        self.examples_started += 1
        return _Slot(coord, transform, img, lab, canvas, moves)  # type: ignore[arg-type]

    def _finish(self, slot: _Slot) -> None:
        canvas, labels = slot.canvas, slot.labels
        if isinstance(slot.moves, BareSeed) and self.config.single_fov:  # scored where it was predicted
            single = self.config.single_fov
            canvas, labels = crop(canvas, (0, 0, 0), single), crop(labels, (0, 0, 0), single)
        counts = voxel_counts(canvas, labels, self.config.eval_threshold)
        counts.examples = 1
        self.counts.add(counts)

    def next_batch(self) -> FovBatch:
        """The next FOV of every slot; raises StopIteration when the coordinates run out."""
        for i in range(len(self._slots)):
            while True:
                slot = self._slots[i]
                if slot is None:
                    slot = self._slots[i] = self._new_slot()
                offset = slot.moves.next(slot.canvas)
                if offset is not None:
                    slot.offset = offset
                    break
                self._finish(slot)
                self._slots[i] = None
        slots = [s for s in self._slots if s is not None]
        bare = all(isinstance(s.moves, BareSeed) for s in slots)
        fov = self.config.single_fov if bare and self.config.single_fov else self.config.fov
        self._batch_fov = tuple(fov)

        def stack(get: Any) -> torch.Tensor:
            return torch.from_numpy(np.stack([get(s) for s in slots])[:, None].copy())

        return FovBatch(
            image=stack(lambda s: crop(s.image, s.offset, fov)),
            seed=stack(lambda s: crop(s.canvas, s.offset, fov)),
            labels=stack(lambda s: crop(s.labels, s.offset, fov)),
            offsets=[s.offset for s in slots],  # type: ignore[misc]
        )

    def update(self, logits: torch.Tensor | np.ndarray) -> None:
        """Write the model's (B, 1, Z, Y, X) logits back into each slot's canvas at its current offset."""
        values = logits.detach().cpu().numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits)
        if values.shape[0] != len(self._slots) or values.shape[2:] != self._batch_fov:
            raise ValueError(
                f"logits of shape {values.shape} do not match the last batch ({len(self._slots)}, 1, fov)"
            )
        for slot, value in zip(self._slots, values, strict=True):
            assert slot is not None and slot.offset is not None
            update_at(slot.canvas, slot.offset, value[0].astype(np.float32))

    def __iter__(self) -> Iterator[FovBatch]:
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def reset_counts(self) -> VoxelCounts:
        """Return the final-mask counts since the last reset, and start new ones."""
        counts, self.counts = self.counts, VoxelCounts()
        return counts

    def state_dict(self) -> dict[str, Any]:
        """Everything in flight between two steps: each slot's coordinate, augmentation, canvas and position
        in its moves, the augmentation generator and the counts. Loadable with ``torch.load(weights_only)``:
        tensors, numbers, strings and lists only. The coordinates are not here: the caller reopens them at
        ``examples_before + examples_started``."""
        slots = []
        for slot in self._slots:
            if slot is None:
                slots.append(None)
                continue
            slots.append({"coord": list(slot.coord), "perm": list(slot.transform[0]), "flips": list(slot.transform[1]),
                          "canvas": torch.from_numpy(slot.canvas.copy()), "moves": slot.moves.state_dict()})
        c = self.counts
        return {"slots": slots, "rng": json.dumps(self._rng.bit_generator.state),
                "counts": [c.tp, c.fp, c.fn, c.tn, c.examples]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what ``state_dict`` saved, into a stream opened on the coordinates after those in flight."""
        if len(state["slots"]) != len(self._slots):
            raise ValueError(f"a stream of {len(state['slots'])} slots cannot resume one of {len(self._slots)}")
        for i, saved in enumerate(state["slots"]):
            if saved is None:
                self._slots[i] = None
                continue
            coord = zyx(saved["coord"])
            transform = ([int(v) for v in saved["perm"]], [int(v) for v in saved["flips"]])
            img, lab = self._load(coord, transform)
            canvas = saved["canvas"].numpy().astype(np.float32, copy=True)
            if canvas.shape != tuple(self.size):
                raise ValueError(f"a saved example canvas of shape {canvas.shape} does not fit a box of {self.size}")
            moves = self._moves(str(saved["moves"]["kind"]))
            moves.load_state_dict(saved["moves"])
            self._slots[i] = _Slot(coord, transform, img, lab, canvas, moves)
        self._rng.bit_generator.state = json.loads(state["rng"])
        tp, fp, fn, tn, examples = (int(v) for v in state["counts"])
        self.counts = VoxelCounts(tp, fp, fn, tn, examples)


def epoch_coordinates(
    coords: np.ndarray, rank: int, world_size: int, seed: int = 0, start: int = 0
) -> Iterator[np.ndarray]:
    """Endless stream of this rank's coordinates, epoch after epoch (``examples.shard``); ``start`` skips
    that many already consumed (resume after a checkpoint)."""
    per_rank = len(coords) // max(world_size, 1)
    epoch, skip = divmod(start, per_rank) if per_rank else (0, 0)
    while True:
        part = shard(coords, rank, world_size, epoch, seed)
        yield from part[skip:]
        skip = 0
        epoch += 1


# ------------------------------------------------------------------------------------------------- metrics


def voxel_counts(
    logits: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, threshold: float = 0.5
) -> VoxelCounts:
    """Voxel TP/FP/FN/TN of the mask ``sigmoid(logits) >= threshold`` vs ``labels > 0.5`` (train.py
    ``EvalTracker.add_patch``, whose threshold is 0.9); ``.metrics()`` gives precision, recall and F1, empty vs
    empty counting as 1.0."""
    pred = np.asarray(torch.as_tensor(logits).detach().cpu()) >= logit(threshold)
    true = np.asarray(torch.as_tensor(labels).detach().cpu()) > 0.5
    return VoxelCounts(
        tp=int(np.sum(pred & true)),
        fp=int(np.sum(pred & ~true)),
        fn=int(np.sum(~pred & true)),
        tn=int(np.sum(~pred & ~true)),
    )


def _prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    # An empty prediction of an empty object is perfect, not undefined.
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
