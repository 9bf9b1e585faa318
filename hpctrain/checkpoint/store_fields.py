"""What the checkpoint store's write, commit and read sides share: the node group, the tally of work done, the
store's fields, where a node keeps its transient files, and the message for a failed write.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from hpctrain.checkpoint.exchange import Exchange
from hpctrain.checkpoint.manifest import read_entries, step_dirname


class WorkTally(Protocol):
    """Where the store counts the files and bytes it writes (runtime/counting/work_counts.py's ``WorkCounts`` is
    one)."""

    def add_checkpoint_file(self, step: int, nbytes: int, node_local: bool = False) -> None:
        """One file of ``nbytes`` written for checkpoint ``step``."""

    def add_checkpoint_records(self, step: int, nbytes: int) -> None:
        """``nbytes`` of file reports received from the other ranks for checkpoint ``step``."""


@dataclass(frozen=True)
class NodeGroup:
    """This rank's node, for one checkpoint file per node: its local rank and the node's rank count, and
    ``scratch``, node-local storage where the node's ranks leave their states for local rank 0 (one directory
    per run attempt). ``timeout_s``: how long local rank 0 waits for them (the collective timeout)."""

    local_rank: int
    local_size: int
    scratch: Path
    timeout_s: float = 300.0


class StoreFields:
    """The state of one rank's ``CheckpointStore`` (set by its constructor), and what each of its sides needs."""

    directory: Path
    keep: int
    rank: int
    world_size: int
    checksum: str
    node: NodeGroup | None
    tally: WorkTally | None
    _x: Exchange
    _buffers: dict[str, dict[str, torch.Tensor]]
    _root_made: bool
    _index_digest: str | None  # of this rank's node file, when it is the file's first rank
    _member: tuple[int, bytes] | None  # (step, this rank's member) as checked by latest_valid

    def _scratch(self, step: int) -> Path:
        assert self.node is not None
        return self.node.scratch / step_dirname(step)


    def _resume_dir(self) -> Path:
        assert self.node is not None
        return self.node.scratch / "resume"


    def _failure(self, step: int, e: OSError) -> list[str]:
        """[message, hint] for a failed write; JSON-able so it can travel through gather."""
        reason = e.strerror or str(e)
        who = f"rank {self.rank}: " if self.world_size > 1 else ""
        entries, _ = read_entries(self.directory)
        prev = (
            f"the previous checkpoint (step {entries[-1].step}) is intact"
            if entries
            else "there is no previous checkpoint"
        )
        msg = f"{who}cannot write checkpoint step {step} to {self.directory}: {reason}; {prev}"
        if e.errno == errno.ENOSPC or e.errno == errno.EDQUOT:
            hint = "free space, lower checkpoint.keep or point checkpoint.dir at a larger file system"
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            hint = "make the directory writable or set checkpoint.dir to a writable one"
        else:
            hint = f"errno {e.errno}" if e.errno else ""
        return [msg, hint]
