"""Pure gradient combiners: mean, wire compression, Adasum, AdaComp and DaSGD's delayed averaging.

Every function here works on plain torch tensors and knows nothing of communicators, so the reducer
(runtime/reducer.py) can call them on whatever a collective handed back. Formulas: docs/combiners.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from hpctrain.errors import ConfigError, RuntimeFailure

__all__ = [
    "WIRES",
    "AdaCompMessage",
    "AverageHandle",
    "DelayedAverager",
    "adacomp_decode",
    "adacomp_encode",
    "adasum",
    "adasum_reduce",
    "adasum_reduce_layers",
    "compress",
    "compression_ratio",
    "dasgd_merge",
    "decompress",
    "default_bin_len",
    "layer_kind",
    "mean",
]

# ---------------------------------------------------------------------------------------------- mean


def _check_same(tensors: Sequence[Tensor], what: str) -> None:
    if len(tensors) == 0:
        raise ValueError(f"{what}: needs at least one tensor")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], start=1):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(
                f"{what}: tensor {i} is {tuple(t.shape)} {t.dtype}, "
                f"tensor 0 is {tuple(first.shape)} {first.dtype}"
            )


def mean(tensors: Sequence[Tensor]) -> Tensor:
    """Element-wise mean: sum left to right in the input dtype, then divide by the count."""
    _check_same(tensors, "mean")
    out = tensors[0].clone()
    for t in tensors[1:]:
        out.add_(t)
    return out.div_(len(tensors))


# ---------------------------------------------------------------------------------------- compression

WIRES: dict[str, torch.dtype | None] = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504


def compress(t: Tensor, wire: str, *, overflow: str = "raise") -> Tensor:
    """Cast ``t`` to the wire dtype. fp16 overflow (finite |x| > 65504) raises, or clamps if asked.

    ``overflow="saturate"`` clamps to ±65504 knowingly; non-finite inputs pass through unchanged so the
    trainer's non-finite check still sees them. bf16 has float32's range and never overflows.
    """
    if wire not in WIRES:
        raise ConfigError(
            f"unknown wire compression {wire!r}",
            key="train.combiner.compression",
            hint=f"use one of {list(WIRES)}",
        )
    if overflow not in ("raise", "saturate"):
        raise ValueError(f"compress: overflow must be 'raise' or 'saturate', not {overflow!r}")
    dtype = WIRES[wire]
    if dtype is None or t.dtype == dtype:
        return t
    if dtype == torch.float16 and t.numel() > 0:
        finite = torch.isfinite(t)
        big = finite & (t.abs() > FP16_MAX)
        if bool(big.any()):
            if overflow == "raise":
                worst = float(t[big].abs().max())
                raise RuntimeFailure(
                    f"fp16 wire compression would overflow: max |value| {worst:.4g} exceeds {FP16_MAX:g}",
                    hint="set train.combiner.compression: bf16 (float32 range), or lower the loss scale / LR",
                )
            t = torch.where(big, t.clamp(-FP16_MAX, FP16_MAX), t)
    return t.to(dtype)


def decompress(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast a wire tensor back to the working dtype (exact: fp16/bf16 values are all representable)."""
    return t if t.dtype == dtype else t.to(dtype)


# -------------------------------------------------------------------------------------------- Adasum

ADASUM_EPS = 1e-8  # Horovod: a coefficient is computed only where norm² >= 1e-8 (adasum.h)


def _coefficients64(a64: Tensor, b64: Tensor, eps: float) -> tuple[float, float]:
    dot = float(torch.dot(a64, b64))
    anormsq = float(torch.dot(a64, a64))
    bnormsq = float(torch.dot(b64, b64))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= eps else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= eps else 1.0
    return acoeff, bcoeff


def adasum(a: Tensor, b: Tensor, eps: float = ADASUM_EPS) -> Tensor:
    """Horovod's pairwise Adasum of one layer: a·(1 − a·b/2‖a‖²) + b·(1 − a·b/2‖b‖²).

    Dot product and norms are accumulated in float64; a coefficient stays 1 where that vector's norm² is
    below ``eps`` (Horovod's absolute 1e-8). The combination is evaluated in float64 and rounded once to
    the input dtype, as Horovod's ScaledAdd does for float32.
    """
    _check_same([a, b], "adasum")
    a64 = a.reshape(-1).to(torch.float64)
    b64 = b.reshape(-1).to(torch.float64)
    acoeff, bcoeff = _coefficients64(a64, b64, eps)
    out = (a64 * acoeff).add_(b64 * bcoeff)
    return out.to(a.dtype).reshape(a.shape)


