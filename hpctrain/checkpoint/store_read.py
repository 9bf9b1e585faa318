"""The read side of the checkpoint store: the newest checkpoint every rank can read (sizes, checksums, a node
file through its own index), and loading it; one rank per node reads the manifest and ``shared.pt`` and leaves
them in node-local storage for the node's other ranks.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch

from hpctrain import files
from hpctrain.checkpoint.manifest import (
    INDEX_SUM_WORDS,
    SHARED,
    Checkpoint,
    FileRecord,
    checksum_known,
    file_problem,
    index_words,
    read_entries,
)
from hpctrain.checkpoint.node_file import COPY_CHUNK, read_member, read_node_index
from hpctrain.checkpoint.store_fields import StoreFields
from hpctrain.errors import CheckpointError
from hpctrain.files import check_regular, open_regular, within

log = logging.getLogger("hpctrain.checkpoint")


class ReadSide(StoreFields):
    """The part of ``CheckpointStore`` that finds, checks and loads checkpoints."""

    def checkpoints(self) -> list[Checkpoint]:
        """Complete checkpoints by increasing step (from the manifest, or rebuilt if it is unreadable)."""
        return read_entries(self.directory)[0]

    def _problem(self, ckpt: Checkpoint, verify: bool) -> str | None:
        """Why this rank cannot use ``ckpt``: its shared file and, same world size, the file with its own state.

        ``shared.pt`` is checked by one rank per node (which copies it to node-local storage on the way), or by
        every rank without a node group. A node file is checked whole (size, and its digest by the first of its
        ranks when ``verify``) or, when the entry describes it by ``nodes``, through its own index; each rank
        checks its own member's digest: every byte is verified once, no rank reads another node's file.
        """
        problem = self._shared_problem(ckpt, verify)
        if problem is not None or ckpt.world_size != self.world_size:
            return problem
        own = ckpt.file_for_rank(self.rank)
        if own is None:
            return None
        if own.rank is not None:
            return file_problem(ckpt, [own.name], verify)
        path = ckpt.path / own.name
        if own.self_checked:
            try:
                index = read_node_index(path)
                if index.step is not None and index.step != ckpt.step:
                    raise ValueError(f"its index is of step {index.step}")
                data = read_member(path, self.rank, verify, index)
                if verify:  # load() uses these verified bytes instead of reading them again
                    self._member = (ckpt.step, data)
            except (OSError, ValueError) as e:
                return f"{path}: {e}"
            if self.rank == own.ranks[0][0]:
                self._index_digest = index.digest
            return None
        first = own.ranks[0][0]
        problem = file_problem(ckpt, [own.name], verify and self.rank == first)
        if problem is None and verify and self.rank != first:
            try:
                read_member(path, self.rank)
            except (OSError, ValueError) as e:
                problem = f"{path}: {e}"
        return problem

    def _index_problem(self, ckpt: Checkpoint) -> str | None:
        """Collective when ``ckpt`` describes its node files: the first rank of each node file adds its index
        digest; the sum must be the one the commit recorded (a file missing, replaced or of another save)."""
        if ckpt.nodes is None or ckpt.world_size != self.world_size:
            return None
        digest, self._index_digest = self._index_digest, None
        mine = [1, *index_words(digest)] if digest is not None else [0] * (1 + INDEX_SUM_WORDS)
        total = self._x.sum(mine)
        if total[0] == ckpt.nodes.count and tuple(total[1:]) == ckpt.nodes.index_sum:
            return None
        return (f"{ckpt.path}: its {ckpt.nodes.count} node files' indices do not add up to the sum recorded at "
                f"commit ({total[0]} read)")

    # ------------------------------------------------------------------- one reader of shared state per node

    def _node_reader(self) -> bool | None:
        """True on the rank that reads shared state for its node, False on the node's others; None: every rank
        reads for itself (no node group)."""
        return None if self.node is None else self.node.local_rank == 0

    def _shared_copy(self, ckpt: Checkpoint) -> Path | None:
        """This node's copy of ``ckpt``'s shared.pt in node-local storage (its reader made it), or None."""
        if self.node is None:
            return None
        path = self._resume_dir() / f"{SHARED}.{ckpt.step:08d}"
        return path if path.is_file() else None

    def _shared_problem(self, ckpt: Checkpoint, verify: bool) -> str | None:
        """shared.pt: checked (and copied to node-local storage) by the node's reader, not by its other ranks."""
        reader = self._node_reader()
        if reader is None:
            return file_problem(ckpt, [SHARED], verify)
        if not reader:
            return None  # the node's reader checks it; its verdict reaches every rank through the vote
        rec = ckpt.file(SHARED)
        if rec is None:
            return f"{ckpt.path / SHARED} is not recorded in the manifest"
        try:
            _check_loadable(ckpt.path / SHARED, ckpt, rec.bytes)
            readable = True
        except (OSError, ValueError):
            readable = False
        if not readable or (verify and not checksum_known(ckpt.checksum)):
            return file_problem(ckpt, [SHARED], verify)  # says what is wrong with it, without copying it
        final = self._resume_dir() / f"{SHARED}.{ckpt.step:08d}"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            size, digest = _copy_hashing(ckpt.path / SHARED, final, ckpt.checksum if verify else None)
        except OSError as e:
            log.warning("rank %d: cannot copy %s to node-local %s (%s): this node's ranks read it themselves",
                        self.rank, ckpt.path / SHARED, final.parent, e.strerror or e)
            with suppress(OSError):
                final.unlink()
            return file_problem(ckpt, [SHARED], verify)
        bad = None
        if size != rec.bytes:
            bad = f"{ckpt.path / SHARED} is truncated or wrong: {size} bytes, the manifest says {rec.bytes}"
        elif verify and digest != rec.digest:
            bad = (f"{ckpt.path / SHARED} is corrupt: {ckpt.checksum} {digest[:12]}…, "
                   f"the manifest says {rec.digest[:12]}…")
        if bad is not None:
            final.unlink()
        return bad

    def _entries(self) -> tuple[list[Checkpoint], list[str]]:
        """The checkpoints and the problems met reading them: the manifest is read by one rank per node, which
        leaves what it found in node-local storage for the node's others; collective with a node group."""
        reader = self._node_reader()
        if reader is None:
            return read_entries(self.directory)
        entries: list[Checkpoint] = []
        problems: list[str] = []
        failed = False
        path = self._resume_dir() / "entries.json"
        if reader:
            entries, problems = read_entries(self.directory)
            text = json.dumps({"entries": [c.to_json() for c in entries], "problems": problems})
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                files.write_atomic(path, text, durable=False)  # node-local, read once by this resume
            except OSError as e:
                log.warning("rank %d: cannot leave the checkpoint list in node-local %s (%s): every rank reads it",
                            self.rank, path.parent, e.strerror or e)
                failed = True
        if self._x.any(failed):
            return read_entries(self.directory) if not reader else (entries, problems)
        if reader:
            return entries, problems
        data = json.loads(path.read_text())
        return [Checkpoint.from_json(self.directory, d) for d in data["entries"]], list(data["problems"])

    def latest_valid(self, verify: bool = True, below: int | None = None) -> Checkpoint | None:
        """The newest checkpoint every rank can read (sizes, and checksums when ``verify``); collective.

        Skipped checkpoints and a rebuilt manifest are reported in ONE warning line (rank 0 logs it).
        """
        entries, problems = self._entries()
        entries = [c for c in entries if below is None or c.step < below]
        chosen: Checkpoint | None = None
        for ckpt in reversed(entries):
            self._index_digest = None
            mine = self._problem(ckpt, verify)
            indices = self._index_problem(ckpt)  # collective: every rank takes part whatever it found
            mine = mine or indices
            if not self._x.any(mine is not None):
                chosen = ckpt
                break
            found = self._x.gather(mine)
            bad = [p for p in found or () if p]
            problems.append(f"step {ckpt.step} skipped: " + "; ".join(dict.fromkeys(bad)))
        if problems and self.rank == 0:
            using = f"resuming from step {chosen.step}" if chosen else "no valid checkpoint is left"
            log.warning("checkpoint %s: %s; %s", self.directory, "; ".join(problems), using)
        return chosen

    def load_newest(self, map_location: Any = "cpu") -> tuple[Checkpoint, dict[str, Any], dict | None] | None:
        """The newest checkpoint every rank validates and loads, with (shared, own state); collective. A step
        that passes its checks but fails to load on any rank (a file ``weights_only`` refuses) is skipped
        with a warning, and the next older one tried."""
        below: int | None = None
        while (ckpt := self.latest_valid(below=below)) is not None:
            failure: str | None = None
            try:
                shared, own = self.load(ckpt, map_location=map_location, warn=False)
            except CheckpointError as e:
                failure = str(e)
            if not self._x.any(failure is not None):
                return ckpt, shared, own
            if self.rank == 0:
                log.warning("checkpoint %s: step %d skipped: %s", self.directory, ckpt.step,
                            failure or "another rank could not load its state")
            below = ckpt.step
        return None

    def load(self, checkpoint: Checkpoint, *, map_location: Any = "cpu", warn: bool = True
             ) -> tuple[dict[str, Any], dict | None]:
        """(shared state, this rank's state). The rank state is None if this rank saved none, or if the
        checkpoint was written by another world size (elastic restart: re-shard from the shared state;
        rank 0 logs one warning unless ``warn=False`` because the caller writes its own). After
        ``latest_valid``, a node's ranks load shared.pt from the copy its reader left in node-local storage."""
        copy = self._shared_copy(checkpoint)
        shared = (self._load_file(checkpoint, SHARED, map_location) if copy is None
                  else self._load_file(checkpoint, SHARED, map_location, path=copy))
        if checkpoint.world_size != self.world_size:
            if self.rank == 0 and warn:
                log.warning(
                    "checkpoint step %d was written by %d ranks, this run has %d: per-rank state (RNG, data "
                    "position, combiner residues) is not restored",
                    checkpoint.step, checkpoint.world_size, self.world_size,
                )
            return shared, None
        own = checkpoint.file_for_rank(self.rank)
        if own is None:
            return shared, None
        if own.rank is not None:
            return shared, self._load_file(checkpoint, own.name, map_location)
        return shared, self._load_member(checkpoint, own, map_location)

    def _load_member(self, ckpt: Checkpoint, rec: FileRecord, map_location: Any) -> dict[str, Any]:
        """This rank's state out of its node's file: the index and its own member are all that is read."""
        path = ckpt.path / rec.name
        member, self._member = self._member, None
        try:
            _check_loadable(path, ckpt, None if rec.self_checked else rec.bytes)
            data = member[1] if member is not None and member[0] == ckpt.step else read_member(path, self.rank)
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
        except Exception as e:  # whatever stops a load (UnpicklingError too) means: use an older step
            raise CheckpointError(
                f"cannot load rank {self.rank}'s state from checkpoint file {path}: {e}",
                hint="call latest_valid() to fall back to an older checkpoint",
            ) from e

    def _load_file(self, ckpt: Checkpoint, name: str, map_location: Any, path: Path | None = None
                   ) -> dict[str, Any]:
        """``name`` of ``ckpt``, read from ``path`` (a node-local copy of it) when given."""
        local_copy = path is not None
        path = ckpt.path / name if path is None else path
        rec = ckpt.file(name)
        try:
            if rec is None:
                raise ValueError("it is not recorded in the manifest")
            if local_copy:  # made by this node's reader from the checked file: its size is what is left to check
                if (found := check_regular(path).st_size) != rec.bytes:
                    raise ValueError(f"{found} bytes, the manifest says {rec.bytes}")
            else:
                _check_loadable(path, ckpt, rec.bytes)
            with open_regular(path) as f:
                return torch.load(f, map_location=map_location, weights_only=True)
        except Exception as e:  # whatever stops a load (UnpicklingError too) means: use an older step
            raise CheckpointError(
                f"cannot load checkpoint file {path}: {e}",
                hint="call latest_valid() to fall back to an older checkpoint",
            ) from e

def _copy_hashing(src: Path, dst: Path, checksum: str | None) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` (temp name, then rename) reading it once; (size, digest, "" without ``checksum``)."""
    h = hashlib.new(checksum) if checksum else None
    size = 0
    # node-local and read once by this resume: no fsync
    with files.atomic_path(dst, durable=False) as tmp, open(src, "rb", buffering=0) as f, open(tmp, "wb") as out:
        while chunk := f.read(COPY_CHUNK):
            if h is not None:
                h.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return size, h.hexdigest() if h is not None else ""


def _check_loadable(path: Path, ckpt: Checkpoint, size: int | None) -> None:
    """A checkpoint file is read only when it is a regular file of the recorded size inside the checkpoint
    directory once symbolic links are resolved (a link to a matching copy elsewhere is not this run's); ``size``
    None: the file checks itself (a node file's index)."""
    if not within(path, ckpt.path.parent):
        raise ValueError("it leads outside the checkpoint directory through a symbolic link")
    found = check_regular(path).st_size
    if size is not None and found != size:
        raise ValueError(f"{found} bytes, the manifest says {size}")
