"""Opening the files hpctrain reads (job specs, profiles, manifests, checkpoints, the registry) only when they
are regular files, and writing the files it keeps whole or not at all (``write_atomic``).

A FIFO blocks ``open`` until a writer comes; a device reads forever or has effects of its own. Both are
refused before any byte is read: the path is checked with ``stat`` first (a device is never opened), then
opened non-blocking and checked again on the open descriptor (the path cannot be swapped in between).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class NotRegularFile(OSError):
    """The path exists but is not a regular file (an OSError: callers that report OSErrors report this too)."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"is {kind}, not a regular file", str(path))
        self.kind = kind


def kind_of(mode: int) -> str:
    """What a ``st_mode`` describes, in words."""
    return next((text for test, text in _KINDS if test(mode)), "not a regular file")


def check_regular(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> os.stat_result:
    """``stat`` of a regular file; NotRegularFile for anything else, FileNotFoundError when it is missing."""
    st = os.stat(path, follow_symlinks=follow_symlinks)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, kind_of(st.st_mode))
    return st


def open_regular(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file."""
    check_regular(path, follow_symlinks=follow_symlinks)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, kind_of(st.st_mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path: str | os.PathLike[str], limit: int | None = None, *,
                       follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file (at most ``limit`` + 1 of them when a limit is given, to tell "too big")."""
    with open_regular(path, follow_symlinks=follow_symlinks) as f:
        return f.read() if limit is None else f.read(limit + 1)


def read_regular_text(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> str:
    """A regular file's UTF-8 text (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_regular_bytes(path, follow_symlinks=follow_symlinks).decode("utf-8")


def within(path: Path, root: Path) -> bool:
    """Whether ``path``, every symbolic link resolved, lies inside ``root`` (resolved too)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def temp_name(final: Path) -> Path:
    """The name a file is written under before it is renamed to ``final`` (hidden, one per process)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], content: bytes | str | Callable[[BinaryIO], object], *,
                 mode: int | None = None, sync_dir: bool = False) -> None:
    """Write ``path`` whole or not at all: into a temporary name beside it, fsync, rename (a reader never sees
    half a file, a crash leaves the old file or none).

    ``content`` is the bytes, UTF-8 text, or a callable that writes to the open binary file. ``mode`` sets the
    file's permission bits; ``sync_dir`` fsyncs the directory too, so that the rename itself survives a crash.
    On any failure the temporary file is removed, ``path`` is untouched and the error is raised.
    """
    final = Path(path)
    tmp = temp_name(final)
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(final.parent)