def _tree(values: list[Tensor], eps: float) -> Tensor:
    # Power-of-two count: pair (0,1),(2,3),… then the results pairwise — Horovod's VHDD levels 1, 2, 4, ….
    while len(values) > 1:
        values = [adasum(values[i], values[i + 1], eps) for i in range(0, len(values), 2)]
    return values[0]


def adasum_reduce(tensors: Sequence[Tensor], eps: float = ADASUM_EPS) -> Tensor:
    """Adasum of one layer over all ranks, in rank order.

    For 2^k inputs: the binary tree of Horovod's recursive halving/doubling. For r other counts, the
    first 2·(r − 2^⌊log2 r⌋) ranks are folded pairwise (0,1),(2,3),… first — the pre-step of MPICH's
    recursive-doubling allreduce — and the 2^⌊log2 r⌋ survivors then run the tree.
    """
    _check_same(tensors, "adasum_reduce")
    r = len(tensors)
    if r == 1:
        return tensors[0].clone()
    p = 1 << (r.bit_length() - 1)
    extra = r - p
    folded = [adasum(tensors[2 * i], tensors[2 * i + 1], eps) for i in range(extra)]
    return _tree(folded + list(tensors[2 * extra :]), eps)


def adasum_reduce_layers(per_rank: Sequence[Sequence[Tensor]], eps: float = ADASUM_EPS) -> list[Tensor]:
    """Adasum applied per layer: ``per_rank[r][l]`` is layer l on rank r; returns one tensor per layer."""
    if len(per_rank) == 0:
        raise ValueError("adasum_reduce_layers: needs at least one rank")
    n_layers = len(per_rank[0])
    for r, layers in enumerate(per_rank):
        if len(layers) != n_layers:
            raise ValueError(
                f"adasum_reduce_layers: rank {r} has {len(layers)} layers, rank 0 has {n_layers}"
            )
    return [adasum_reduce([layers[i] for layers in per_rank], eps) for i in range(n_layers)]


# ------------------------------------------------------------------------------------------- AdaComp

BIN_LEN = {"conv": 50, "linear": 500}  # Chen et al. 2018: L_T = 50 for conv, 500 for FC / recurrent
_LINEAR_WORDS = re.compile(
    r"(^|[._])(fc\d*|linear|dense|lstm|gru|rnn|classifier|head|proj|embed\w*)([._\d]|$)"
)


def layer_kind(param_name_or_kind: str, ndim: int | None = None) -> str:
    """'conv' or 'linear' for a parameter name ('conv1.weight', 'fc.bias') or a kind given directly.

    Names are matched on their words; failing that a weight's rank decides (≥ 3 dims: conv, 2: linear);
    anything else is treated as conv, the smaller (more conservative) bin.
    """
    name = param_name_or_kind.lower()
    if name in ("conv", "linear", "fc"):
        return "linear" if name == "fc" else name
    if "conv" in name:
        return "conv"
    if _LINEAR_WORDS.search(name):
        return "linear"
    if ndim == 2:
        return "linear"
    return "conv"


def default_bin_len(param_name_or_kind: str, ndim: int | None = None) -> int:
    """The paper's bin length L_T: 50 for conv layers, 500 for fully connected / recurrent ones."""
    return BIN_LEN[layer_kind(param_name_or_kind, ndim)]


