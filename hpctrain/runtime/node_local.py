"""Which directory is this node's own storage: where one process per node leaves what the node's other ranks
read (a copy of the training volume, rank states on their way into a per-node checkpoint file).

``$HPCTRAIN_NODE_LOCAL`` when the batch script staged to node-local storage (docs/scaling.md, "Staging"),
else the RAM-backed ``/dev/shm``; None when neither is a writable directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hpctrain.runtime.counters import NODE_LOCAL_ENV

SHM = Path("/dev/shm")


def node_local_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """This node's storage for per-node hand-offs, or None (callers then fall back to per-rank files/reads)."""
    environ = os.environ if environ is None else environ
    for candidate in (environ.get(NODE_LOCAL_ENV, ""), str(SHM)):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return Path(candidate)
    return None
