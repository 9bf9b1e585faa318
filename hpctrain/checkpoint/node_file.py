"""One checkpoint file per node: the rank states of a node's ranks packed together, each readable on its own.

Layout: the members' bytes one after another (each a ``torch.save`` stream, copied as it is), then an index
(JSON: the step, each member's rank, offset, size and digest), then the index's length (8 bytes, little-endian)
and a magic line. Written in one pass (the index comes last); a rank reads the index and its own member only.
The file verifies itself (a member against its digest in the index); the index's own SHA-256 is what the
checkpoint's top-level record sums over all nodes (``index_sum``).
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


INDEX_HASH = "sha256"


@dataclass(frozen=True)
class Member:
    """One rank's state inside a node file."""

    rank: int
    offset: int
    bytes: int
    digest: str


@dataclass(frozen=True)
class NodeIndex:
    """A node file's index: the members by rank, the hash they use, the step (None before steps were recorded)
    and the SHA-256 of the index's bytes."""

    checksum: str
    members: dict[int, Member]
    step: int | None
    digest: str


def pack(out: BinaryIO, members: Iterable[tuple[int, Path]], checksum: str, step: int | None = None) -> NodeIndex:
    """Copy each (rank, file) into ``out`` in order, then the index and trailer; returns the index."""
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
    head: dict[str, Any] = {"format": 1, "checksum": checksum, "members": [m.__dict__ for m in written]}
    if step is not None:
        head["step"] = step
    index = json.dumps(head, sort_keys=True).encode()
    out.write(index)
    out.write(struct.pack("<Q", len(index)) + MAGIC)
    return NodeIndex(checksum, {m.rank: m for m in written}, step, hashlib.new(INDEX_HASH, index).hexdigest())


def read_node_index(path: Path) -> NodeIndex:
    """A node file's whole index; ValueError when it is not one or its index is damaged."""
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
        raw = f.read(length)
        try:
            data: dict[str, Any] = json.loads(raw)
            members = {int(m["rank"]): Member(int(m["rank"]), int(m["offset"]), int(m["bytes"]), str(m["digest"]))
                       for m in data["members"]}
            checksum = str(data["checksum"])
            step = None if data.get("step") is None else int(data["step"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"damaged index ({type(e).__name__}: {e})") from None
    for m in members.values():
        if m.offset < 0 or m.bytes < 0 or m.offset + m.bytes > size - TRAILER - length:
            raise ValueError(f"member of rank {m.rank} lies outside the file")
    return NodeIndex(checksum, members, step, hashlib.new(INDEX_HASH, raw).hexdigest())


def read_member(path: Path, rank: int, verify: bool = True, index: NodeIndex | None = None) -> bytes:
    """The bytes of ``rank``'s member (checked against its digest when ``verify``); ValueError if absent or bad.
    ``index``: the file's index when the caller has read it already."""
    index = read_node_index(path) if index is None else index
    checksum, members = index.checksum, index.members
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
