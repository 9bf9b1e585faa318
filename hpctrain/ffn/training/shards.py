"""Each rank reads only its own share of the training coordinates per epoch: input O(K/N) per rank, not O(K).

Rank 0 writes the coordinates once as a coordinate table (``coordinates-table-<hash>.npy`` beside the prepared
data: a raw (K, 3) int64 .npy, shuffled once so that any stretch of it is a random sample) and names it in the
prepared data's manifest, which every rank reads. Per epoch the table
is cut into chunks after a seeded rotation, the chunks are dealt by a seeded permutation evaluated at this rank's
slots only (models/shuffle.py), and the rank reads its K // N coordinates as a few contiguous ranges at their
offsets (``os.pread``), then shuffles them among themselves. Layout and reasoning: docs/scaling.md, "Input".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hpctrain.errors import DataError
from hpctrain.ffn.training.coordinates import read_coordinates
from hpctrain.files import write_atomic
from hpctrain.models.shuffle import IndexPermutation, derive_key
from hpctrain.runtime.counting import work_counts

RECORD = 3 * 8  # one (z, y, x) int64 coordinate
MAX_CHUNK = 4096  # coordinates per contiguous read (96 KiB): a few large reads, not one per coordinate
MIN_CHUNKS_PER_RANK = 8  # a rank's epoch draws on at least this many random stretches of the table
ONCE_SEED = 0x5EED  # the one shuffle of the table: fixed, so the table does not depend on train.seed


def table_path(coordinates: str | os.PathLike[str], out_dir: Path) -> Path:
    """Where the table of ``coordinates`` goes: named after the source's path, size and time, so a changed
    source gets a new table instead of a stale one."""
    source = Path(coordinates).resolve()
    stat = source.stat()
    key = hashlib.sha256(f"{source}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return out_dir / f"coordinates-table-{key}.npy"


def write_table(coordinates: str | os.PathLike[str], out_dir: Path) -> Path:
    """Rank 0, once: the coordinates as a shuffled table (atomic; reused when it exists). Returns its path."""
    path = table_path(coordinates, out_dir)
    if path.exists():
        return path
    coords = read_coordinates(coordinates)
    order = np.random.default_rng(ONCE_SEED).permutation(len(coords))
    write_atomic(path, lambda f: np.save(f, np.ascontiguousarray(coords[order], dtype="<i8")))
    return path


class CoordinateTable:
    """A coordinate table read at offsets: ``count`` coordinates, ``read(start, stop)`` -> (stop - start, 3)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise DataError(f"coordinate table {self.path} cannot be opened: {e.strerror or e}",
                            hint="it is written by rank 0 before training; check the run's data directory") from e
        with os.fdopen(os.dup(self._fd), "rb", buffering=0) as f:  # unbuffered: the header's bytes only
            try:
                version = np.lib.format.read_magic(f)
                header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)(f)
            except ValueError as e:
                raise DataError(f"{self.path} is not a coordinate table ({e})") from e
            shape, fortran, dtype = header
            self._offset = f.tell()
        if len(shape) != 2 or shape[1] != 3 or fortran or dtype != np.dtype("<i8"):
            raise DataError(f"{self.path}: shape {shape} dtype {dtype}; a coordinate table is (K, 3) int64, C order")
        self.count = int(shape[0])
        counts = work_counts.active()
        if counts is not None:
            counts.add_input("coordinates", self._offset)

    def read(self, start: int, stop: int, epoch: int | None = None) -> np.ndarray:
        """Coordinates ``start`` .. ``stop`` in one read (counted as this rank's input of ``epoch``)."""
        want = (stop - start) * RECORD
        data = os.pread(self._fd, want, self._offset + start * RECORD)
        if len(data) != want:
            raise DataError(f"{self.path} is truncated: {len(data)} of {want} bytes at coordinate {start}")
        counts = work_counts.active()
        if counts is not None:
            counts.add_input("coordinates", want, epoch=epoch)
        return np.frombuffer(data, dtype="<i8").reshape(-1, 3).astype(np.int64)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


def chunk_size(count: int, world: int) -> int:
    """Coordinates per chunk: at most MAX_CHUNK, and small enough that a rank's share spans MIN_CHUNKS_PER_RANK."""
    return max(1, min(MAX_CHUNK, count // (world * MIN_CHUNKS_PER_RANK)))


def rank_ranges(count: int, world: int, rank: int, seed: int, epoch: int) -> list[tuple[int, int]]:
    """The table ranges [start, stop) holding ``rank``'s K // N coordinates of ``epoch``, in the order dealt.

    The epoch's order: the table rotated by a seeded offset, cut into chunks of ``chunk_size``; the full chunks
    in a seeded permuted order, then the short one. Rank r takes positions [r P, (r + 1) P) of that order, so
    the ranks' shares are disjoint and the K mod N left over move with the rotation from epoch to epoch.
    """
    per_rank = count // world
    if per_rank == 0:
        raise DataError(f"{count} training coordinates cannot be shared by {world} ranks",
                        hint="build more coordinates or use fewer ranks")
    c = chunk_size(count, world)
    full = count // c
    rotation = derive_key(seed, epoch, 1) % count
    deal = IndexPermutation(full, derive_key(seed, epoch, 2)) if full else None
    first, last = rank * per_rank, (rank + 1) * per_rank
    slots = np.arange(first // c, (last - 1) // c + 1)
    chunks = deal[slots[slots < full]] if deal is not None else np.zeros(0, dtype=np.int64)
    ranges: list[tuple[int, int]] = []
    for i, slot in enumerate(slots):
        lo, hi = max(first, int(slot) * c), min(last, (int(slot) + 1) * c)  # positions in the epoch's order
        base = int(chunks[i]) * c if slot < full else full * c  # the short chunk sits last
        start = (base + lo - int(slot) * c + rotation) % count
        length = hi - lo
        if start + length <= count:
            ranges.append((start, start + length))
        else:  # the rotation wraps around the end of the table
            ranges += [(start, count), (0, start + length - count)]
    return ranges


def epoch_share(table: CoordinateTable, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
    """``rank``'s coordinates of ``epoch`` (K // N of them), read from the table and shuffled among themselves."""
    parts = [table.read(a, b, epoch) for a, b in rank_ranges(table.count, world, rank, seed, epoch)]
    share = np.concatenate(parts)
    return share[np.random.default_rng([seed, epoch, rank, world]).permutation(len(share))]


def coordinate_stream(table: CoordinateTable, rank: int, world: int, seed: int = 0, start: int = 0
                      ) -> Iterator[np.ndarray]:
    """Endless stream of this rank's coordinates, epoch after epoch; ``start`` skips that many already consumed
    (resume after a checkpoint). Only one epoch's share is in memory at a time."""
    per_rank = table.count // max(world, 1)
    epoch, skip = divmod(start, per_rank) if per_rank else (0, 0)
    while True:
        yield from epoch_share(table, world, rank, seed, epoch)[skip:]
        skip = 0
        epoch += 1
