"""The nodes a run blames: one JSON line per blamed node in ``RUN_DIR/blamed-nodes.jsonl``, appended by whoever
learns it (the node check, the launcher's report of a killed rank, the previous attempt's lost node, the straggler
watch on rank 0) and read by the next attempt, ``status``, ``resume`` and the report.

A line is ``{"node": "node03", "kind": "failed"|"slow", "cause": "...", "ranks": [2, 3], "source": "check",
"job": "123", "restart": 0, "time": 1764450000.0}``. ``failed`` nodes are left out of every later attempt of the
run; ``slow`` ones (stragglers) where a spare node can take their place. Each line is one ``write`` of less than
PIPE_BUF bytes on a file opened for appending, so concurrent writers never interleave within a line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BLAME_FILE = "blamed-nodes.jsonl"
KINDS = ("failed", "slow")
SOURCES = ("check", "launcher", "scheduler", "straggler", "person")
MAX_LINE = 3500  # below PIPE_BUF (4096): one write, never interleaved
MAX_CAUSE = 300
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


@dataclass(frozen=True)
class Blame:
    """One node blamed for one reason, by one source, in one attempt (job id and restart count)."""

    node: str
    cause: str
    kind: str = "failed"
    ranks: tuple[int, ...] = ()
    source: str = "check"
    job: str = ""
    restart: int = 0
    time: float = field(default_factory=time.time)

    def to_json(self) -> str:
        data = asdict(self)
        data["ranks"] = list(self.ranks)
        data["cause"] = _one_line(self.cause)
        text = json.dumps(data, separators=(",", ":"))
        while len(text.encode()) > MAX_LINE and data["ranks"]:  # thousands of ranks on a node: keep the first
            data["ranks"] = data["ranks"][: len(data["ranks"]) // 2]
            text = json.dumps(data, separators=(",", ":"))
        return text

    @property
    def where(self) -> str:
        """``node03 (ranks 2-3)``: the node and its ranks, as messages name them."""
        return self.node + (f" ({rank_text(self.ranks)})" if self.ranks else "")


def _one_line(text: str) -> str:
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= MAX_CAUSE else line[: MAX_CAUSE - 3] + "..."


def rank_text(ranks: Sequence[int]) -> str:
    """``rank 3`` / ``ranks 0-3`` / ``ranks 0, 2, 5``."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def append_blames(run_dir: str | os.PathLike[str], blames: Iterable[Blame]) -> None:
    """Append ``blames`` to the run's file, one line per write (O_APPEND)."""
    lines = [b.to_json() + "\n" for b in blames]
    if not lines:
        return
    fd = os.open(Path(run_dir) / BLAME_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        for line in lines:
            os.write(fd, line.encode())
    finally:
        os.close(fd)


def parse_blames(text: str) -> list[Blame]:
    """The blames in ``text`` (the file's lines); a line that is not one (cut, foreign) is skipped."""
    out: list[Blame] = []
    for line in text.splitlines():
        try:
            data: Any = json.loads(line)
            blame = Blame(node=str(data["node"]), cause=str(data.get("cause", "")),
                          kind=str(data.get("kind", "failed")), ranks=tuple(int(r) for r in data.get("ranks", ())),
                          source=str(data.get("source", "")), job=str(data.get("job", "")),
                          restart=int(data.get("restart", 0)), time=float(data.get("time", 0.0)))
        except (ValueError, KeyError, TypeError):
            continue
        if blame.node and blame.kind in KINDS:
            out.append(blame)
    return out


def read_blames(run_dir: str | os.PathLike[str]) -> list[Blame]:
    """Every blame the run's file holds (none when there is no file)."""
    try:
        return parse_blames((Path(run_dir) / BLAME_FILE).read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return []


def nodes_to_leave_out(blames: Iterable[Blame], *, spares: bool) -> dict[str, Blame]:
    """node -> the blame that leaves it out of the next attempt: every failed node; slow ones only where a spare
    node can take their place. The first blame of a node names it."""
    out: dict[str, Blame] = {}
    for blame in blames:
        if blame.kind == "failed" or spares:
            out.setdefault(blame.node, blame)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpctrain.nodes.blame --run-dir DIR [--spares]``: the nodes the next attempt leaves out,
    comma-separated (the batch script hands them to the scheduler's exclusion when it requeues the job)."""
    parser = argparse.ArgumentParser(prog="python -m hpctrain.nodes.blame", description=main.__doc__)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--spares", action="store_true", help="the job has spare nodes: leave stragglers out too")
    args = parser.parse_args(argv)
    nodes = [n for n in nodes_to_leave_out(read_blames(args.run_dir), spares=args.spares) if HOST_NAME.fullmatch(n)]
    print(",".join(nodes))  # host names only: the script hands them to the scheduler's own command language
    return 0


if __name__ == "__main__":
    sys.exit(main())
