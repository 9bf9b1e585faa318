"""The one reader of marked script output, shared by the status poll and the discovery probe."""

from __future__ import annotations

from hpctrain.submission.discovery.probe import MARK, probe_sections
from hpctrain.submission.marked_sections import split_marked_sections
from hpctrain.submission.tracking import POLL_MARK


def test_parts_rc_and_bare_sections_are_told_apart() -> None:
    text = (f"before any mark\n{POLL_MARK} a out\n\nline 1\nline 2\n\n{POLL_MARK} a err\noops\n{POLL_MARK} a rc 3\n"
            f"{POLL_MARK} b out\n{POLL_MARK} end\n")
    assert split_marked_sections(text, POLL_MARK) == {"a": {"out": "line 1\nline 2", "err": "oops", "rc": "3"},
                                                      "b": {"out": ""}, "end": {}}


def test_a_mark_without_a_name_is_no_section() -> None:
    """The status poll once kept it as a section named ''; the probe never did: one rule for both now."""
    text = f"{POLL_MARK} a out\nx\n{POLL_MARK} \nstray\n{POLL_MARK} end\n"
    assert split_marked_sections(text, POLL_MARK) == {"a": {"out": "x"}, "end": {}}


def test_another_scripts_mark_is_text() -> None:
    text = f"{MARK} a out\n{POLL_MARK} b out\n{MARK} a rc 0\n{MARK} end\n"
    assert split_marked_sections(text, MARK) == {"a": {"out": f"{POLL_MARK} b out", "rc": "0"}, "end": {}}
    assert probe_sections(text)["a"].out == f"{POLL_MARK} b out" and probe_sections(text)["a"].rc == 0
