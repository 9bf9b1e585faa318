"""Which nodes train: the first ``needed`` nodes of the allocation, in its order, that passed the check, leaving out
first the nodes that failed it, then the nodes to avoid (blamed earlier in the run, named by a person, stragglers)
where enough nodes remain without them. Pure: the gatherer calls it with what it learned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TRAINING_NODES_FILE = "training-nodes"  # in the run directory: the chosen nodes, one per line, for the launcher


@dataclass(frozen=True)
class Selection:
    """The training nodes in allocation order, the healthy nodes kept as spares, each node left out with why,
    and the avoided nodes that had to train all the same (too few others)."""

    training: tuple[str, ...]
    spares: tuple[str, ...]
    left_out: dict[str, str] = field(default_factory=dict)
    kept_despite: dict[str, str] = field(default_factory=dict)
    needed: int = 0

    @property
    def enough(self) -> bool:
        return len(self.training) == self.needed


def select_nodes(allocation: Sequence[str], needed: int, failed: Mapping[str, str],
                 avoid: Mapping[str, str]) -> Selection:
    """``allocation``: the job's nodes in the scheduler's order; ``failed``: node -> its check's problem (always
    left out); ``avoid``: node -> why it should not train (left out while others can take its place)."""
    healthy = [n for n in allocation if n not in failed]
    preferred = [n for n in healthy if n not in avoid]
    fallback = [n for n in healthy if n in avoid]
    chosen = preferred[:needed]
    kept = fallback[: max(needed - len(chosen), 0)]
    chosen_set = set(chosen) | set(kept)
    training = tuple(n for n in allocation if n in chosen_set)
    spares = tuple(n for n in preferred if n not in chosen_set)
    left_out = {n: failed[n] for n in allocation if n in failed}
    left_out.update({n: avoid[n] for n in fallback if n not in chosen_set})
    return Selection(training=training, spares=spares, left_out=left_out,
                     kept_despite={n: avoid[n] for n in kept}, needed=needed)
