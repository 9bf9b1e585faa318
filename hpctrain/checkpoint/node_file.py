"""One checkpoint file per node: the rank states of a node's ranks packed together, each readable on its own.

Layout: the members' bytes one after another (each a ``torch.save`` stream, copied as it is), then an index
(JSON: each member's rank, offset, size and digest), then the index's length (8 bytes, little-endian) and a
magic line. Written in one pass (the index comes last); a rank reads the index and its own member only.
Torch-free: the manifest side (checksums, sizes) reads it anywhere. docs/checkpoints.md, "Per-node files".
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"HPCTRAIN-NODE-1\n"
TRAILER = 8 + len(MAGIC)
COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class Member:
    """One rank's state inside a node file."""

    rank: int
    offset: int
    bytes: int
    digest: str


def pack(out: BinaryIO, members: Iterable[tuple[int, Path]], checksum: str) -> list[Member]:
    """Copy each (rank, file) into ``out`` in order, then the index and trailer; returns the members."""
    written: list[Member] = []
    offset = 0
    for rank, path in members:
        digest = hashlib.new(checksum)
        size = 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(COPY_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        written.append(Member(int(rank), offset, size, digest.hexdigest()))
        offset += size
    index = json.dumps({"format": 1, "checksum": checksum,
                        "members": [m.__dict__ for m in written]}, sort_keys=True).encode()
    out.write(index)
    out.write(struct.pack("<Q", len(index)) + MAGIC)
    return written


def read_index(path: Path) -> tuple[str, dict[int, Member]]:
    """(checksum, members by rank) of a node file; ValueError when it is not one or its index is damaged."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size < TRAILER:
            raise ValueError(f"{size} bytes: too short for a node file")
        f.seek(size - TRAILER)
        trailer = f.read(TRAILER)
        if trailer[8:] != MAGIC:
            raise ValueError("no node-file trailer (truncated or not a node file)")
        (length,) = struct.unpack("<Q", trailer[:8])
        if length > size - TRAILER:
            raise ValueError(f"index of {length} bytes does not fit in {size}")
        f.seek(size - TRAILER - length)
        try:
            data: dict[str, Any] = json.loads(f.read(length))
            members = {int(m["rank"]): Member(int(m["rank"]), int(m["offset"]), int(m["bytes"]), str(m["digest"]))
                       for m in data["members"]}
            checksum = str(data["checksum"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"damaged index ({type(e).__name__}: {e})") from None
    for m in members.values():
        if m.offset < 0 or m.bytes < 0 or m.offset + m.bytes > size - TRAILER - length:
            raise ValueError(f"member of rank {m.rank} lies outside the file")
    return checksum, members


def read_member(path: Path, rank: int, verify: bool = True) -> bytes:
    """The bytes of ``rank``'s member (checked against its digest when ``verify``); ValueError if absent or bad."""
    checksum, members = read_index(path)
    member = members.get(rank)
    if member is None:
        raise ValueError(f"holds no state of rank {rank}")
    with open(path, "rb", buffering=0) as f:
        f.seek(member.offset)
        data = f.read(member.bytes)
    if len(data) != member.bytes:
        raise ValueError(f"rank {rank}'s member is cut short")
    if verify and hashlib.new(checksum, data).hexdigest() != member.digest:
        raise ValueError(f"rank {rank}'s member is corrupt")
    return data
