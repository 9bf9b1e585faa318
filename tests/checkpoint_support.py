"""What tests read out of a checkpoint directly: every state of a checkpoint by file name, whichever layout wrote it."""

from __future__ import annotations

import io
from typing import Any

import torch

from hpctrain.checkpoint.manifest import Checkpoint, rank_filename
from hpctrain.checkpoint.node_file import read_member


def load_files(checkpoint: Checkpoint, map_location: Any = "cpu") -> dict[str, Any]:
    """Every state of ``checkpoint`` keyed by file name, a node file's members under their ranks' own file names
    (``rank-RRRRR.pt``): for inspection in tests, not for resuming."""
    out: dict[str, Any] = {}
    for rec in checkpoint.all_files():
        path = checkpoint.path / rec.name
        if not rec.ranks:
            out[rec.name] = torch.load(path, map_location=map_location, weights_only=True)
            continue
        for start, stop in rec.ranks:
            for rank in range(start, stop):
                data = read_member(path, rank)
                out[rank_filename(rank)] = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    return out
