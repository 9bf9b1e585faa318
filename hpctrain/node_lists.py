"""Host lists as schedulers write them: Slurm's compressed hostlist syntax and a node file of one host per line.
Pure Python (read on every rank)."""

from __future__ import annotations

import re
from pathlib import Path


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """``nid[001-003,007],login1`` -> ``['nid001', 'nid002', 'nid003', 'nid007', 'login1']``.

    Handles zero padding, several bracket groups in one name (``r[1-2]n[01-02]``) and comma lists.
    """
    names: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        if item:
            names += _expand_one(item)
    return names


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    out: list[str] = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad range {rng!r} in node list {item!r}")
        width = len(lo)
        rests = _expand_one(tail)
        for n in range(int(lo), int(hi or lo) + 1):
            out += [head + str(n).zfill(width) + rest for rest in rests]
    return out


def read_pbs_nodefile(path: str | Path) -> list[str]:
    """Unique host names of a PBS node file, in first-seen order (PBS lists a host once per rank/cpu)."""
    seen: dict[str, None] = {}
    for line in Path(path).read_text().splitlines():
        host = line.strip()
        if host and not host.startswith("#"):
            seen.setdefault(host, None)
    return list(seen)
