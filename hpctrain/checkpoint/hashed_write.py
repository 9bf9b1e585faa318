"""A checkpoint file written whole or not at all (``hpctrain.files.write_atomic``) and hashed on its way to the
disk, so that its size and digest come with it; and the single worker threads the store writes in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from hpctrain import files
from hpctrain.checkpoint.manifest import DEFAULT_CHECKSUM, FileRecord

_OVERLAP_MIN = 1 << 20  # chunks at least this big are hashed in a second thread while written

_pools: dict[str, ThreadPoolExecutor] = {}


def single_thread_pool(name: str) -> ThreadPoolExecutor:
    """One lazily started worker thread per ``name`` and process: its jobs run in submission order."""
    pool = _pools.get(name)
    if pool is None:
        pool = _pools[name] = ThreadPoolExecutor(1, thread_name_prefix=f"hpctrain-ckpt-{name}")
    return pool


def _pool() -> ThreadPoolExecutor:
    return single_thread_pool("hash")


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


def write_hashed(
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


def write_json_hashed(final: Path, obj: Any, *, sync_dir: bool = True) -> FileRecord:
    """``obj`` as indented JSON through ``write_hashed`` (the step marker, the manifest)."""
    text = (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
    return write_hashed(final, lambda f: f.write(text), sync_dir=sync_dir)


def writer_pool() -> ThreadPoolExecutor:
    """One background writer per process: saves are written in the order they were started."""
    return single_thread_pool("write")
