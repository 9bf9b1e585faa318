"""Atomic, checksummed, multi-rank checkpoints on a shared file system, and finding the newest valid one.

Layout, manifest format and the atomicity argument are in docs/checkpoints.md. Every file is written to a
temporary name, fsynced, renamed into place and its directory fsynced; a checkpoint counts only once rank 0
has listed it in ``manifest.json`` after every rank reported its file to it. Rank states go one file per rank,
or (``node=``) one file per node: the node's ranks hand their states to its local rank 0 through node-local
storage and it packs them (checkpoint/node_file.py). Rank 0's part of a commit is O(log N) messages of a fixed
size when the node files are regular (an all-reduce: did any rank fail; an all-reduce of the node files' count,
shape and index digests; a broadcast of the outcome), else a tree gather of the records. At resume one rank per
node reads the manifest and ``shared.pt`` and leaves them in node-local storage for the node's other ranks.
"""

from __future__ import annotations

import errno
import hashlib
import io
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
from typing import Any, BinaryIO, Protocol

import torch

from hpctrain import files
from hpctrain.checkpoint.manifest import (
    DEFAULT_CHECKSUM,
    FORMAT,
    FORMAT_VERSION,
    INDEX_SUM_WORDS,
    MANIFEST,
    MARKER,
    SHARED,
    STEP_DIR,
    Checkpoint,
    FileRecord,
    NodeFiles,
    checksum_known,
    file_problem,
    index_words,
    node_filename,
    rank_filename,
    rank_runs,
    read_entries,
    step_dirname,
)
from hpctrain.checkpoint.node_file import COPY_CHUNK, pack, read_member, read_node_index
from hpctrain.errors import CheckpointError
from hpctrain.files import check_regular, open_regular, within

log = logging.getLogger("hpctrain.checkpoint")

_OVERLAP_MIN = 1 << 20  # chunks at least this big are hashed in a second thread while written

Gather = Callable[[Any], list[Any]]


class Exchange(Protocol):
    """The collectives a multi-rank store needs, on small JSON-able objects; every rank calls them in order."""

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any."""

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (indexed by rank), None on the others."""

    def bcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""

    def sum(self, values: list[int]) -> list[int]:
        """The element-wise sum of every rank's ``values`` (non-negative, same length) on every rank."""


class WorkTally(Protocol):
    """Where the store counts the files and bytes it writes (runtime/counting/work_counts.py's ``WorkCounts`` is
    one)."""

    def add_checkpoint_file(self, step: int, nbytes: int, node_local: bool = False) -> None:
        """One file of ``nbytes`` written for checkpoint ``step``."""

    def add_checkpoint_records(self, step: int, nbytes: int) -> None:
        """``nbytes`` of file reports received from the other ranks for checkpoint ``step``."""


class AllgatherExchange:
    """An Exchange from one all-gather callable (mpi4py's ``comm.allgather``, or one rank alone): every rank
    receives everything, which is fine for tests and small jobs; ``comm_exchange`` sends to rank 0 only."""

    def __init__(self, gather: Gather, rank: int) -> None:
        self._gather, self._rank = gather, rank

    def any(self, flag: bool) -> bool:
        return any(self._gather(bool(flag)))

    def gather(self, obj: Any) -> list[Any] | None:
        got = self._gather(obj)
        return got if self._rank == 0 else None

    def bcast(self, obj: Any) -> Any:
        return self._gather(obj)[0]

    def sum(self, values: list[int]) -> list[int]:
        return [sum(column) for column in zip(*self._gather(list(values)), strict=True)]


def _single_gather(obj: Any) -> list[Any]:
    return [obj]


@dataclass(frozen=True)
class NodeGroup:
    """This rank's node, for one checkpoint file per node: its local rank and the node's rank count, and
    ``scratch``, node-local storage where the node's ranks leave their states for local rank 0 (one directory
    per run attempt). ``timeout_s``: how long local rank 0 waits for them (the collective timeout)."""

    local_rank: int
    local_size: int
    scratch: Path
    timeout_s: float = 300.0


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