@dataclass(frozen=True)
class AdaCompMessage:
    """What one rank sends for one layer: flat indices, ternary signs (±1) and one scale."""

    indices: Tensor  # int32 (int64 beyond 2^31 elements), flat positions, ascending
    signs: Tensor  # int8, +1 or -1
    scale: float  # exactly representable in ``dtype``
    shape: tuple[int, ...]
    dtype: torch.dtype
    deferred: int = field(default=0, compare=False)  # selected but kept in the residue (exactness guard)

    @property
    def count(self) -> int:
        return int(self.indices.numel())

    def dense_bytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    def wire_bytes(self) -> int:
        """Bytes this message takes as sent: indices + one byte per sign + the scale in ``dtype``."""
        return self.count * (self.indices.element_size() + self.signs.element_size()) + _itemsize(self.dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def adacomp_encode(residue: Tensor, grad: Tensor, bin_len: int) -> tuple[AdaCompMessage, Tensor]:
    """One AdaComp step for one layer: returns (message, new residue).

    G = residue + grad; H = G + grad; per bin of ``bin_len`` elements gmax = max |G|; an element is
    selected where |H| ≥ gmax and G ≠ 0; scale = mean |G| over the selected elements; sent value =
    sign(G)·scale; new residue = G − sent. A selected element is sent only if (G − q) + q == G holds
    in ``dtype`` (so ``adacomp_decode(msg) + new_residue == residue + grad`` bitwise); the few that
    fail (|G| far below the scale) stay whole in the residue and are counted in ``msg.deferred``.
    """
    if residue.shape != grad.shape or residue.dtype != grad.dtype:
        raise ValueError(
            f"adacomp_encode: residue {tuple(residue.shape)} {residue.dtype} "
            f"vs grad {tuple(grad.shape)} {grad.dtype}"
        )
    if not residue.is_floating_point():
        raise ValueError(f"adacomp_encode: needs a floating-point tensor, got {residue.dtype}")
    if bin_len < 1:
        raise ValueError(f"adacomp_encode: bin_len must be >= 1, got {bin_len}")
    shape = tuple(grad.shape)
    g_sum = residue + grad  # G
    flat_g = g_sum.reshape(-1)
    flat_h = (g_sum + grad).reshape(-1)  # H, the paper's soft-threshold boost
    n = flat_g.numel()
    index_dtype = torch.int32 if n < 2**31 else torch.int64
    abs_g = flat_g.abs()
    pad = (-n) % bin_len
    padded = torch.nn.functional.pad(abs_g, (0, pad)) if pad else abs_g  # zeros never raise a bin's max
    gmax = padded.reshape(-1, bin_len).amax(dim=1).repeat_interleave(bin_len)[:n]
    selected = (flat_h.abs() >= gmax) & (flat_g != 0)
    if not bool(selected.any()):
        empty = AdaCompMessage(
            torch.empty(0, dtype=index_dtype, device=grad.device),
            torch.empty(0, dtype=torch.int8, device=grad.device), 0.0, shape, grad.dtype,
        )
        return empty, g_sum.clone()
    # One scale per layer, rounded once to the tensor dtype so sender and receiver use the same number.
    scale_t = abs_g[selected].to(torch.float64).mean().to(grad.dtype)
    q_all = torch.where(flat_g > 0, scale_t, -scale_t)
    r_all = flat_g - q_all
    exact = (r_all + q_all) == flat_g
    send = selected & exact
    idx = torch.nonzero(send, as_tuple=False).reshape(-1)
    signs = torch.where(flat_g[idx] > 0, 1, -1).to(torch.int8)
    new_res = torch.where(send, r_all, flat_g).reshape(shape)
    msg = AdaCompMessage(
        idx.to(index_dtype),
        signs,
        float(scale_t),
        shape,
        grad.dtype,
        deferred=int(selected.sum() - send.sum()),
    )
    return msg, new_res


def adacomp_decode(msg: AdaCompMessage) -> Tensor:
    """The dense tensor a message stands for: ±scale at its indices, zero elsewhere."""
    out = torch.zeros(math.prod(msg.shape), dtype=msg.dtype, device=msg.indices.device)
    if msg.count:
        out[msg.indices.long()] = msg.signs.to(msg.dtype) * msg.scale
    return out.reshape(msg.shape)


def compression_ratio(
    messages_by_kind: Mapping[str, AdaCompMessage | Sequence[AdaCompMessage]],
) -> dict[str, float]:
    """Dense bytes / wire bytes per layer kind (e.g. {'conv': 38.2, 'linear': 180.5})."""
    ratios: dict[str, float] = {}
    for kind, msgs in messages_by_kind.items():
        group = [msgs] if isinstance(msgs, AdaCompMessage) else list(msgs)
        dense = sum(m.dense_bytes() for m in group)
        wire = sum(m.wire_bytes() for m in group)
        ratios[kind] = dense / wire if wire else math.inf
    return ratios


# --------------------------------------------------------------------------------------------- DaSGD


def dasgd_merge(local_now: Tensor, local_at_send: Tensor, average_at_send: Tensor) -> Tensor:
    """DaSGD's merge: the delayed average plus the local progress made while it was in flight."""
    return average_at_send + (local_now - local_at_send)


class AverageHandle(Protocol):
    """A non-blocking average in flight; ``wait()`` returns the averaged tensors in the order sent."""

    def wait(self) -> Sequence[Tensor]: ...


class DelayedAverager:
    """Local SGD with delayed averaging (DaSGD), independent of any communicator.

    Call :meth:`after_step` after every local optimizer step. Every ``period`` steps it snapshots the
    parameters and starts ``start_average(snapshot)``; ``delay`` steps later (0 ≤ delay ≤ period) it waits
    and sets each parameter to ``dasgd_merge(now, snapshot, average)``. delay = 0 is plain periodic
    model averaging. A merge due on a step happens before that step's new send.
    """

    def __init__(
        self, start_average: Callable[[list[Tensor]], AverageHandle], period: int, delay: int
    ) -> None:
        if period < 1:
            raise ConfigError(f"period must be >= 1, got {period}", key="train.combiner.period")
        if not 0 <= delay <= period:
            raise ConfigError(
                f"delay must be between 0 and period ({period}), got {delay}",
                key="train.combiner.delay",
                hint="an average must land before the next one starts",
            )
        self.start_average = start_average
        self.period = period
        self.delay = delay
        self.steps = 0
        self._pending: tuple[int, list[Tensor], AverageHandle] | None = None

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def after_step(self, params: Sequence[Tensor]) -> bool:
        """Count one local step; merge a due average and/or start a new one. True if params changed."""
        self.steps += 1
        merged = False
        if self._pending is not None and self.steps - self._pending[0] >= self.delay:
            self._merge(params)
            merged = True
        if self.steps % self.period == 0:
            snapshot = [p.detach().clone() for p in params]
            self._pending = (self.steps, snapshot, self.start_average(snapshot))
            if self.delay == 0:
                self._merge(params)
                merged = True
        return merged

    def flush(self, params: Sequence[Tensor]) -> bool:
        """Wait for and merge an average still in flight (before a checkpoint or at the end)."""
        if self._pending is None:
            return False
        self._merge(params)
        return True

    def _merge(self, params: Sequence[Tensor]) -> None:
        assert self._pending is not None
        _, snapshot, handle = self._pending
        self._pending = None
        averaged = list(handle.wait())
        if len(averaged) != len(params):
            raise RuntimeFailure(
                f"DaSGD average returned {len(averaged)} tensors for {len(params)} parameters",
                hint="the communicator must return the averaged tensors in the order they were sent",
            )
        with torch.no_grad():
            for p, at_send, avg in zip(params, snapshot, averaged, strict=True):
                p.copy_(dasgd_merge(p.detach(), at_send, avg))

    def state_dict(self, include_in_flight: bool = False) -> dict[str, Any]:
        """Counters, and with ``include_in_flight`` an average still in flight (waited for, not merged).

        Without ``include_in_flight`` an average in flight is an error (call flush() first). With it, the
        average is waited for but NOT merged: the state holds the step it was sent at, the snapshot and the
        averaged tensors, and this averager keeps going as if nothing happened (the merge still lands at its
        due step), so saving does not change the trajectory; exact resume restores the same pending merge.
        """
        state: dict[str, Any] = {"steps": self.steps, "period": self.period, "delay": self.delay}
        if self._pending is None:
            return state
        if not include_in_flight:
            raise RuntimeFailure(
                "DelayedAverager.state_dict() with an average in flight", hint="call flush() first"
            )
        sent_at, snapshot, handle = self._pending
        averaged = [t.detach().clone() for t in handle.wait()]
        self._pending = (sent_at, snapshot, _Arrived(averaged))  # wait() once: handles may not be re-entrant
        state["in_flight"] = {"sent_at": sent_at, "snapshot": [t.clone() for t in snapshot],
                              "average": [t.clone() for t in averaged]}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = int(state["steps"])
        pending = state.get("in_flight")
        self._pending = None
        if pending is not None:
            average = [t.clone() for t in pending["average"]]
            self._pending = (int(pending["sent_at"]), [t.clone() for t in pending["snapshot"]], _Arrived(average))


class _Arrived:
    """An AverageHandle whose average is already here (saved in a checkpoint or waited for early)."""

    def __init__(self, averaged: list[Tensor]) -> None:
        self.averaged = averaged

    def wait(self) -> list[Tensor]:
        return self.averaged
