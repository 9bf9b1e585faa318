"""Warnings that name the user's line: the first frame outside hpctrain (and any other package given), not the
line inside hpctrain that issued them, so a notebook's ``hpctrain.submit(...)`` warns at that call.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence

PACKAGE_DIR = os.path.dirname(__file__) + os.sep  # as the interpreter names this package's files in frames


def stacklevel_outside(prefixes: Sequence[str] = (PACKAGE_DIR,), skip: int = 1) -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` name the first frame whose file lies outside ``prefixes``;
    ``skip``: how many frames above this one the function that calls ``warnings.warn`` is (1: the caller)."""
    level, frame = 1, sys._getframe(skip)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(tuple(prefixes)):
        frame, level = frame.f_back, level + 1
    return level


def warn_outside(message: str, category: type[Warning], prefixes: Sequence[str] = (PACKAGE_DIR,)) -> None:
    """``warnings.warn`` at the first frame outside ``prefixes`` (hpctrain's own files by default)."""
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=tuple(prefixes))
    else:
        warnings.warn(message, category, stacklevel=stacklevel_outside(prefixes))
