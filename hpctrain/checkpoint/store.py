"""Atomic, checksummed, multi-rank checkpoints on a shared file system, and finding the newest valid one.

Layout, manifest format and the atomicity argument are in docs/checkpoints.md. Every file is written to a
temporary name, fsynced, renamed into place and its directory fsynced; a checkpoint counts only once rank 0
has listed it in ``manifest.json`` after every rank reported its file to it. Rank states go one file per rank,
or (``node=``) one file per node: the node's ranks hand their states to its local rank 0 through node-local
storage and it packs them (checkpoint/node_file.py). Rank 0's part of a commit is O(log N) messages of a fixed
size when the node files are regular (an all-reduce: did any rank fail; an all-reduce of the node files' count,
shape and index digests; a broadcast of the outcome), else a tree gather of the records. At resume one rank per
node reads the manifest and ``shared.pt`` and leaves them in node-local storage for the node's other ranks.

The store is made of its three sides: ``store_write`` (this rank's files), ``store_commit`` (the collective that
makes a checkpoint complete) and ``store_read`` (the newest valid checkpoint, and loading it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.exchange import AllgatherExchange, Exchange, Gather, single_gather
from hpctrain.checkpoint.manifest import DEFAULT_CHECKSUM
from hpctrain.checkpoint.store_commit import CommitSide
from hpctrain.checkpoint.store_fields import NodeGroup, WorkTally
from hpctrain.checkpoint.store_read import ReadSide
from hpctrain.checkpoint.store_write import PendingSave, SaveSide, snapshot
from hpctrain.errors import CheckpointError


class CheckpointStore(SaveSide, CommitSide, ReadSide):
    """Checkpoints of one run in ``directory``; every rank makes one with its own ``rank``.

    ``exchange`` (``CommExchange(communicator)``) carries the small JSON-able reports between the ranks and is
    also the barrier that makes a checkpoint complete only after every rank wrote; ``gather`` (an all-gather
    callable such as mpi4py's ``comm.allgather``) is accepted instead. ``save``, ``latest_valid`` and ``prune``
    are collective: every rank calls them in the same order. With ``world_size == 1`` neither is needed.
    ``node`` (a NodeGroup) writes rank states one file per node instead of one per rank. ``tally``, where
    given, counts the files and bytes written.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int = 3,
        rank: int = 0,
        world_size: int = 1,
        *,
        gather: Gather | None = None,
        exchange: Exchange | None = None,
        checksum: str = DEFAULT_CHECKSUM,
        node: NodeGroup | None = None,
        tally: WorkTally | None = None,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"checkpoint.keep must be at least 1, got {keep}")
        if not 0 <= rank < world_size:
            raise CheckpointError(f"rank {rank} is outside world size {world_size}")
        if world_size > 1 and gather is None and exchange is None:
            raise CheckpointError(
                f"CheckpointStore for {world_size} ranks needs an exchange or a gather callable",
                hint="pass exchange=comm_exchange(communicator), or gather= mpi4py's comm.allgather",
            )
        if node is not None and not 0 <= node.local_rank < node.local_size:
            raise CheckpointError(f"rank {rank}: local rank {node.local_rank} is outside its node's "
                                  f"{node.local_size} ranks")
        hashlib.new(checksum)  # unknown names fail here, not in the middle of a save
        self.directory = Path(directory)
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.checksum = checksum
        self.node = node
        self.tally = tally
        self._x = exchange if exchange is not None else AllgatherExchange(gather or single_gather, rank)
        self._buffers = {"shared": {}, "rank": {}}
        self._last: PendingSave | None = None
        self._root_made = False
        self._index_digest = None
        self._member = None

    def save(self, step: int, state: dict[str, Any], *, per_rank: dict[str, Any] | None = None) -> Path:
        """Write checkpoint ``step``; collective. Returns its directory once it is complete.

        ``state`` (model, optimizer, schedule, step, shared data position) is written by rank 0 only, so
        other ranks may pass ``{}``; ``per_rank`` (RNG, this rank's data position, combiner state) is
        written by every rank that passes it. Raises CheckpointError on every rank if any rank failed.
        """
        return self.commit(self._start(step, state, per_rank, background=False))

    def save_async(self, step: int, state: dict[str, Any], *, per_rank: dict[str, Any] | None = None
                   ) -> PendingSave:
        """Start checkpoint ``step`` and return while it is written; collective (one broadcast: rank 0 made the
        step directory).

        The state is copied to CPU memory now (so the caller may change its tensors at once); a background
        thread writes, hashes, fsyncs and renames this rank's files. Nothing is committed until every rank
        calls the collective :meth:`commit` on the returned handle (typically at a later step boundary,
        once ``pending.done()`` is true everywhere, or before the next save). Collectives never run in the
        background thread: MPI and gloo communicators are not safe to use from two threads at once.
        """
        if self._last is not None and not self._last.done():  # its buffers are still being written
            self._buffers = {"shared": {}, "rank": {}}
        shared = snapshot(state, self._buffers["shared"])
        mine = None if per_rank is None else snapshot(per_rank, self._buffers["rank"])
        self._last = self._start(step, shared, mine, background=True)
        return self._last

    def close(self) -> None:
        """Remove this node's hand-off directory and resume copies (local rank 0); not collective. Files on the
        shared side stay."""
        if self.node is not None and self.node.local_rank == 0:
            shutil.rmtree(self.node.scratch, ignore_errors=True)
