"""The write side of the checkpoint store: a rank's files of one checkpoint, written now or by a background
thread from a copy in CPU memory, one file per rank or (``node=``) one per node packed by its local rank 0.
Nothing here is collective except the step directory's creation; ``store_commit`` makes a checkpoint complete.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain import files
from hpctrain.checkpoint.hashed_write import write_hashed, writer_pool
from hpctrain.checkpoint.manifest import SHARED, FileRecord, node_filename, rank_filename, rank_runs, step_dirname
from hpctrain.checkpoint.node_file import pack
from hpctrain.checkpoint.store_fields import StoreFields
from hpctrain.errors import CheckpointError


def snapshot(obj: Any, buffers: dict[str, torch.Tensor] | None = None, _path: str = "",
             _memo: dict[int, torch.Tensor] | None = None) -> Any:
    """A copy of a state in CPU memory: every tensor copied (shared tensors stay shared), containers rebuilt.

    Numbers, strings and None are immutable and kept. This is the only part of an asynchronous save the
    training loop waits for: a memory copy, no pickling and no I/O. ``buffers`` (path in the state ->
    tensor) are reused when shape and dtype match and filled with the tensors copied, so a run's every
    save after the first copies into memory already mapped (no page faults on fresh allocations).
    """
    memo = {} if _memo is None else _memo
    if isinstance(obj, torch.Tensor):
        key = id(obj)
        if key not in memo:
            old = None if buffers is None else buffers.get(_path)
            if old is not None and old.shape == obj.shape and old.dtype == obj.dtype and old.device.type == "cpu":
                memo[key] = old.copy_(obj.detach())
            else:
                memo[key] = obj.detach().to("cpu", copy=True)
            if buffers is not None:
                buffers[_path] = memo[key]
        return memo[key]
    if isinstance(obj, dict):
        items = [(k, snapshot(v, buffers, f"{_path}/{k}", memo)) for k, v in obj.items()]
        if type(obj) is dict:
            return dict(items)
        out = type(obj)(items)  # a module's state_dict is an OrderedDict with version _metadata: keep both
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, (list, tuple)):
        copied = [snapshot(v, buffers, f"{_path}/{i}", memo) for i, v in enumerate(obj)]
        return copied if isinstance(obj, list) else tuple(copied)
    return obj


@dataclass
class PendingSave:
    """A checkpoint whose files this rank is writing (or has written); commit it with ``store.commit``."""

    step: int
    sdir: Path
    future: Future[dict[str, Any]]
    background: bool = True  # commit then prunes old directories in the background writer too

    def done(self) -> bool:
        """True once this rank's files are written (or failed); never blocks."""
        return self.future.done()

    def wait(self) -> dict[str, Any]:
        """This rank's report (files written or the error); blocks until the write ended. Not collective."""
        return self.future.result()


