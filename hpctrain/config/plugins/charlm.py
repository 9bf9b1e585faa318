"""``model: lstm``: the character-level LSTM on Python's help text, its ``model_args`` and ``data``.

An epoch is the training text cut into windows of ``seq_len`` characters, so that epoch-based schedules (LEGW's
warm-up, decay every N epochs) count the same number of steps on the laptop and on the ranks.
"""

from __future__ import annotations

from pydantic import Field

from hpctrain.config.common import Strict
from hpctrain.config.job import JobSpec
from hpctrain.config.plugin import ModelSchema
from hpctrain.errors import ConfigError

# 1/HOLDOUT_SHARE of the text is held out for validation (its first characters).
HOLDOUT_SHARE = 20


class CharLMArgs(Strict):
    """``model_args`` of ``model: lstm``."""

    seq_len: int = Field(64, ge=1, description="Characters per training window")
    embed: int = Field(32, ge=1, description="Embedding size")
    hidden: int = Field(128, ge=1, description="LSTM hidden size")
    layers: int = Field(1, ge=1, description="Stacked LSTM layers")


class CharLMData(Strict):
    """``data`` of ``model: lstm``."""

    max_chars: int = Field(400_000, ge=1, description="Characters of the text used (train + validation)")


def text_length(max_chars: int) -> int:
    """Characters of the text the task trains on: Python's help topics (stdlib, no torch), cut to ``max_chars``."""
    from pydoc_data.topics import topics

    return min(max_chars, sum(len(t) for t in topics.values()) + len(topics) - 1)  # joined by newlines


class CharLMSchema(ModelSchema):
    model_args = CharLMArgs
    data = CharLMData

    def dataset_size(self, args: CharLMArgs, data: CharLMData) -> int:
        """Windows of ``seq_len`` characters in the training share of the text (the task draws windows at
        random positions; an epoch is this many of them)."""
        chars = text_length(data.max_chars)
        return max(1, (chars - chars // HOLDOUT_SHARE) // args.seq_len)

    def check(self, args: CharLMArgs, data: CharLMData, job: JobSpec, world_size: int) -> list[str]:
        # A window is seq_len + 1 characters (inputs and the next-character targets), drawn from the held-out
        # share as well: it must hold at least one window start.
        held_out, need = data.max_chars // HOLDOUT_SHARE, args.seq_len + 2
        if held_out < need:
            raise ConfigError(
                f"{data.max_chars} characters leave {held_out} for validation, fewer than one window of "
                f"model_args.seq_len + 1 = {args.seq_len + 1} plus a start", key="data.max_chars",
                hint=f"use max_chars >= {need * HOLDOUT_SHARE} or a shorter seq_len")
        return []


SCHEMA = CharLMSchema()
