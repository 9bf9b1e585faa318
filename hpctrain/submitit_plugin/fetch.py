"""Copy files from a run directory to the laptop on demand: many files in ONE command, whatever the transport.

No file system is assumed to be shared between the laptop and the machine: results and logs come back over
the transport (the login node's shell, or ssh through its ControlMaster). Small files come base64-encoded in
one command's output; a file larger than ``inline_bytes`` is copied by itself with ``Transport.get``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from pathlib import Path

from hpctrain.errors import TransportError
from hpctrain.files import atomic_path, write_atomic
from hpctrain.submission.transport import Transport, run_script

FETCH_TIMEOUT_S = 120.0
INLINE_BYTES = 8 * 1024 * 1024
_MARK = "@@hpctrain-file"
_END = "@@hpctrain-end"
# For each existing file: a header with its index and size, then its bytes in base64 (when small enough).
_SCRIPT = (f'lim=$1; shift; i=0; for f do if [ -f "$f" ]; then s=$(wc -c < "$f") || exit 1; '
           f'printf "{_MARK} %s %s\\n" "$i" "$s"; if [ "$s" -le "$lim" ]; then base64 < "$f" || exit 1; fi; fi; '
           f'i=$((i + 1)); done; echo "{_END}"')


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def fetch_files(transport: Transport, files: Sequence[tuple[str, Path]], *, exact: bool = True,
                inline_bytes: int = INLINE_BYTES, timeout: float = FETCH_TIMEOUT_S) -> set[Path]:
    """Copy each existing remote file of ``files`` (remote path, local path); the local paths written.

    ``exact``: a file must arrive with the size it had when listed (results are renamed into place whole);
    logs grow while they are read, so for them what was read is kept.
    """
    if not files:
        return set()
    done = run_script(transport, _SCRIPT, [str(inline_bytes), *(remote for remote, _ in files)], timeout=timeout)
    if _END not in done.stdout:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TransportError(f"reading {len(files)} file(s) of the run directory on {transport.host} failed: {detail}")
    written: set[Path] = set()
    large: list[tuple[str, Path]] = []
    header: tuple[int, int] | None = None
    chunks: list[str] = []

    def finish() -> None:
        if header is None:
            return
        index, size = header
        remote, local = files[index]
        if size > inline_bytes:
            large.append((remote, local))
            return
        try:
            data = base64.b64decode("".join(chunks), validate=True)
        except (binascii.Error, ValueError):
            raise TransportError(f"{remote} on {transport.host} came back garbled") from None
        if exact and len(data) != size:
            raise TransportError(f"{remote} on {transport.host} changed while it was read "
                                 f"({len(data)} of {size} bytes)")
        _write_atomic(local, data)
        written.add(local)

    for line in done.stdout.splitlines():
        if line.startswith(_MARK + " ") or line == _END:
            finish()
            chunks = []
            words = line.split()
            header = (int(words[1]), int(words[2])) if line != _END else None
            continue
        if header is not None:
            chunks.append(line.strip())
    for remote, local in large:
        local.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(local) as tmp:
            transport.get(remote, tmp)
        written.add(local)
    return written
