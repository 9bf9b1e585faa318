"""A character-level LSTM language model on English text that ships with Python (pydoc's topic help).

Used for the large-batch LEGW experiments: the text needs no download and is the same everywhere.
``model_args`` and ``data`` are read through their schema (hpctrain/config/plugins/charlm.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import nn

from hpctrain.config.plugins.charlm import HOLDOUT_SHARE, SCHEMA
from hpctrain.models.task import TaskContext, TrainingTask


def python_help_text(limit_chars: int | None = None) -> str:
    """The English text of Python's interactive help topics (``pydoc_data.topics``), in a fixed order."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[key] for key in sorted(topics))
    return text[:limit_chars] if limit_chars else text


@cache
def encoded_text(max_chars: int) -> tuple[torch.Tensor, int]:
    """The text as character indices and the vocabulary size; made once per process (many simulated workers
    build the task; do not modify the tensor)."""
    text = python_help_text(max_chars)
    lookup = {c: i for i, c in enumerate(sorted(set(text)))}
    return torch.tensor([lookup[c] for c in text], dtype=torch.long), len(lookup)


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, embed: int = 32, hidden: int = 128, layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


class CharLMTask(TrainingTask):
    """Random windows of the text; window starts come from a generator seeded by (seed, rank, step)."""

    sample_unit = "sequences"

    def __init__(self, ctx: TaskContext) -> None:
        args, data = SCHEMA.parse(ctx.model_args, ctx.data)
        self.encoded, vocab = encoded_text(data.max_chars)
        holdout = len(self.encoded) // HOLDOUT_SHARE
        self.valid, self.train = self.encoded[:holdout], self.encoded[holdout:]
        self.seq_len = args.seq_len
        torch.manual_seed(ctx.seed)
        self.model = CharLSTM(vocab, args.embed, args.hidden, args.layers)
        self.batch, self.rank, self.seed, self.step = ctx.batch_per_rank, ctx.rank, ctx.seed, 0

    @property
    def samples_per_step(self) -> int:
        return self.batch

    def _windows(self, source: torch.Tensor, generator: torch.Generator, count: int) -> torch.Tensor:
        starts = torch.randint(0, len(source) - self.seq_len - 1, (count,), generator=generator)
        return torch.stack([source[s : s + self.seq_len + 1] for s in starts.tolist()])

    def next_batch(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed((self.seed * 7919 + self.rank) * 1_000_003 + self.step)
        self.step += 1
        return self._windows(self.train, generator, self.batch)

    def forward_loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, Any]:
        logits = self.model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        return loss, None

    def evaluate(self) -> dict[str, float]:
        generator = torch.Generator().manual_seed(12345)
        with torch.no_grad():
            batch = self._windows(self.valid, generator, 64)
            loss, _ = self.forward_loss(batch)
        return {"valid_loss": float(loss), "valid_bits_per_char": float(loss) / float(torch.log(torch.tensor(2.0)))}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
