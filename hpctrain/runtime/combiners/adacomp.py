"""AdaComp (Chen et al. 2018): each rank sends a ternary, residue-corrected selection of its gradient.

Per bucket every rank encodes each layer with ``combine.adacomp_encode`` (keeping the residue), packs the
layers into one integer message (``pack_adacomp``), and all ranks all-gather the messages, decode them and
take their mean. The residues are this combiner's state and are checkpointed per rank; the achieved
compression ratio per layer kind is reported in the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from hpctrain.errors import CheckpointError
from hpctrain.runtime import combine
from hpctrain.runtime.combiners.base import Combiner, GradBucket
from hpctrain.runtime.comm.base import Communicator, Handle

if TYPE_CHECKING:
    from hpctrain.config.job import CombinerConfig

SCALE_BYTES = 8  # one float64 scale per layer rides in front of the elements


class AdaCompCombiner(Combiner):
    name = "adacomp"

    def __init__(self, comm: Communicator, params: Sequence[torch.Tensor] = (), *,
                 bin_len: Mapping[str, int] | None = None) -> None:
        super().__init__(comm, params)
        self.bin_len = dict(bin_len or {})  # layer kind -> L_T; kinds not given take the paper's
        self._residues: dict[int, list[torch.Tensor]] = {}  # bucket index -> one residue per layer
        self._saved: dict[int, list[torch.Tensor]] = {}  # restored, copied in when the bucket first runs
        # layer kind -> [dense bytes, wire bytes] this interval (the step profiler reads it too)
        self.adacomp_bytes: dict[str, list[int]] = {}
        # parameter name -> [dense bytes, wire bytes] since the start (per-layer ratios; never reset)
        self.layer_bytes: dict[str, list[int]] = {}

    @classmethod
    def from_config(cls, config: CombinerConfig, comm: Communicator,
                    params: Sequence[torch.Tensor]) -> AdaCompCombiner:
        return cls(comm, params, bin_len=config.bin_len)

    def bin_len_for(self, name: str, ndim: int) -> int:
        kind = combine.layer_kind(name, ndim)
        return self.bin_len.get(kind, combine.BIN_LEN[kind])

    def _residues_for(self, bucket: GradBucket) -> list[torch.Tensor]:
        residues = self._residues.get(bucket.index)
        if residues is None:
            residues = self._residues[bucket.index] = [torch.zeros_like(p) for p in bucket.params]
            saved = self._saved.pop(bucket.index, None)
            if saved is not None:  # into tensors like the parameters: their device and layout
                for mine, kept in zip(residues, saved, strict=True):
                    mine.copy_(kept)
        return residues

    def encode(self, bucket: GradBucket) -> torch.Tensor:
        """This rank's packed message for the bucket; updates the residues and the byte counts."""
        residues = self._residues_for(bucket)
        messages = []
        for i, p in enumerate(bucket.params):
            msg, residues[i] = combine.adacomp_encode(residues[i], bucket.views[i].clone(),
                                                      self.bin_len_for(bucket.names[i], p.dim()))
            messages.append(msg)
        packed = pack_adacomp(messages, bucket.offsets, bucket.flat.numel(), device=bucket.flat.device)
        for name, p, msg in zip(bucket.names, bucket.params, messages, strict=True):
            dense, wire = p.numel() * p.element_size(), msg.count * packed.element_size() + SCALE_BYTES
            for totals in (self.adacomp_bytes.setdefault(combine.layer_kind(name, p.dim()), [0, 0]),
                           self.layer_bytes.setdefault(name, [0, 0])):
                totals[0] += dense
                totals[1] += wire
        return packed

    @staticmethod
    def decode_mean(messages: Sequence[torch.Tensor], bucket: GradBucket) -> torch.Tensor:
        """The mean of every rank's decoded message, as a flat tensor like the bucket's."""
        sizes = [p.numel() for p in bucket.params]
        decoded = []
        for packed in messages:
            dense = torch.zeros_like(bucket.flat)
            for pos, value in unpack_adacomp(packed, len(bucket.params), bucket.offsets, sizes):
                dense[pos] = value.to(dense.dtype)
            decoded.append(dense)
        return combine.mean(decoded)

    def launch(self, bucket: GradBucket, blocking: bool) -> Handle | None:
        packed = self.encode(bucket)
        gathered = (self.comm.allgather_varlen(packed, f"bucket {bucket.index} adacomp") if self.comm.size > 1
                    else [packed])
        bucket.flat.copy_(self.decode_mean(gathered, bucket))
        return None


    def attach(self, reducer: Any) -> None:
        super().attach(reducer)
        self._check_bucket_count(len(self._saved))

    def _check_bucket_count(self, saved: int) -> None:
        if saved and self._reducer is not None and saved != len(self._reducer.buckets):
            raise CheckpointError(
                f"the checkpoint holds AdaComp residues for {saved} buckets, this run has "
                f"{len(self._reducer.buckets)}",
                hint="resume with the same train.combiner.bucket_mb and model as the checkpointed run")

    def state_dict(self) -> dict[str, Any]:
        indices = sorted(self._residues.keys() | self._saved.keys())
        return {"residues": [[t.clone() for t in self._residues.get(i, self._saved.get(i, []))] for i in indices]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "residues" not in state:
            return
        self._residues = {}
        self._saved = {i: [t.clone() for t in layers] for i, layers in enumerate(state["residues"])}
        self._check_bucket_count(len(self._saved))

    def interval_metrics(self) -> dict[str, float]:
        """The compression achieved per layer kind since the last call (dense bytes / bytes on the wire)."""
        out = {f"adacomp_ratio_{kind}": dense / wire for kind, (dense, wire) in sorted(self.adacomp_bytes.items())}
        self.adacomp_bytes = {}
        return out


def pack_adacomp(messages: list[combine.AdaCompMessage], offsets: list[int], bucket_numel: int,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """One rank's AdaComp messages for a bucket as one integer tensor: the float64 scales (as pairs of int32,
    or int64 each), then ``sign * (offset + index + 1)`` for every selected element, layer after layer.

    Each selected element costs one integer, int32 while the bucket has fewer than 2^31 elements, instead of an
    int64 index plus an int8 sign. The message is built on ``device`` (the bucket's; default: the indices').
    """
    if device is None:
        device = messages[0].indices.device if messages else "cpu"
    dtype = torch.int32 if bucket_numel < 2**31 - 1 else torch.int64
    scales = torch.tensor([m.scale for m in messages], dtype=torch.float64, device=device).view(dtype)
    parts = [scales]
    for m, off in zip(messages, offsets, strict=True):
        parts.append((m.indices.to(dtype) + (off + 1)) * m.signs.to(dtype))
    return torch.cat(parts)


def unpack_adacomp(packed: torch.Tensor, layers: int, offsets: list[int],
                   sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of ``pack_adacomp``: per layer, (bucket positions int64, values ±scale float64)."""
    per_scale = 8 // packed.element_size()
    scales = packed[: layers * per_scale].clone().view(torch.float64)  # gathered slices may sit unaligned
    body = packed[layers * per_scale :].to(torch.int64)
    pos = body.abs() - 1
    out = []
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
        sel = (pos >= off) & (pos < off + size)
        out.append((pos[sel], body[sel].sign().to(torch.float64) * scales[i]))
    return out
