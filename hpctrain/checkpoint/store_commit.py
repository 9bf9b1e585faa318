"""The commit side of the checkpoint store: once every rank's files are written, rank 0 lists the checkpoint in
the manifest (after a marker in its directory) and deletes what is no longer kept; collective, O(log N) messages
of a fixed size for a rank when the node files are regular.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from hpctrain import files
from hpctrain.checkpoint.exchange import received_bytes
from hpctrain.checkpoint.hashed_write import write_json_hashed, writer_pool
from hpctrain.checkpoint.manifest import (
    FORMAT,
    FORMAT_VERSION,
    INDEX_SUM_WORDS,
    MANIFEST,
    MARKER,
    STEP_DIR,
    Checkpoint,
    FileRecord,
    NodeFiles,
    index_words,
    read_entries,
)
from hpctrain.checkpoint.store_fields import StoreFields
from hpctrain.checkpoint.store_write import PendingSave
from hpctrain.errors import CheckpointError

log = logging.getLogger("hpctrain.checkpoint")


class CommitSide(StoreFields):
    """The part of ``CheckpointStore`` that makes a written checkpoint complete, or discards it."""

    def commit(self, pending: PendingSave) -> Path:
        """Wait for this rank's files of ``pending``, then make the checkpoint complete; collective.

        Raises CheckpointError on every rank if any rank's write (or rank 0's commit) failed; the
        previous checkpoint then stays the newest complete one.
        """
        report = pending.wait()
        step, sdir = pending.step, pending.sdir
        if self._x.any(report["error"] is not None):
            errors = self._x.gather(report["error"])
            first = self._x.bcast(next(e for e in errors if e) if errors is not None else None)
            if self.rank == 0:
                self._discard_incomplete(sdir)
            raise CheckpointError(first[0], hint=first[1])

        received = received_bytes(self._x)
        nodes = self._node_files(report) if self.node is not None else None
        reports = [report["files"]] if nodes is not None else self._x.gather(report["files"])
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_records(step, received_bytes(self._x) - received)
        commit_error: list[str] | None = None
        if reports is not None and self.rank == 0:
            files = tuple(FileRecord.from_json(f) for r in reports for f in r)
            if nodes is not None:
                files = tuple(f for f in files if not f.ranks)  # the node files are described by ``nodes``
            ckpt = Checkpoint(step, sdir, self.world_size, files, self.checksum, _now(), nodes)
            try:
                self._commit(ckpt, prune_in_background=pending.background)
            except OSError as e:
                commit_error = self._failure(step, e)
                self._discard_incomplete(sdir)
        status = self._x.bcast(commit_error)
        if status:
            raise CheckpointError(status[0], hint=status[1])
        return sdir

    def _node_files(self, report: dict[str, Any]) -> NodeFiles | None:
        """The node files described by count, ranks per file and index sum when every rank's state is in a node
        file of ``k`` consecutive ranks starting at a multiple of ``k``; None (records are gathered) otherwise.

        Collective: one all-reduce of a fixed-size vector, whatever the number of nodes."""
        files, ranks, irregular, k2 = 0, 0, 0, 0
        words = [0] * INDEX_SUM_WORDS
        for rec in report["files"]:
            runs = rec.get("ranks") or []
            if not runs:
                continue
            files += 1
            if len(runs) != 1 or runs[0][0] % (runs[0][1] - runs[0][0]) or "index" not in report:
                irregular += 1
                continue
            k = runs[0][1] - runs[0][0]
            ranks, k2 = ranks + k, k2 + k * k
            words = index_words(report["index"])
        total = self._x.sum([files, ranks, irregular, k2, *words])
        files, ranks, irregular, k2 = total[:4]
        if irregular or files == 0 or ranks != self.world_size or files * k2 != ranks * ranks:
            return None  # unequal sizes show as sum(k^2) * files > sum(k)^2
        return NodeFiles(files, ranks // files, tuple(total[4:]))

    def _commit(self, ckpt: Checkpoint, *, prune_in_background: bool = False) -> None:
        """Rank 0: marker, one fsync of the step directory, manifest, then delete what is not kept."""
        write_json_hashed(ckpt.path / MARKER, ckpt.to_json(), sync_dir=False)
        files.fsync_dir(ckpt.path)  # shared.pt, rank-00000.pt and the marker renames become durable together
        entries, _ = read_entries(self.directory)
        older = [e for e in entries if e.step < ckpt.step]  # later steps belong to an abandoned timeline
        kept = older[max(0, len(older) - (self.keep - 1)) :] if self.keep > 1 else []  # up to keep - 1 of them
        kept.append(ckpt)
        for later in (e for e in entries if e.step > ckpt.step):
            # before the manifest drops it: a reader adds a step whose marker it finds back to the list
            (later.path / MARKER).unlink(missing_ok=True)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "checkpoints": [c.to_json() for c in kept],
        }
        write_json_hashed(self.directory / MANIFEST, manifest)
        keep_dirs = {c.path.name for c in kept}
        # The list is fixed now, on the committing thread: a later save's directory (which may be written
        # while a background prune runs) is never on it.
        stale = [child for child in self.directory.iterdir()
                 if STEP_DIR.fullmatch(child.name) and child.name not in keep_dirs and child.is_dir()]
        if prune_in_background:
            writer_pool().submit(self._delete, stale)
        else:
            self._delete(stale)

    def _delete(self, stale: list[Path]) -> None:
        for child in stale:
            try:
                shutil.rmtree(child)
            except OSError as e:
                log.warning("could not delete old checkpoint %s: %s", child, e.strerror or e)

    def _discard_incomplete(self, sdir: Path) -> None:
        if sdir.is_dir() and not (sdir / MARKER).exists():
            shutil.rmtree(sdir, ignore_errors=True)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
