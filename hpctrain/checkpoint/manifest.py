"""What a checkpoint directory holds and which of its checkpoints can be trusted: the manifest, read without torch.

A checkpoint directory has one ``step-NNNNNNNN/`` per checkpoint (``shared.pt``, the rank states — one
``rank-RRRRR.pt`` per rank, or one ``node-RRRRR.pt`` per node named after its first rank — and a
``complete.json`` marker written last) and ``manifest.json`` listing the complete ones. Where every node's file
holds the same number of consecutive ranks (the usual placement), an entry does not list the node files: it
says how many there are, how many ranks each holds and a sum over their indices (``NodeFiles``), so its size
does not grow with the number of nodes. The store
(``checkpoint/store.py``, its commit in ``store_commit.py``) writes them; this module reads them, on a compute
node, in ``ffn segment`` and on the laptop (``hpctrain resume`` reads the manifest over ssh). Layout:
docs/checkpoints.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import CheckpointError
from hpctrain.files import check_regular, read_regular_text, within

FORMAT = "hpctrain-checkpoint"
FORMAT_VERSION = 2  # 2: an entry may describe its node files by ``nodes`` instead of listing them
LISTED_VERSION = 1  # an entry that lists every file is written as version 1: older readers still read it
MANIFEST = "manifest.json"
MARKER = "complete.json"  # per-step copy of the manifest entry; the manifest is rebuilt from these
SHARED = "shared.pt"
DEFAULT_CHECKSUM = "sha256"
STEP_DIR = re.compile(r"step-(\d{8,})")
_FILE_NAME = re.compile(r"shared\.pt|rank-\d{5,}\.pt|node-\d{5,}\.pt")
NODE_FILE = re.compile(r"node-\d{5,}\.pt")
SELF_CHECKED = -1  # FileRecord.bytes of a node file whose record is derived from NodeFiles


def step_dirname(step: int) -> str:
    return f"step-{step:08d}"


def rank_filename(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def node_filename(leader: int) -> str:
    """The per-node file written by the node whose local rank 0 is global rank ``leader``."""
    return f"node-{leader:05d}.pt"


def rank_runs(ranks: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted ranks as runs [start, stop): a node of consecutive ranks is one run however many it holds."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and runs[-1][1] == r:
            runs[-1][1] = r + 1
        else:
            runs.append([r, r + 1])
    return tuple((a, b) for a, b in runs)


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint as the manifest records it."""

    name: str
    bytes: int
    digest: str
    rank: int | None = None  # None for shared.pt and node files
    ranks: tuple[tuple[int, int], ...] = ()  # a node file's ranks, as runs [start, stop)

    @property
    def self_checked(self) -> bool:
        """A node file known from ``NodeFiles``: no size or digest here, its own index checks its members."""
        return self.bytes == SELF_CHECKED

    def holds(self, rank: int) -> bool:
        """Whether this file carries ``rank``'s state (its rank file, or a node file with it among its ranks)."""
        return self.rank == rank or any(a <= rank < b for a, b in self.ranks)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "bytes": self.bytes, "digest": self.digest, "rank": self.rank}
        if self.ranks:
            out["ranks"] = [list(r) for r in self.ranks]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileRecord:
        name = str(d["name"])
        if not _FILE_NAME.fullmatch(name):  # a name like "../x.pt" would read outside the step directory
            raise ValueError(f"file name {name!r} is not a checkpoint file name")
        rank = d.get("rank")
        size = int(d["bytes"])
        if size < 0 or (rank is not None and int(rank) < 0):
            raise ValueError(f"file {name!r} has a negative size or rank")
        runs = tuple((int(a), int(b)) for a, b in d.get("ranks") or ())
        if NODE_FILE.fullmatch(name) and (not runs or any(not 0 <= a < b for a, b in runs)):
            raise ValueError(f"node file {name!r} does not say which ranks it holds")
        return cls(name, size, str(d["digest"]), None if rank is None else int(rank), runs)


