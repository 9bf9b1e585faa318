"""Opening the files hpctrain reads (job specs, profiles, manifests, checkpoints, the registry) only when they
are regular files, and writing the files it keeps whole or not at all: ``atomic_path`` (the one rule: a temporary
name beside the file, fsync, rename) and ``write_atomic`` (bytes, text or a writer through it).

A FIFO blocks ``open`` until a writer comes; a device reads forever or has effects of its own. Both are
refused before any byte is read: the path is checked with ``stat`` first (a device is never opened), then
opened non-blocking and checked again on the open descriptor (the path cannot be swapped in between).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


PATH_MAX = 4096  # Linux: the longest path a system call takes, its closing NUL included
NAME_MAX = 255  # the longest name of one directory entry on the usual file systems (ext4, xfs, Lustre, GPFS)


def path_too_long(path: str | os.PathLike[str]) -> str | None:
    """Why the OS refuses ``path`` for its length (ENAMETOOLONG), said without repeating it; None when it may
    be used."""
    raw = os.fsencode(path)
    if len(raw) >= PATH_MAX:
        return f"a path of {len(raw)} bytes is longer than the {PATH_MAX - 1} the system takes"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"the path has a name of {longest} bytes, longer than the {NAME_MAX} a file name may have"
    return None


def within(path: Path, root: Path) -> bool:
    """Whether ``path``, every symbolic link resolved, lies inside ``root`` (resolved too)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def temp_name(final: Path) -> Path:
    """A fresh name to write a file under before it is renamed to ``final``: hidden, beside it, unique (ranks on
    different nodes may share a pid), and ending in no suffix a reader's pattern (``*.h5``, ``*.yaml``) matches."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Make a written file's content durable (by its path: for writers that closed it themselves)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames inside directory ``path`` durable (a directory is fsynced through a read-only descriptor,
    as a file is)."""
    fsync_file(path)


def _publish(tmp: Path, final: Path, exclusive: bool) -> None:
    if not exclusive:
        os.replace(tmp, final)
        return
    try:
        os.link(tmp, final)  # refuses an existing name atomically: a file made meanwhile is not replaced either
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if final.exists():  # a file system without hard links: check, then rename (a race window only there)
            raise FileExistsError(errno.EEXIST, "file exists", str(final)) from None
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(dest: str | os.PathLike[str], *, durable: bool = True, sync_dir: bool = False,
                mode: int | None = None, exclusive: bool = False) -> Iterator[Path]:
    """A temporary path beside ``dest`` for a writer that needs a path (HDF5, ``savefig``, ``torch.save``, a
    download, a compiler's ``-o``); when the block ends without an exception it becomes ``dest`` whole (a reader
    never sees half a file), on any exception it is removed and ``dest`` is untouched.

    ``durable`` fsyncs the file before the rename, so that a crash leaves the old file or the new one, never an
    empty one; ``sync_dir`` fsyncs the directory after it, so that the rename itself survives a crash. ``mode``
    sets the file's permission bits. ``exclusive`` never replaces an existing ``dest``: FileExistsError instead.
    """
    final = Path(dest)
    tmp = temp_name(final)
    try:
        yield tmp
        if mode is not None:
            tmp.chmod(mode)
        if durable:
            fsync_file(tmp)
        _publish(tmp, final, exclusive)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(final.parent)


def write_atomic(path: str | os.PathLike[str], content: bytes | str | Callable[[BinaryIO], object], *,
                 mode: int | None = None, sync_dir: bool = False, durable: bool = True) -> None:
    """Write ``path`` whole or not at all through ``atomic_path`` (its ``durable``, ``sync_dir`` and ``mode``).

    ``content`` is the bytes, UTF-8 text, or a callable that writes to the open binary file. On any failure the
    temporary file is removed, ``path`` is untouched and the error is raised.
    """
    # The file is fsynced through the descriptor that wrote it, not reopened by its path: one open per file.
    with atomic_path(path, durable=False, sync_dir=sync_dir, mode=mode) as tmp, open(tmp, "wb") as f:
        if callable(content):
            content(f)
        else:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
        if durable:
            f.flush()
            os.fsync(f.fileno())
