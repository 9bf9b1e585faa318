"""The store gloo's full-mesh rendezvous talks to: each rank's one ``set`` of its own addresses becomes a single
collective exchange (one MPI allgather, or a handful of requests to the TCPStore), after which every address gloo
waits for and reads is already in this process. Without it every rank asks rank 0's TCPStore for every other
rank's key (2 N + 1 calls per rank, O(N^2) on rank 0). Method and measurements: docs/scaling.md,
"torch.distributed at scale".
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hpctrain.errors import RuntimeFailure

# exchange(prefix, this rank's value) -> every rank's value for that prefix, indexed by rank
Exchange = Callable[[str, bytes], list[bytes]]

_EXCHANGE_PREFIX = "hpctrain/exchange/"


class ExchangeStore(dist.Store):
    """A ``torch.distributed.Store`` whose ``set("<prefix>/<this rank>", value)`` is collective: every rank calls
    it at the same point of gloo's ``connectFullMesh`` (each publishes the addresses of its N - 1 pairs under its
    own rank number), so the call exchanges the values and keeps them all here; ``wait``/``get``/``check`` of
    those keys then need nobody. Any other key goes to ``fallback`` (the TCPStore), or fails with a message
    where there is none (an MPI-bootstrapped gloo group needs no other key).
    """

    def __init__(self, rank: int, exchange: Exchange, fallback: Any = None) -> None:
        super().__init__()
        self.rank = rank
        self._exchange = exchange
        self._fallback = fallback
        self._local: dict[str, bytes] = {}
        self.exchanges = 0  # collective exchanges made (one per gloo context: one per process group and device)
        self.local_calls = 0  # calls answered from the exchanged values, without the server

    def _own(self, key: str) -> str | None:
        prefix, _, last = key.rpartition("/")
        return prefix if prefix and last == str(self.rank) else None

    def _other(self, what: str) -> Any:
        if self._fallback is None:
            raise RuntimeFailure(f"rank {self.rank}: the MPI-bootstrapped rendezvous store was asked to {what}, "
                                 "which only gloo's full-mesh address exchange may use it for",
                                 hint="report this with the torch version: a torch.distributed change uses the "
                                      "store in a new way")
        return self._fallback

    def set(self, key: str, value: Any) -> None:
        prefix = self._own(key)
        if prefix is None:
            self._other(f"set {key!r}").set(key, value)
            return
        values = self._exchange(prefix, _bytes(value))
        self.exchanges += 1
        self.local_calls += 1
        for r, v in enumerate(values):
            self._local[f"{prefix}/{r}"] = v

    def get(self, key: str) -> bytes:
        if key in self._local:
            self.local_calls += 1
            return self._local[key]
        return self._other(f"get {key!r}").get(key)

    def check(self, keys: list[str]) -> bool:
        missing = [k for k in keys if k not in self._local]
        self.local_calls += not missing
        return not missing or self._other(f"check {missing!r}").check(missing)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        missing = [k for k in keys if k not in self._local]
        if not missing:
            self.local_calls += 1
            return
        store = self._other(f"wait for {missing!r}")
        store.wait(missing) if timeout is None else store.wait(missing, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def add(self, key: str, amount: int) -> int:
        return int(self._other(f"add to {key!r}").add(key, amount))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._other(f"compare_set {key!r}").compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        if self._local.pop(key, None) is not None:
            return True
        return bool(self._other(f"delete {key!r}").delete_key(key))

    def num_keys(self) -> int:
        return len(self._local) + (self._fallback.num_keys() if self._fallback is not None else 0)

    def set_timeout(self, timeout: timedelta) -> None:
        if self._fallback is not None:
            self._fallback.set_timeout(timeout)


def _bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("latin-1")
    return bytes(value)


def mpi_exchange(comm: Any, rank: int) -> Exchange:
    """One allgather over ``comm`` (an MPI communicator of the job's ranks, in rank order) per exchange."""

    def exchange(prefix: str, value: bytes) -> list[bytes]:
        got = comm.allgather((prefix, value))
        prefixes = {p for p, _ in got}
        if len(prefixes) != 1:
            raise RuntimeFailure(f"rank {rank}: the ranks exchanged gloo addresses for different groups "
                                 f"({sorted(prefixes)[:4]})",
                                 hint="every rank must create its process groups in the same order")
        return [v for _, v in got]

    return exchange


def store_exchange(store: Any, rank: int, size: int, timeout: timedelta) -> Exchange:
    """Through ``store`` (the TCPStore): one ``append`` of this rank's value to a shared key, one ``add`` to its
    count (the last rank to add says the key is complete), one ``wait`` and one ``get`` of all values: four calls
    per rank (five on the last), whatever N is, instead of 2 N + 1."""

    def exchange(prefix: str, value: bytes) -> list[bytes]:
        base = f"{_EXCHANGE_PREFIX}{prefix}"
        store.append(f"{base}/values", struct.pack("<qq", rank, len(value)) + value)
        if store.add(f"{base}/count", 1) == size:
            store.set(f"{base}/complete", b"1")
        store.wait([f"{base}/complete"], timeout)
        return _split(store.get(f"{base}/values"), size, rank)

    return exchange


def _split(blob: bytes, size: int, rank: int) -> list[bytes]:
    values: list[bytes | None] = [None] * size
    at = 0
    while at < len(blob):
        r, n = struct.unpack_from("<qq", blob, at)
        values[r] = blob[at + 16:at + 16 + n]
        at += 16 + n
    missing = [r for r, v in enumerate(values) if v is None]
    if missing:
        raise RuntimeFailure(f"rank {rank}: the address exchange holds no value from rank(s) {missing[:8]}")
    return [v for v in values if v is not None]


class CountingStore(dist.Store):
    """Forwards every call to the store it wraps, after telling ``count`` the operation's name."""

    def __init__(self, inner: Any, count: Callable[[str], None]) -> None:
        super().__init__()
        self._inner, self._count = inner, count

    def set(self, key: str, value: Any) -> None:
        self._count("set")
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        self._count("get")
        return self._inner.get(key)

    def add(self, key: str, amount: int) -> int:
        self._count("add")
        return int(self._inner.add(key, amount))

    def append(self, key: str, value: Any) -> None:
        self._count("append")
        self._inner.append(key, value)

    def check(self, keys: list[str]) -> bool:
        self._count("check")
        return bool(self._inner.check(keys))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._count("wait")
        self._inner.wait(keys) if timeout is None else self._inner.wait(keys, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._count("multi_get")
        return self._inner.multi_get(keys)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self._count("compare_set")
        return self._inner.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        self._count("delete_key")
        return bool(self._inner.delete_key(key))

    def num_keys(self) -> int:
        self._count("num_keys")
        return int(self._inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)