INDEX_SUM_WORDS = 8  # the 256-bit index digest as 8 words of 32 bits, each summed over the nodes
_SUM_HEX = 16  # hex digits per summed word in the manifest: fixed width, so the entry's size is fixed too


def index_words(hexdigest: str) -> list[int]:
    """A SHA-256 hex digest as INDEX_SUM_WORDS 32-bit words: the terms of ``NodeFiles.index_sum``."""
    raw = bytes.fromhex(hexdigest)
    if len(raw) != 4 * INDEX_SUM_WORDS:
        raise ValueError(f"index digest of {len(raw)} bytes, expected {4 * INDEX_SUM_WORDS}")
    return [int.from_bytes(raw[4 * i:4 * i + 4], "big") for i in range(INDEX_SUM_WORDS)]


@dataclass(frozen=True)
class NodeFiles:
    """The node files of a checkpoint whose every node file holds ``ranks_per_file`` consecutive ranks, every
    rank's state in one of them: file i is ``node_filename(i * ranks_per_file)``. ``index_sum``: per word, the
    sum over the files of their index digests' 32-bit words (order-free, exact for up to 2^31 files); written as
    one hex string of fixed width."""

    count: int
    ranks_per_file: int
    index_sum: tuple[int, ...]

    def record_for(self, rank: int) -> FileRecord | None:
        """The record of the file that holds ``rank`` (its size and digest are in the file's own index)."""
        first = rank - rank % self.ranks_per_file
        if not 0 <= rank < self.count * self.ranks_per_file:
            return None
        return FileRecord(node_filename(first), SELF_CHECKED, "", None, ((first, first + self.ranks_per_file),))

    def records(self) -> list[FileRecord]:
        return [r for i in range(self.count) if (r := self.record_for(i * self.ranks_per_file)) is not None]

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "ranks_per_file": self.ranks_per_file,
                "index_sum": "".join(f"{w:0{_SUM_HEX}x}" for w in self.index_sum)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeFiles:
        count, per_file, text = int(d["count"]), int(d["ranks_per_file"]), str(d["index_sum"])
        if count < 1 or per_file < 1 or not re.fullmatch(f"[0-9a-f]{{{INDEX_SUM_WORDS * _SUM_HEX}}}", text):
            raise ValueError(f"'nodes' record {d!r} is malformed")
        words = tuple(int(text[i:i + _SUM_HEX], 16) for i in range(0, len(text), _SUM_HEX))
        return cls(count, per_file, words)


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step directory, the world size that wrote it and its files."""

    step: int
    path: Path
    world_size: int
    files: tuple[FileRecord, ...]
    checksum: str
    created: str
    nodes: NodeFiles | None = None  # node files described, not listed in ``files``

    def file(self, name: str) -> FileRecord | None:
        return next((f for f in self.files if f.name == name), None)

    def file_for_rank(self, rank: int) -> FileRecord | None:
        """The file holding ``rank``'s state: its rank file or its node's file (None when it saved none)."""
        if self.nodes is not None:
            return self.nodes.record_for(rank)
        return next((f for f in self.files if f.holds(rank)), None)

    def all_files(self) -> list[FileRecord]:
        """Every file, the listed ones and those ``nodes`` describes."""
        return [*self.files, *(self.nodes.records() if self.nodes is not None else ())]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "dir": self.path.name,
            "world_size": self.world_size,
            "format_version": LISTED_VERSION if self.nodes is None else FORMAT_VERSION,
            "checksum": self.checksum,
            "created": self.created,
            "files": [f.to_json() for f in self.files],
        }
        if self.nodes is not None:
            out["nodes"] = self.nodes.to_json()
        return out

    @classmethod
    def from_json(cls, root: Path, d: dict[str, Any]) -> Checkpoint:
        """An entry of the manifest (or a marker); ValueError when it is malformed or points elsewhere.

        The step directory must be this step's own directory inside ``root``: an entry is never allowed to
        name a directory outside the checkpoint directory or another step's.
        """
        if int(d.get("format_version", -1)) > FORMAT_VERSION:
            raise ValueError(f"format version {d['format_version']} is newer than this hpctrain reads")
        step = int(d["step"])
        if step < 0:
            raise ValueError(f"step {step} is negative")
        directory = str(d["dir"])
        if directory != step_dirname(step):
            raise ValueError(f"step {step} names directory {directory!r}, not its own {step_dirname(step)!r}")
        world_size = int(d["world_size"])
        if world_size < 1:
            raise ValueError(f"step {step} has world size {world_size}")
        if not isinstance(d["files"], list):
            raise ValueError(f"step {step}: 'files' is not a list")
        nodes = None if d.get("nodes") is None else NodeFiles.from_json(d["nodes"])
        if nodes is not None and nodes.count * nodes.ranks_per_file != world_size:
            raise ValueError(f"step {step}: {nodes.count} node files of {nodes.ranks_per_file} ranks do not hold "
                             f"its {world_size} ranks")
        return cls(
            step=step,
            path=root / directory,
            world_size=world_size,
            files=tuple(FileRecord.from_json(f) for f in d["files"]),
            checksum=str(d["checksum"]),
            created=str(d["created"]),
            nodes=nodes,
        )


def checksum_known(name: str) -> bool:
    """True for a hash this Python has with a fixed-length digest (``shake_128`` needs a length: refused)."""
    try:
        hashlib.new(name).hexdigest()
    except (ValueError, TypeError):
        return False
    return True


# What a malformed entry raises besides ValueError: a missing key, a wrong type, ``Infinity`` given to
# int(), or JSON nested past the recursion limit. Readers turn all of them into "unreadable".
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError)


def load_entry(root: Path, text: str) -> Checkpoint:
    """A marker's (or one entry's) JSON text as a Checkpoint; ValueError for anything malformed."""
    try:
        return Checkpoint.from_json(root, json.loads(text))
    except _MALFORMED as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


def file_digest(path: Path, checksum: str) -> tuple[int, str]:
    """(size, hex digest) of a file, read in 8 MiB chunks."""
    h = hashlib.new(checksum)
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


def parse_manifest(text: str, root: Path) -> list[Checkpoint]:
    """The checkpoints a manifest's text lists, by increasing step; ValueError (only) when it is not a
    manifest or an entry is malformed or points outside its own step directory."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} manifest")
        entries = data["checkpoints"]
        if not isinstance(entries, list):
            raise ValueError("'checkpoints' is not a list")
        return sorted((Checkpoint.from_json(root, d) for d in entries), key=lambda c: c.step)
    except ValueError:
        raise
    except _MALFORMED as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