def write_atomic(
    final: Path, produce: Callable[[Any], None], checksum: str = DEFAULT_CHECKSUM, *, sync_dir: bool = True
) -> FileRecord:
    """Write ``final`` whole or not at all (``hpctrain.files.write_atomic``); returns its size and digest.

    ``produce(f)`` writes the content to the file-like ``f``. On any failure the temp file is removed,
    ``final`` is untouched and the OSError (with its errno) is raised. ``sync_dir=False`` leaves the
    directory fsync to the caller, who then makes several renames in one directory durable at once.
    """
    writer: _HashingWriter | None = None

    def hashed(raw: BinaryIO) -> None:
        nonlocal writer
        writer = _HashingWriter(raw, checksum)
        produce(writer)

    try:
        files.write_atomic(final, hashed, sync_dir=sync_dir)
    except BaseException as e:
        if writer is not None and writer.error is not None and not isinstance(e, OSError):
            raise writer.error from e
        raise
    assert writer is not None
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
        self._x: Exchange = exchange if exchange is not None else AllgatherExchange(gather or _single_gather, rank)
        self._buffers: dict[str, dict[str, torch.Tensor]] = {"shared": {}, "rank": {}}
        self._last: PendingSave | None = None
        self._root_made = False
        self._index_digest: str | None = None  # of this rank's node file, when it is the file's first rank
        self._member: tuple[int, bytes] | None = None  # (step, this rank's member) as checked by latest_valid

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
        return PendingSave(step, sdir, _writer_pool().submit(write))

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

        received = _received(self._x)
        nodes = self._node_files(report) if self.node is not None else None
        reports = [report["files"]] if nodes is not None else self._x.gather(report["files"])
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_records(step, _received(self._x) - received)
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
        rec = write_atomic(final, lambda f: torch.save(obj, f), self.checksum, sync_dir=False)
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_file(step, rec.bytes)
        return rec

    # ------------------------------------------------------------------------------- per-node files

    def _scratch(self, step: int) -> Path:
        assert self.node is not None
        return self.node.scratch / step_dirname(step)

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
        rec = write_atomic(final, lambda f: index.append(pack(f, members, self.checksum, step).digest),
                           self.checksum, sync_dir=False)
        shutil.rmtree(scratch, ignore_errors=True)
        counts = self.tally
        if counts is not None:
            counts.add_checkpoint_file(step, rec.bytes)
        return FileRecord(rec.name, rec.bytes, rec.digest, None, rank_runs([r for r, _ in members])), index[-1]

    def close(self) -> None:
        """Remove this node's hand-off directory and resume copies (local rank 0); not collective. Files on the
        shared side stay."""
        if self.node is not None and self.node.local_rank == 0:
            shutil.rmtree(self.node.scratch, ignore_errors=True)

    def _commit(self, ckpt: Checkpoint, *, prune_in_background: bool = False) -> None:
        """Rank 0: marker, one fsync of the step directory, manifest, then delete what is not kept."""
        _write_json(ckpt.path / MARKER, ckpt.to_json(), sync_dir=False)
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

    def _resume_dir(self) -> Path:
        assert self.node is not None
        return self.node.scratch / "resume"

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


def load_files(checkpoint: Checkpoint, map_location: Any = "cpu") -> dict[str, Any]:
    """Every state of ``checkpoint`` keyed by file name, a node file's members under their ranks' own file names
    (``rank-RRRRR.pt``), whichever layout wrote it: for inspection and tests, not for resuming."""
    out: dict[str, Any] = {}
    for rec in checkpoint.all_files():
        path = checkpoint.path / rec.name
        if not rec.ranks:
            out[rec.name] = torch.load(path, map_location=map_location, weights_only=True)
            continue
        for start, stop in rec.ranks:
            for rank in range(start, stop):
                data = read_member(path, rank)
                out[rank_filename(rank)] = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _received(exchange: Exchange) -> int:
    return int(getattr(exchange, "received_bytes", 0))


class CommExchange:
    """The store's Exchange over an hpctrain ``Communicator``: all-reduces, a gather to rank 0 and a broadcast,
    each O(log N) messages for a rank (MPI); rank 0 alone receives the records (JSON bytes).
    ``received_bytes``: what the gathers and sums delivered to this rank, padding included."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.received_bytes = 0

    def sum(self, values: list[int]) -> list[int]:
        total = torch.tensor(values, dtype=torch.int64)
        self.comm.allreduce_(total, "sum", "checkpoint node files")
        self.received_bytes += total.numel() * total.element_size()
        return [int(v) for v in total]

    def any(self, flag: bool) -> bool:
        vote = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
        self.comm.allreduce_(vote, "max", "checkpoint agree")
        return bool(vote[0] > 0)

    def gather(self, obj: Any) -> list[Any] | None:
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        longest = torch.tensor([data.numel()], dtype=torch.int64)
        self.comm.allreduce_(longest, "max", "checkpoint records length")
        padded = torch.zeros(8 + int(longest[0]), dtype=torch.uint8)
        padded[:8] = torch.tensor([data.numel()], dtype=torch.int64).view(torch.uint8)
        padded[8:8 + data.numel()] = data
        got = self.comm.gather(padded, 0, "checkpoint records")
        if got is None:
            return None
        self.received_bytes += sum(g.numel() for g in got)
        sizes = [int(g[:8].clone().view(torch.int64)[0]) for g in got]
        return [json.loads(g[8:8 + k].numpy().tobytes()) for g, k in zip(got, sizes, strict=True)]

    def bcast(self, obj: Any) -> Any:
        text = json.dumps(obj).encode() if self.comm.rank == 0 else b""
        size = torch.tensor([len(text)], dtype=torch.int64)
        self.comm.broadcast_(size, 0, "checkpoint outcome length")
        data = torch.zeros(int(size[0]), dtype=torch.uint8)
        if self.comm.rank == 0:
            data[:] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.comm.broadcast_(data, 0, "checkpoint outcome")
        return json.loads(data.numpy().tobytes())
