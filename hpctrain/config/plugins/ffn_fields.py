"""The FFN's (z, y, x) field types and geometry rules, written once for both of its schemas: the training
``model_args`` and ``data`` (``ffn.py``) and the inference settings (``ffn_inference.py``). Torch- and numpy-free;
the ranks apply the same rules (``deltas_problem``) when they move FOVs.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from hpctrain.errors import ConfigError

Zyx = tuple[int, int, int]


def zyx(value: int | Sequence[int], name: str = "value") -> Zyx:
    """One integer (a cube) or three (z, y, x) as a (z, y, x) tuple of ints: the one helper for sizes, offsets and
    positions given either way; anything else raises ConfigError naming ``name``."""
    values = [int(value)] * 3 if isinstance(value, int) else [int(v) for v in value]
    if len(values) != 3:
        raise ConfigError(f"{name} must be one integer or three (z, y, x), got {value!r}", key=name)
    return (values[0], values[1], values[2])


def _as_triple(value: object) -> Zyx:
    """One integer stands for a cube; YAML gives lists, the models hold tuples. Integers only (a Python or numpy
    integer): ``true``, ``9.5`` or ``"9"`` are errors, not 1, 9 and 9."""
    items = [value] * 3 if not isinstance(value, list | tuple) else list(value)
    if len(items) != 3 or any(isinstance(v, bool) for v in items):
        raise ValueError("give one integer or three [z, y, x]")
    try:
        z, y, x = (operator.index(v) for v in items)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError("give one integer or three [z, y, x]") from None
    return (z, y, x)


def _odd(sizes: Zyx) -> Zyx:
    if any(s < 1 or s % 2 == 0 for s in sizes):
        raise ValueError(f"FOV sizes must be odd and >= 1 (a FOV has a centre voxel), got {list(sizes)}")
    return sizes


def _non_negative(sizes: Zyx) -> Zyx:
    if any(s < 0 for s in sizes):
        raise ValueError(f"must be >= 0 on every axis, got {list(sizes)}")
    return sizes


def _positive(sizes: Zyx) -> Zyx:
    if any(s < 1 for s in sizes):
        raise ValueError(f"must be >= 1 on every axis, got {list(sizes)}")
    return sizes


Triple = Annotated[Zyx, BeforeValidator(_as_triple)]
FovSize = Annotated[Triple, AfterValidator(_odd)]
Offsets = Annotated[Triple, AfterValidator(_non_negative)]
Shape = Annotated[Triple, AfterValidator(_positive)]
Fraction = Annotated[float, Field(gt=0, lt=1)]
Share = Annotated[float, Field(ge=0, le=1)]


def max_deltas(fov: Sequence[int]) -> Zyx:
    """The largest FOV movement step on each axis: (fov - 1) // 2, the centre to the FOV's face."""
    return tuple((int(f) - 1) // 2 for f in fov)  # type: ignore[return-value]


def deltas_problem(fov: Sequence[int], deltas: Sequence[int]) -> str | None:
    """Why ``deltas`` cannot move a FOV of ``fov`` (None: they can).

    A move's score is read on the faces of the current FOV's predicted map at +/- deltas from its centre
    (``hpctrain.ffn.movement.face_max_offsets``, the inference Canvas): each step must stay inside the FOV. The
    ranks apply this rule when they move FOVs; the laptop applies it to model_args and the inference settings.
    """
    limit = max_deltas(fov)
    if any(int(d) < 0 or int(d) > m for d, m in zip(deltas, limit, strict=True)):
        return (f"deltas {[int(d) for d in deltas]} must lie within 0..(fov - 1) // 2 = {list(limit)} for fov "
                f"{[int(f) for f in fov]}: a move is scored on the faces of the FOV at +/- deltas from its centre")
    return None