def _markers(directory: Path, skip: frozenset[str] = frozenset()) -> Iterator[tuple[Path, Checkpoint | None, str]]:
    """Every step directory (but those named in ``skip``) with its marker's checkpoint (None and why, when the
    marker is unusable)."""
    if not directory.is_dir():
        return
    for child in sorted(directory.iterdir()):
        if not STEP_DIR.fullmatch(child.name) or child.name in skip or not child.is_dir():
            continue
        try:
            ckpt = load_entry(directory, read_regular_text(child / MARKER))
        except FileNotFoundError:
            yield child, None, f"{child.name} has no {MARKER} (its save did not finish)"
            continue
        except (OSError, ValueError) as e:
            yield child, None, f"{child.name}/{MARKER} is unreadable ({e})"
            continue
        if ckpt.path.name != child.name:
            yield child, None, f"{child.name}/{MARKER} describes {ckpt.path.name}"
            continue
        yield child, ckpt, ""


def _with_unlisted(directory: Path, listed: list[Checkpoint]) -> tuple[list[Checkpoint], list[str]]:
    """The manifest's checkpoints and those whose markers show them complete although it does not name them (an
    emptied or stale manifest, a save whose marker was written and whose manifest was not), with what was added.
    Only the unlisted step directories' markers are read; one without a marker is a save still being written or
    an interrupted one, and is left out without a word, as the manifest leaves it out."""
    found = [c for _, c, _ in _markers(directory, frozenset(c.path.name for c in listed)) if c is not None]
    if not found:
        return listed, []
    merged = sorted([*listed, *found], key=lambda c: c.step)
    steps = ", ".join(str(c.step) for c in found)
    return merged, [f"manifest {directory / MANIFEST} names {len(listed)} checkpoint(s) but not step(s) {steps}, "
                    f"which their {MARKER} markers show complete; added from the markers"]


