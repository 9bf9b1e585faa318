"""What tests and benchmarks ask of hpctrain.ffn.perf's settings: whether a model really runs compiled, and a
thread count held for a block and given back after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from hpctrain.ffn.perf import set_threads


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` runs through ``torch.compile`` (``perf.compile_`` succeeded, no fallback)."""
    # nn.Module.compile() stores the compiled callable here; perf's fallback puts None back.
    return getattr(model, "_compiled_call_impl", None) is not None


@contextlib.contextmanager
def num_threads(threads: int | None) -> Iterator[int]:
    """Temporarily use ``threads`` intra-op threads (``None``: unchanged)."""
    before = torch.get_num_threads()
    try:
        yield set_threads(threads)
    finally:
        torch.set_num_threads(before)
