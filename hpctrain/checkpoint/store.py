"""Atomic, checksummed, multi-rank checkpoints on a shared file system, and finding the newest valid one.

Layout, manifest format and the atomicity argument are in docs/checkpoints.md. Every file is written to a
temporary name, fsynced, renamed into place and its directory fsynced; a checkpoint counts only once rank 0
has listed it in ``manifest.json`` after every rank reported its file (size and checksum) through ``gather``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from hpctrain.checkpoint.manifest import (
    DEFAULT_CHECKSUM,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MARKER,
    SHARED,
    STEP_DIR,
    Checkpoint,
    FileRecord,
    file_problem,
    rank_filename,
    read_entries,
    step_dirname,
)
from hpctrain.errors import CheckpointError

log = logging.getLogger("hpctrain.checkpoint")

_OVERLAP_MIN = 1 << 20  # chunks at least this big are hashed in a second thread while written

Gather = Callable[[Any], list[Any]]


def _single_gather(obj: Any) -> list[Any]:
    return [obj]


# ------------------------------------------------------------------------------------- atomic writing

_pools: dict[str, ThreadPoolExecutor] = {}


def _single_thread_pool(name: str) -> ThreadPoolExecutor:
    """One lazily started worker thread per ``name`` and process: its jobs run in submission order."""
    pool = _pools.get(name)
    if pool is None:
        pool = _pools[name] = ThreadPoolExecutor(1, thread_name_prefix=f"hpctrain-ckpt-{name}")
    return pool


def _pool() -> ThreadPoolExecutor:
    return _single_thread_pool("hash")


class _HashingWriter:
    """File-like sink for torch.save: counts and hashes every byte on its way to the file.

    Large chunks are hashed in a helper thread while this thread writes them (hashlib and the write
    syscall both release the GIL); the call waits for both before returning, so no buffer outlives it.
    """

    def __init__(self, raw: BinaryIO, checksum: str) -> None:
        self.raw = raw
        self.hash = hashlib.new(checksum)
        self.size = 0
        self.error: OSError | None = None  # torch may wrap our OSError in a RuntimeError; keep the errno

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        try:
            if n >= _OVERLAP_MIN:
                pending = _pool().submit(self.hash.update, data)
                try:
                    self.raw.write(data)
                finally:
                    pending.result()
            else:
                self.hash.update(data)
                self.raw.write(data)
        except OSError as e:
            self.error = e
            raise
        self.size += n
        return n

    def flush(self) -> None:
        self.raw.flush()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def write_atomic(
    final: Path, produce: Callable[[Any], None], checksum: str = DEFAULT_CHECKSUM, *, sync_dir: bool = True
) -> FileRecord:
    """Write ``final`` via temp file + fsync + rename (+ directory fsync); returns its size and digest.

    ``produce(f)`` writes the content to the file-like ``f``. On any failure the temp file is removed,
    ``final`` is untouched and the OSError (with its errno) is raised. ``sync_dir=False`` leaves the
    directory fsync to the caller, who then makes several renames in one directory durable at once.
    """
    tmp = _temp_name(final)
    writer: _HashingWriter | None = None
    try:
        with open(tmp, "wb") as raw:
            writer = _HashingWriter(raw, checksum)
            produce(writer)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, final)
        if sync_dir:
            _fsync_dir(final.parent)
    except BaseException as e:
        with suppress(OSError):
            tmp.unlink()
        if writer is not None and writer.error is not None and not isinstance(e, OSError):
            raise writer.error from e
        raise
    return FileRecord(final.name, writer.size, writer.hash.hexdigest())


def _write_json(final: Path, obj: Any, *, sync_dir: bool = True) -> FileRecord:
    text = (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
    return write_atomic(final, lambda f: f.write(text), sync_dir=sync_dir)


# ------------------------------------------------------------------------------------- background saves

def _writer_pool() -> ThreadPoolExecutor:
    """One background writer per process: saves are written in the order they were started."""
    return _single_thread_pool("write")


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


# ---------------------------------------------------------------------------------------------- store


class CheckpointStore:
    """Checkpoints of one run in ``directory``; every rank makes one with its own ``rank``.

    ``gather(obj) -> [obj of rank 0, obj of rank 1, ...]`` is an all-gather of small JSON-able objects
    (``comm_gather(communicator)`` or mpi4py's ``comm.allgather``); it is also the barrier that makes a
    checkpoint complete only after every rank wrote. ``save``, ``latest_valid`` and ``prune`` are
    collective: every rank calls them in the same order. With ``world_size == 1`` no gather is needed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int = 3,
        rank: int = 0,
        world_size: int = 1,
        *,
        gather: Gather | None = None,
        checksum: str = DEFAULT_CHECKSUM,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"checkpoint.keep must be at least 1, got {keep}")
        if not 0 <= rank < world_size:
            raise CheckpointError(f"rank {rank} is outside world size {world_size}")
        if world_size > 1 and gather is None:
            raise CheckpointError(
                f"CheckpointStore for {world_size} ranks needs a gather callable",
                hint="pass gather=comm_gather(communicator) or mpi4py's comm.allgather",
            )
        hashlib.new(checksum)  # unknown names fail here, not in the middle of a save
        self.directory = Path(directory)
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.checksum = checksum
        self._gather: Gather = gather if gather is not None else _single_gather
        self._buffers: dict[str, dict[str, torch.Tensor]] = {"shared": {}, "rank": {}}
        self._last: PendingSave | None = None

    # ------------------------------------------------------------------------------------------ save

    def save(self, step: int, state: dict[str, Any], *, per_rank: dict[str, Any] | None = None) -> Path:
        """Write checkpoint ``step``; collective. Returns its directory once it is complete.

        ``state`` (model, optimizer, schedule, step, shared data position) is written by rank 0 only, so
        other ranks may pass ``{}``; ``per_rank`` (RNG, this rank's data position, combiner state) is
        written by every rank that passes it. Raises CheckpointError on every rank if any rank failed.
        """
        return self.commit(self._start(step, state, per_rank, background=False))

    def save_async(self, step: int, state: dict[str, Any], *, per_rank: dict[str, Any] | None = None
                   ) -> PendingSave:
        """Start checkpoint ``step`` and return while it is written; NOT collective.

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

    def _start(self, step: int, state: dict[str, Any], per_rank: dict[str, Any] | None, *,
               background: bool) -> PendingSave:
        sdir = self.directory / step_dirname(step)

        def write() -> dict[str, Any]:
            report: dict[str, Any] = {"rank": self.rank, "files": [], "error": None}
            try:
                sdir.mkdir(parents=True, exist_ok=True)
                if self.rank == 0:
                    report["files"].append(self._write_pt(sdir / SHARED, state).to_json())
                if per_rank is not None:
                    rec = self._write_pt(sdir / rank_filename(self.rank), per_rank)
                    report["files"].append({**rec.to_json(), "rank": self.rank})
                if self.rank != 0:  # rank 0 syncs the directory once, after it added the marker
                    _fsync_dir(sdir)
            except OSError as e:
                report["error"] = self._failure(step, e)
            except Exception as e:  # e.g. an object torch.save cannot pickle: still a report every rank sees
                report["error"] = [f"rank {self.rank}: cannot write checkpoint step {step} to {self.directory}: "
                                   f"{type(e).__name__}: {e}", "report this as a bug"]
            return report

        if not background:
            done: Future[dict[str, Any]] = Future()
            done.set_result(write())
            return PendingSave(step, sdir, done, background=False)
        return PendingSave(step, sdir, _writer_pool().submit(write))

    def commit(self, pending: PendingSave) -> Path:
        """Wait for this rank's files of ``pending``, then make the checkpoint complete; collective.

        Raises CheckpointError on every rank if any rank's write (or rank 0's commit) failed; the
        previous checkpoint then stays the newest complete one.
        """
        report = pending.wait()
        step, sdir = pending.step, pending.sdir
        reports = self._gather(report)
        failed = [r["error"] for r in reports if r["error"]]
        if failed:
            if self.rank == 0:
                self._discard_incomplete(sdir)
            raise CheckpointError(failed[0][0], hint=failed[0][1])

        commit_error: list[str] | None = None
        if self.rank == 0:
            files = tuple(FileRecord.from_json(f) for r in reports for f in r["files"])
            ckpt = Checkpoint(step, sdir, self.world_size, files, self.checksum, _now())
            try:
                self._commit(ckpt, prune_in_background=pending.background)
            except OSError as e:
                commit_error = self._failure(step, e)
                self._discard_incomplete(sdir)
        status = self._gather(commit_error)
        if status[0]:
            raise CheckpointError(status[0][0], hint=status[0][1])
        return sdir

    def _write_pt(self, final: Path, obj: dict[str, Any]) -> FileRecord:
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # left by a writer killed earlier
            with suppress(OSError):
                stale.unlink()
        return write_atomic(final, lambda f: torch.save(obj, f), self.checksum, sync_dir=False)

    def _commit(self, ckpt: Checkpoint, *, prune_in_background: bool = False) -> None:
        """Rank 0: marker, one fsync of the step directory, manifest, then delete what is not kept."""
        _write_json(ckpt.path / MARKER, ckpt.to_json(), sync_dir=False)
        _fsync_dir(ckpt.path)  # shared.pt, rank-00000.pt and the marker renames become durable together
        entries, _ = read_entries(self.directory)
        older = [e for e in entries if e.step < ckpt.step]  # later steps belong to an abandoned timeline
        kept = older[len(older) - (self.keep - 1) :] if self.keep > 1 else []
        kept.append(ckpt)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "checkpoints": [c.to_json() for c in kept],
        }
        _write_json(self.directory / MANIFEST, manifest)
        keep_dirs = {c.path.name for c in kept}
        # The list is fixed now, on the committing thread: a later save's directory (which may be written
        # while a background prune runs) is never on it.
        stale = [child for child in self.directory.iterdir()
                 if STEP_DIR.fullmatch(child.name) and child.name not in keep_dirs and child.is_dir()]
        if prune_in_background:
            _writer_pool().submit(self._delete, stale)
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

    # ------------------------------------------------------------------------------------------ read

    def checkpoints(self) -> list[Checkpoint]:
        """Complete checkpoints by increasing step (from the manifest, or rebuilt if it is unreadable)."""
        return read_entries(self.directory)[0]

    def _problem(self, ckpt: Checkpoint, verify: bool) -> str | None:
        """Why this rank cannot use ``ckpt`` (its shared file and, same world size, its own rank file)."""
        names = [SHARED]
        if ckpt.world_size == self.world_size:
            own = rank_filename(self.rank)
            if ckpt.file(own) is not None:
                names.append(own)
        return file_problem(ckpt, names, verify)

    def latest_valid(self, verify: bool = True) -> Checkpoint | None:
        """The newest checkpoint every rank can read (sizes, and checksums when ``verify``); collective.

        Skipped checkpoints and a rebuilt manifest are reported in ONE warning line (rank 0 logs it).
        """
        entries, problems = read_entries(self.directory)
        chosen: Checkpoint | None = None
        for ckpt in reversed(entries):
            found = self._gather(self._problem(ckpt, verify))
            bad = [p for p in found if p]
            if not bad:
                chosen = ckpt
                break
            problems.append(f"step {ckpt.step} skipped: " + "; ".join(dict.fromkeys(bad)))
        if problems and self.rank == 0:
            using = f"resuming from step {chosen.step}" if chosen else "no valid checkpoint is left"
            log.warning("checkpoint %s: %s; %s", self.directory, "; ".join(problems), using)
        return chosen

    def load(self, checkpoint: Checkpoint, *, map_location: Any = "cpu", warn: bool = True
             ) -> tuple[dict[str, Any], dict | None]:
        """(shared state, this rank's state). The rank state is None if this rank saved none, or if the
        checkpoint was written by another world size (elastic restart: re-shard from the shared state;
        rank 0 logs one warning unless ``warn=False`` because the caller writes its own)."""
        shared = self._load_file(checkpoint, SHARED, map_location)
        if checkpoint.world_size != self.world_size:
            if self.rank == 0 and warn:
                log.warning(
                    "checkpoint step %d was written by %d ranks, this run has %d: per-rank state (RNG, data "
                    "position, combiner residues) is not restored",
                    checkpoint.step, checkpoint.world_size, self.world_size,
                )
            return shared, None
        own = rank_filename(self.rank)
        if checkpoint.file(own) is None:
            return shared, None
        return shared, self._load_file(checkpoint, own, map_location)

    def _load_file(self, ckpt: Checkpoint, name: str, map_location: Any) -> dict[str, Any]:
        path = ckpt.path / name
        rec = ckpt.file(name)
        try:
            if rec is None:
                raise ValueError("it is not recorded in the manifest")
            if path.stat().st_size != rec.bytes:
                raise ValueError(f"{path.stat().st_size} bytes, the manifest says {rec.bytes}")
            return torch.load(path, map_location=map_location, weights_only=True)
        except (OSError, RuntimeError, ValueError, EOFError) as e:
            raise CheckpointError(
                f"cannot load checkpoint file {path}: {e}",
                hint="call latest_valid() to fall back to an older checkpoint",
            ) from e


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def comm_gather(comm: Any) -> Gather:
    """An object all-gather over an hpctrain ``Communicator`` (JSON through ``allgather_varlen``)."""

    def gather(obj: Any) -> list[Any]:
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        return [json.loads(t.numpy().tobytes()) for t in comm.allgather_varlen(data, label="checkpoint")]

    return gather
