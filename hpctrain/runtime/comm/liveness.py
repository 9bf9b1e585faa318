"""Who is behind, asked only once a collective is late: the side channels the communicators' watchdogs use.

``MPIQueries``: over an MPI side communicator; every tick a rank probes its own queue (no message leaves it).
``StoreQueries``: over the rendezvous store, for torch.distributed ranks started without MPI; each rank keeps one
blocking ``wait`` on its own key, which the server answers only when a late rank asks, so nothing is sent per
tick. In training neither loads any process with a request per tick. docs/runtime.md, "Liveness".
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

from hpctrain.runtime.comm.watchdog import Pending

_QUERY_TAG, _REPLY_TAG = 7301, 7302
STORE_PREFIX = "hpctrain/"
LISTEN_S = 3600.0  # one wait per rank and hour (re-armed when it ends unanswered): ~0 requests per second
CLOSED = b"closed"


def grace_s(timeout_s: float, tick_s: float) -> float:
    """How long a timed-out rank waits for the others to say which collective they reached."""
    return min(10.0, max(2.0, 5 * tick_s, 0.25 * timeout_s))


def log_line(msg: str) -> None:
    print(f"hpctrain: {msg}", file=sys.stderr, flush=True)


class MPIQueries:
    """"Which collective have you reached?" over ``side`` (a communicator of its own): ``answer`` (every watchdog
    tick) replies to queries waiting in this rank's queue; ``ask`` (on a timeout) sends the query to every other
    rank and collects replies for the grace period."""

    def __init__(self, MPI: Any, side: Any, reached: Callable[[], int]) -> None:
        self._MPI, self._side, self._reached = MPI, side, reached
        self.rank, self.size = side.Get_rank(), side.Get_size()
        self._replies: list[tuple[Any, Any]] = []

    def answer(self) -> None:
        MPI = self._MPI
        status = MPI.Status()
        while self._side.Iprobe(source=MPI.ANY_SOURCE, tag=_QUERY_TAG, status=status):
            src = status.Get_source()
            self._side.Recv(np.zeros(1, dtype=np.int64), source=src, tag=_QUERY_TAG)
            reply = np.array([self._reached()], dtype=np.int64)
            self._replies.append((self._side.Isend(reply, dest=src, tag=_REPLY_TAG), reply))

    def ask(self, pending: Pending, grace: float) -> tuple[list[int], list[int]]:
        """(ranks behind ``pending``, ranks that did not answer within ``grace`` s)."""
        MPI = self._MPI
        query = np.array([pending.index], dtype=np.int64)
        sends = [self._side.Isend(query, dest=r, tag=_QUERY_TAG) for r in range(self.size) if r != self.rank]
        reached = {self.rank: self._reached()}
        status, buf = MPI.Status(), np.zeros(1, dtype=np.int64)
        deadline = time.monotonic() + grace
        while len(reached) < self.size and time.monotonic() < deadline:
            self.answer()  # another rank that timed out too may be asking us
            while self._side.Iprobe(source=MPI.ANY_SOURCE, tag=_REPLY_TAG, status=status):
                src = status.Get_source()
                self._side.Recv(buf, source=src, tag=_REPLY_TAG)
                reached[src] = int(buf[0])
            time.sleep(0.01)
        del sends  # never completed on purpose when a peer is gone; the job aborts next
        behind = [r for r in range(self.size) if r in reached and reached[r] < pending.index]
        silent = [r for r in range(self.size) if r not in reached]
        return behind, silent

    def close(self) -> None:
        """Complete the replies sent (collective with the other ranks' ``close``: none may still be asking)."""
        for req, _ in self._replies:
            req.Wait()
        self._replies.clear()


class StoreQueries:
    """The same question over the rendezvous store. Keys: ``ask/<r>`` (a late rank writes the collective's number
    to every other rank's key), ``now/<r>`` (rank r's answer), ``abort`` (the message every rank exits with).

    A listener thread per rank blocks in ``wait([ask/<rank>])`` on its own connection: the server holds that
    request until the key is set, so an idle job costs no request per tick, one per ``LISTEN_S`` at most. At
    ``close`` each rank sets its own key to ``closed`` (one request), which ends its listener; the rank hosting
    the server then waits, with one request, until every rank's key says so before letting the server go.
    """

    def __init__(self, connect: Callable[[], Any], rank: int, size: int, reached: Callable[[], int],
                 listen_s: float = LISTEN_S, abort_wait_s: float = 60.0) -> None:
        self._connect, self.rank, self.size, self._reached = connect, rank, size, reached
        self._listen_s, self._abort_wait_s = listen_s, abort_wait_s
        self._closing = threading.Event()
        self._listen_store = connect()
        self._thread = threading.Thread(target=self._listen, name="hpctrain-liveness", daemon=True)
        self._thread.start()

    def _key(self, name: str) -> str:
        return f"{STORE_PREFIX}{name}"

    def _listen(self) -> None:
        store, mine = self._listen_store, self._key(f"ask/{self.rank}")
        while not self._closing.is_set():
            try:
                store.wait([mine], timedelta(seconds=self._listen_s))
            except Exception as exc:
                if self._closing.is_set() or not _is_timeout(exc):
                    return  # closing, or the server is gone: rank 0 died, the timeout path says so
                continue
            if self._closing.is_set():
                return
            try:
                value = store.get(mine)
                if value == CLOSED:
                    return
                store.set(self._key(f"now/{self.rank}"), str(self._reached()))
                store.wait([self._key("abort")], timedelta(seconds=self._abort_wait_s))
                msg = store.get(self._key("abort")).decode()
            except Exception:
                return
            log_line(f"rank {self.rank}: aborting because another rank reported: {msg}")
            os._exit(1)

    def ask(self, pending: Pending, grace: float) -> tuple[list[int], list[int], Any]:
        """(ranks behind, silent ranks, the store to publish the verdict on); raises when the server is gone."""
        store = self._connect()
        store.set(self._key(f"now/{self.rank}"), str(self._reached()))
        for r in range(self.size):
            if r != self.rank:
                store.set(self._key(f"ask/{r}"), str(pending.index))
        keys = [self._key(f"now/{r}") for r in range(self.size)]
        try:
            store.wait(keys, timedelta(seconds=grace))
        except Exception as exc:
            if not _is_timeout(exc):
                raise
        reached = {r: int(store.get(k)) for r, k in enumerate(keys) if store.check([k])}
        behind = [r for r in sorted(reached) if reached[r] < pending.index]
        silent = [r for r in range(self.size) if r not in reached]
        return behind, silent, store

    def abort(self, store: Any, msg: str) -> None:
        store.set(self._key("abort"), msg)

    def close(self, store: Any, serving: bool, timeout_s: float) -> None:
        """Stop this rank's listener through ``store`` (the main connection); ``serving``: this rank hosts the
        server and waits until every rank has stopped its own."""
        self._closing.set()
        try:
            store.set(self._key(f"ask/{self.rank}"), CLOSED)
        except Exception:  # the server is gone: the listener's wait has failed too
            pass
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            log_line(f"rank {self.rank}: the liveness listener did not stop within {timeout_s:g} s")
        if serving:
            try:
                store.wait([self._key(f"ask/{r}") for r in range(self.size)], timedelta(seconds=timeout_s))
            except Exception:  # a peer already gone: nothing left to protect
                pass
        self._listen_store = None


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timeout" in text or "timed out" in text
