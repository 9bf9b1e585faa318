"""The output of a shell script that marks its sections, split back into them: one round trip to a login node
answers several commands at once (the status poll, the discovery probe). The script prints ``MARK NAME out`` or
``MARK NAME err`` before a command's output or error, ``MARK NAME rc N`` after it, and ``MARK NAME`` alone for a
section of its own (``end``: the script finished).
"""

from __future__ import annotations


def split_marked_sections(stdout: str, mark: str) -> dict[str, dict[str, str]]:
    """``{section: {"out": ..., "err": ..., "rc": "0"}}`` from ``stdout`` marked with ``mark``; a part's text
    without its surrounding blank lines. Text before the first mark, and a mark with no name, belong to no
    section."""
    sections: dict[str, dict[str, str]] = {}
    current: tuple[str, str] | None = None
    buf: list[str] = []

    def flush() -> None:
        if current is not None:
            sections.setdefault(current[0], {})[current[1]] = "\n".join(buf).strip("\n")

    for line in stdout.split("\n"):
        if line.startswith(mark + " "):
            flush()
            buf = []
            words = line[len(mark) + 1:].split()
            current = None
            if len(words) >= 3 and words[1] == "rc":
                sections.setdefault(words[0], {})["rc"] = words[2]
            elif len(words) >= 2:
                current = (words[0], words[1])
            elif words:
                sections.setdefault(words[0], {})
            continue
        buf.append(line)
    flush()
    return sections
