"""The MPI interposer's counts, read from inside a rank that runs with it preloaded.

The interposer (``hpctrain_bench/wire_counts.py`` builds it; benchmarks and tests preload it) counts every MPI call
and the messages each TCP connection carries. A rank reads them here through the symbols the library exports;
without it (``HPCTRAIN_WIRE_COUNTS`` unset, the normal case) ``snapshot()`` is None and nothing else runs.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

# The switch a benchmark sets: the library to preload. Off (unset), nothing of this module runs in a rank.
ENV_LIBRARY = "HPCTRAIN_WIRE_COUNTS"
CONNECTION_FIELDS = ("local_port", "peer_port", "send_calls", "sent_messages", "sent_bytes", "recv_calls",
                     "received_bytes", "closed")


class _Connection(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in CONNECTION_FIELDS]


def _library() -> ctypes.CDLL | None:
    if not os.environ.get(ENV_LIBRARY):
        return None
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "hpctrain_wire_version"):
        return None
    lib.hpctrain_wire_n_calls.restype = ctypes.c_uint64
    lib.hpctrain_wire_call_name.restype = ctypes.c_char_p
    lib.hpctrain_wire_call_name.argtypes = [ctypes.c_uint64]
    lib.hpctrain_wire_connections.restype = ctypes.c_uint64
    return lib


_lib: ctypes.CDLL | None = None
_names: list[str] = []


def loaded() -> bool:
    """Whether this process runs with the interposer preloaded (``HPCTRAIN_WIRE_COUNTS`` set and the library in)."""
    global _lib, _names
    if _lib is None:
        _lib = _library()
        if _lib is not None:
            _names = [_lib.hpctrain_wire_call_name(i).decode() for i in range(_lib.hpctrain_wire_n_calls())]
    return _lib is not None


def snapshot() -> dict[str, Any] | None:
    """This process's counts as of now: ``calls`` (MPI function -> calls, those made at least once) and
    ``connections`` (one list per TCP connection, ``CONNECTION_FIELDS``); None without the interposer."""
    if not loaded():
        return None
    assert _lib is not None
    counts = (ctypes.c_uint64 * len(_names))()
    _lib.hpctrain_wire_calls(counts)
    conns = (_Connection * 8192)()
    n = _lib.hpctrain_wire_connections(conns, ctypes.c_uint64(8192))
    return {"calls": {name: int(c) for name, c in zip(_names, counts, strict=True) if c},
            "connections": [[int(getattr(c, f)) for f in CONNECTION_FIELDS] for c in conns[:n]]}


def difference(later: Mapping[str, Any], earlier: Mapping[str, Any] | None) -> dict[str, Any]:
    """``later - earlier`` of two snapshots (connections matched by their ports; a new one counts whole)."""
    if earlier is None:
        return {"calls": dict(later["calls"]), "connections": [list(c) for c in later["connections"]]}
    calls = {k: v - earlier["calls"].get(k, 0) for k, v in later["calls"].items()}
    before = {(c[0], c[1]): c for c in earlier["connections"]}
    conns = []
    for c in later["connections"]:
        e = before.get((c[0], c[1]))
        conns.append(c[:2] + [v - (e[i + 2] if e else 0) for i, v in enumerate(c[2:7])] + [c[7]])
    return {"calls": {k: v for k, v in calls.items() if v}, "connections": conns}


def add(total: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """``total + more`` (in place), connections matched by their ports."""
    for k, v in more["calls"].items():
        total.setdefault("calls", {})[k] = total.get("calls", {}).get(k, 0) + v
    index = {(c[0], c[1]): c for c in total.setdefault("connections", [])}
    for c in more["connections"]:
        if (c[0], c[1]) in index:
            mine = index[(c[0], c[1])]
            mine[2:7] = [a + b for a, b in zip(mine[2:7], c[2:7], strict=True)]
        else:
            total["connections"].append(list(c))
            index[(c[0], c[1])] = total["connections"][-1]
    return total
