"""How the FOVs of floods reach the model: floods are generators that yield the FOVs they need predicted and are
sent the logits back, so one driver can stack the FOVs of several objects and several canvases into one model
call (the role of google/ffn's ``executor.py``); and the order in which seeds may be taken up while other objects
are in flight, so that each object floods exactly what it would alone.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

import numpy as np

from hpctrain.errors import ConfigError, RuntimeFailure
from hpctrain.ffn.movement import Position

# One object's flood yields lists of (FOV centre, seed logits) and is sent the model's logits for each, in order,
# returning its move count; a canvas's floods (``Canvas.flood``) yield those of every object in flight at once.
FovRequests = Generator[list[tuple[Position, np.ndarray]], list[np.ndarray], int]
FovBatches = Generator[list[tuple[Position, np.ndarray]], list[np.ndarray], None]


class FovSource(Protocol):
    """What the batching needs of a canvas: its FOV, its device, the model input of a FOV, a counter."""

    fov: Position
    device: Any

    def fill_input(self, target: Any, pos: Position, logit_seed: np.ndarray) -> None: ...

    def count(self, name: str, n: int = 1) -> None: ...


def check_output(out: Any, input_shape: Sequence[int]) -> Any:
    """The model's output as float32 on the CPU, after checking it has one logit per input voxel."""
    import torch

    if tuple(out.shape) != (input_shape[0], 1, *input_shape[2:]):
        raise RuntimeFailure(
            f"FFN model returned shape {tuple(out.shape)} for an input of {tuple(input_shape)}",
            hint="the model must return (N, 1, Z, Y, X) logits of the input's size ('same' padding)",
        )
    return out.detach().to("cpu", torch.float32)


class BatchPredictor:
    """One model call for a list of (canvas, FOV centre, seed logits); the input buffer is kept between calls."""

    def __init__(self, model: Any, device: Any, fov: Position) -> None:
        self.model, self.device, self.fov = model, device, fov
        self._inputs: Any = None

    def __call__(self, requests: Sequence[tuple[FovSource, Position, np.ndarray]]) -> list[np.ndarray]:
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


def flood_together(model: Any, floods: Sequence[tuple[FovSource, FovBatches]]) -> None:
    """Advance several canvases' floods in lock step, their pending FOVs stacked into one model call.

    Each canvas computes exactly what it would alone (its own FOVs in its own order); only the model sees a
    batch. The canvases must share the FOV size. One canvas alone is the plain case.
    """
    if not floods:
        return
    fov = floods[0][0].fov
    if any(c.fov != fov for c, _ in floods):
        raise ConfigError("canvases flooded together must have the same FOV")
    pending: list[tuple[FovSource, FovBatches, list[tuple[Position, np.ndarray]]]] = []
    for canvas, requests in floods:
        try:
            pending.append((canvas, requests, next(requests)))
        except StopIteration:
            continue
    predictor = BatchPredictor(model, floods[0][0].device, fov)
    while pending:
        logits = predictor([(canvas, pos, seed) for canvas, _, batch in pending for pos, seed in batch])
        still, at = [], 0
        for canvas, requests, batch in pending:
            canvas.count("flood_fovs", len(batch))  # the moves' FOVs and the checks' bare-seed FOVs alike
            answers, at = logits[at : at + len(batch)], at + len(batch)
            try:
                still.append((canvas, requests, requests.send(answers)))
            except StopIteration:
                pass
        pending = still


class InFlight(Protocol):
    """An object being flooded, as the seed order sees it: its seed and whether its flood is over."""

    start: Position
    done: bool


class SeedOrder:
    """Which seed a canvas may take up next while other objects are in flight, and which finished objects may be
    committed: seeds are taken up in order except that one may go before earlier seeds still waiting when it lies
    more than twice ``reach`` (per axis, in some axis) from all of them and from every object in flight — then
    none of them reads or writes what it does. Objects commit in seed order."""

    def __init__(self, seeds: list[Position], reach: Position | None, window: int) -> None:
        self.seeds, self.reach, self.window = seeds, reach, window
        self.next = 0  # seeds before this were looked at
        self.waiting: list[int] = []  # looked at, held back (seed order)
        self.flight: dict[int, InFlight] = {}  # started, not committed
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

    def started(self, index: int, obj: InFlight) -> None:
        self.flight[index] = obj
        if obj.done:
            self.changed = True

    def committable(self) -> list[Any]:
        """The finished objects whose earlier seeds are all committed or skipped, in order (they leave)."""
        out = []
        while self.pending and self.pending[0] in self.flight and self.flight[self.pending[0]].done:
            out.append(self.flight.pop(self.pending.pop(0)))
        if out:
            self.changed = True
        return out

    def finished(self) -> bool:
        return not self.pending and self.next >= len(self.seeds)
