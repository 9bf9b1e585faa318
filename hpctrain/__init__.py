"""hpctrain: take a data-parallel training job from a laptop to thousands of supercomputer nodes.

Importing this package is cheap (no torch, numpy or mpi4py): the CLI's submission path depends on it.
``hpctrain.submit`` (and ``RunHandle``) are loaded on first use.
"""

from typing import Any

__version__ = "0.1.0"

_LAZY = {"submit": "hpctrain.submission.api", "RunHandle": "hpctrain.submission.api"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
