"""The names ``train.precision`` and the FFN's inference ``precision`` accept (one list for the schemas, the command
line and the runtime; plain typing, so the CLI can import it without pydantic or torch). What each means:
``hpctrain/runtime/precision.py``."""

from __future__ import annotations

from typing import Literal, get_args

PrecisionRequest = Literal["float32", "bfloat16", "auto"]
PRECISION_REQUESTS: tuple[str, ...] = get_args(PrecisionRequest)
