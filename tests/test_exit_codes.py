"""The exit-code table: one definition (hpctrain/exit_codes.py), printed verbatim in docs/submitting.md, and
every error class mapped onto it."""

from __future__ import annotations

import re
from pathlib import Path

from hpctrain import errors, exit_codes

DOC = Path(__file__).resolve().parent.parent / "docs" / "submitting.md"


def test_docs_table_is_the_generated_one() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1]
    table = "\n".join(ln for ln in section.strip().splitlines() if ln.startswith("|")) + "\n"
    assert table == exit_codes.markdown_table(), (
        "docs/submitting.md's exit-code table differs from hpctrain/exit_codes.py; paste the output of\n"
        "python -c 'from hpctrain.exit_codes import markdown_table; print(markdown_table(), end=\"\")'")


def test_every_code_is_explained_once_and_every_error_uses_one() -> None:
    codes = {v for k, v in vars(exit_codes).items() if re.fullmatch(r"EXIT_[A-Z]+", k)}
    explained = [code for code, _ in exit_codes.MEANINGS]
    assert sorted(explained) == sorted(codes) and len(set(explained)) == len(explained)
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.HpctrainError)]
    assert {c.exit_code for c in classes} <= codes
    assert errors.UnknownRun.exit_code == errors.ConfigError.exit_code  # a RUN argument is a command-line value
