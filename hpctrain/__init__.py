"""hpctrain: take a data-parallel training job from a laptop to thousands of supercomputer nodes.

Importing this package is cheap (no torch, numpy or mpi4py): the CLI's submission path depends on it.
``hpctrain.submit`` (and ``RunHandle``) are loaded on first use.
"""

import os
from typing import Any

__version__ = "0.1.0"

# The per-rank file-open counter (hpctrain/runtime/counting/counters.py) starts here, at the first import of
# hpctrain, so that the imports it is meant to count are seen; when the variable is unset nothing is imported or
# installed.
if os.environ.get("HPCTRAIN_COUNTERS", "") not in ("", "0"):
    from hpctrain.runtime.counting.counters import enable_from_env

    enable_from_env()

_LAZY = {"submit": "hpctrain.submission.api", "RunHandle": "hpctrain.submission.api"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