class SaveSide(StoreFields):
    """The part of ``CheckpointStore`` that writes this rank's files of a checkpoint."""

    def _start(self, step: int, state: dict[str, Any], per_rank: dict[str, Any] | None, *,
               background: bool) -> PendingSave:
        sdir = self.directory / step_dirname(step)
        dir_error = self._make_step_dir(step, sdir)

        def write() -> dict[str, Any]:
            report: dict[str, Any] = {"rank": self.rank, "files": [], "error": dir_error}
            if dir_error is not None:
                return report
            try:
                if self.rank == 0:
                    report["files"].append(self._write_pt(sdir / SHARED, state, step).to_json())
                if self.node is None:
                    if per_rank is not None:
                        rec = self._write_pt(sdir / rank_filename(self.rank), per_rank, step)
                        report["files"].append({**rec.to_json(), "rank": self.rank})
                else:
                    self._hand_over(step, per_rank)
                    if self.node.local_rank == 0:
                        packed = self._pack_node(step, sdir)
                        if packed is not None:
                            report["files"].append(packed[0].to_json())
                            report["index"] = packed[1]
                # Only a rank that renamed a file into the directory makes that rename durable; rank 0 syncs
                # the directory once, after it added the marker.
                if self.rank != 0 and report["files"]:
                    files.fsync_dir(sdir)
            except OSError as e:
                report["error"] = self._failure(step, e)
            except CheckpointError as e:
                report["error"] = [e.message, e.hint or ""]
            except Exception as e:  # e.g. an object torch.save cannot pickle: still a report every rank sees
                report["error"] = [f"rank {self.rank}: cannot write checkpoint step {step} to {self.directory}: "
                                   f"{type(e).__name__}: {e}", "report this as a bug"]
            if report["error"] is not None and self.node is not None:
                self._hand_over_failed(step, report["error"][0])
            return report

        if not background:
            done: Future[dict[str, Any]] = Future()
            done.set_result(write())
            return PendingSave(step, sdir, done, background=False)
        return PendingSave(step, sdir, writer_pool().submit(write))

    def _make_step_dir(self, step: int, sdir: Path) -> list[str] | None:
        """Rank 0 creates the step directory, the others hear that it exists (or why not); collective.

        One mkdir per save on the shared directory, whatever the number of ranks; returns the [message, hint]
        of rank 0's failure on every rank, None when the directory is there."""
        error: list[str] | None = None
        if self.rank == 0:
            try:
                if not self._root_made:  # so that the step directory's own mkdir is one call, not a retry
                    self.directory.mkdir(parents=True, exist_ok=True)
                    self._root_made = True
                sdir.mkdir(exist_ok=True)
            except OSError as e:
                error = self._failure(step, e)
        return self._x.bcast(error) if self.world_size > 1 else error

    def _write_pt(self, final: Path, obj: dict[str, Any], step: int) -> FileRecord:
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # left by a writer killed earlier
            with suppress(OSError):
                stale.unlink()
        rec = write_hashed(final, lambda f: torch.save(obj, f), self.checksum, sync_dir=False)
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_file(step, rec.bytes)
        return rec

    def _hand_over(self, step: int, per_rank: dict[str, Any] | None) -> None:
        """Leave this rank's state (or a note that it has none) where its node's local rank 0 will pack it."""
        scratch = self._scratch(step)
        scratch.mkdir(parents=True, exist_ok=True)
        if per_rank is None:
            (scratch / f"rank-{self.rank:05d}.none").touch()
            return
        final = scratch / rank_filename(self.rank)
        buffer = io.BytesIO()
        torch.save(per_rank, buffer)
        # node-local and transient: no fsync, the node file is what is made durable
        files.write_atomic(final, lambda f: f.write(buffer.getbuffer()), durable=False)
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_file(step, buffer.getbuffer().nbytes, node_local=True)

    def _hand_over_failed(self, step: int, message: str) -> None:
        """Tell local rank 0 at once that this rank's state will not come (it would otherwise wait it out)."""
        with suppress(OSError):
            scratch = self._scratch(step)
            scratch.mkdir(parents=True, exist_ok=True)
            (scratch / f"rank-{self.rank:05d}.failed").write_text(message)

    def _pack_node(self, step: int, sdir: Path) -> tuple[FileRecord, str] | None:
        """Local rank 0: wait for every rank of the node, pack their states into one file on the shared file
        system, and return its record and its index's digest (None when none of them saved a state)."""
        assert self.node is not None
        scratch = self._scratch(step)
        deadline, pause = time.monotonic() + self.node.timeout_s, 0.002
        while True:
            seen: dict[int, str] = {}
            for name in os.listdir(scratch):
                stem, _, kind = name.partition(".")
                if stem.startswith("rank-") and kind in ("pt", "none", "failed"):
                    seen[int(stem[5:])] = kind
            if len(seen) >= self.node.local_size:
                break
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"rank {self.rank}: only {len(seen)} of this node's {self.node.local_size} ranks handed over "
                    f"their state for checkpoint step {step} within {self.node.timeout_s:g} s",
                    hint="a rank of this node is stuck or dead: see its own messages")
            time.sleep(pause)
            pause = min(0.05, 2 * pause)
        shutil.rmtree(self._resume_dir(), ignore_errors=True)  # every rank of the node is past its resume
        failed = sorted(r for r, kind in seen.items() if kind == "failed")
        if failed:
            why = (scratch / f"rank-{failed[0]:05d}.failed").read_text()
            raise CheckpointError(f"rank {self.rank}: the state of rank {failed[0]} did not reach its node file: {why}")
        members = [(r, scratch / rank_filename(r)) for r in sorted(seen) if seen[r] == "pt"]
        if not members:
            shutil.rmtree(scratch, ignore_errors=True)
            return None
        final = sdir / node_filename(self.rank)
        index: list[str] = []
        rec = write_hashed(final, lambda f: index.append(pack(f, members, self.checksum, step).digest),
                           self.checksum, sync_dir=False)
        shutil.rmtree(scratch, ignore_errors=True)
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_file(step, rec.bytes)
        return FileRecord(rec.name, rec.bytes, rec.digest, None, rank_runs([r for r, _ in members])), index[-1]