def read_entries(directory: Path) -> tuple[list[Checkpoint], list[str]]:
    """(complete checkpoints by increasing step, problems worth a warning) of a checkpoint directory.

    From the manifest and the markers of the step directories it does not name; when it is missing or unreadable,
    rebuilt from the step directories' markers, and every step directory that could not be used is named in the
    problems (a fresh directory has none).
    """
    path = directory / MANIFEST
    try:
        listed = parse_manifest(read_regular_text(path), directory)
    except FileNotFoundError:
        problem = f"manifest {path} is missing"
    except (OSError, ValueError) as e:
        problem = f"manifest {path} is unreadable ({e})"
    else:
        return _with_unlisted(directory, listed)
    found = list(_markers(directory))
    if not found:
        return [], []
    rebuilt = sorted((c for _, c, _ in found if c is not None), key=lambda c: c.step)
    skipped = [why for _, c, why in found if c is None]
    return rebuilt, [f"{problem}; rebuilt from {MARKER} markers", *(f"skipped {why}" for why in skipped)]


def file_problem(ckpt: Checkpoint, names: Iterable[str], verify: bool) -> str | None:
    """Why the files ``names`` of ``ckpt`` cannot be used (missing, truncated, corrupt), or None."""
    if verify and not checksum_known(ckpt.checksum):
        return (f"step {ckpt.step} uses checksum {ckpt.checksum!r}, which this Python's hashlib does not know: "
                "its files cannot be verified")
    for name in names:
        rec = ckpt.file(name)
        path = ckpt.path / name
        if rec is None:
            return f"{path} is not recorded in the manifest"
        if not within(path, ckpt.path.parent):
            return f"{path} leads outside the checkpoint directory through a symbolic link"
        try:
            size = check_regular(path).st_size
        except OSError as e:
            return f"{path} cannot be read: {e.strerror or e}"
        if size != rec.bytes:
            return f"{path} is truncated or wrong: {size} bytes, the manifest says {rec.bytes}"
        if verify:
            try:
                _, digest = file_digest(path, ckpt.checksum)
            except OSError as e:
                return f"{path} cannot be read: {e.strerror or e}"
            if digest != rec.digest:
                return f"{path} is corrupt: {ckpt.checksum} {digest[:12]}…, the manifest says {rec.digest[:12]}…"
    return None


def newest_shared_file(directory: str | Path, verify: bool = True) -> tuple[Path, list[str]]:
    """The shared file (model, step, model_args) of the newest checkpoint whose shared file checks out, and
    the problems met on the way (skipped steps, a rebuilt manifest); CheckpointError when there is none.

    For single-process readers (``hpctrain ffn segment``): only ``shared.pt`` is needed and checked.
    """
    directory = Path(directory)
    entries, problems = read_entries(directory)
    for ckpt in reversed(entries):
        bad = file_problem(ckpt, [SHARED], verify)
        if bad is None:
            return ckpt.path / SHARED, problems
        problems.append(f"step {ckpt.step} skipped: {bad}")
    detail = "; ".join(problems) if problems else f"neither {MANIFEST} nor a step directory's {MARKER} names one"
    raise CheckpointError(f"no valid checkpoint in {directory}: {detail}",
                          hint="pass a checkpoint directory that training wrote, or its step-*/shared.pt file")


def newest_step(text: str, root: Path | str = ".") -> int | None:
    """The newest step a manifest's text lists (None for an empty list); ValueError when it is unreadable."""
    entries = parse_manifest(text, Path(root))
    return entries[-1].step if entries else None

