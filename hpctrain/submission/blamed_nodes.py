"""What the laptop makes of the nodes runs blamed: which nodes a job is kept off (the nodes its run blamed that
the next attempt leaves out, the nodes remembered as bad on its site, the nodes a person named with ``resume
--exclude/--include``) and the words ``status``, ``resume``, ``submit`` and ``sites show`` print for them.

Pure functions over blames (``hpctrain.nodes.blame``) and the registry's records of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from hpctrain.errors import ConfigError
from hpctrain.nodes.blame import Blame, nodes_to_leave_out, rank_text
from hpctrain.submission.registry_rows import BlamedNode

# A host name (RFC 1123 labels, dot-separated), as a scheduler's node list names a node.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
MAX_HOSTNAME = 253


def checked_node_name(name: str, flag: str) -> str:
    """``name`` when it can be a node's host name; else a ConfigError naming the flag."""
    if not is_node_name(name):
        raise ConfigError(f"{flag} {name!r}: not a node name (letters, digits and '-', in labels separated by '.')",
                          hint="name the node as the scheduler lists it, e.g. nid001234 or node03")
    return name


def is_node_name(name: str) -> bool:
    """Whether ``name`` can be a node's host name."""
    return len(name) <= MAX_HOSTNAME and _HOSTNAME.fullmatch(name) is not None


def usable_node_names(blames: Iterable[Blame]) -> list[Blame]:
    """The blames whose node can be named to a scheduler (a line of the run's file naming something else, written
    by hand or damaged, cannot keep a job off a node)."""
    return [b for b in blames if is_node_name(b.node)]


def blame_words(blame: Blame) -> str:
    """``node03 (rank 2: killed by SIGKILL)`` / ``node05 (check: /tmp has 0.1 GB free, needs 2 GB)``."""
    who = rank_text(blame.ranks) if blame.ranks else blame.source or blame.kind
    return f"{blame.node} ({who}: {blame.cause})" if blame.cause else f"{blame.node} ({who})"


def nodes_text(words: Mapping[str, str]) -> str:
    """The nodes with why, one comma-separated line: the values of ``words`` (node -> its words)."""
    return ", ".join(words.values())


def left_out_by_run(blames: Iterable[Blame], spare_nodes: int) -> dict[str, str]:
    """node -> words, for the nodes the run blamed that its next attempt leaves out (slow ones only where the job
    has spare nodes to take their place)."""
    return {node: blame_words(b) for node, b in nodes_to_leave_out(blames, spares=spare_nodes > 0).items()}


def remembered_words(remembered: Mapping[str, Sequence[BlamedNode]]) -> dict[str, str]:
    """node -> ``node03 (failed in runs A, B: killed by SIGKILL)`` for the nodes remembered on a site
    (``remembered``: node -> a blame per run that blamed it, as ``RunRegistry.remembered_nodes`` gives them); a
    name that cannot be a host name is left out."""
    out = {}
    for node, found in remembered.items():
        if not is_node_name(node):
            continue  # a name no scheduler could be told
        runs = ", ".join(f.run_id for f in found)
        causes = "; ".join(dict.fromkeys(f.blame.cause for f in found if f.blame.cause))
        out[node] = f"{node} (failed in runs {runs}" + (f": {causes})" if causes else ")")
    return out


def excluded_nodes(by_run: Mapping[str, str], remembered: Mapping[str, str], exclude: Sequence[str] = (),
                   include: Sequence[str] = ()) -> dict[str, str]:
    """node -> words for every node a job is kept off: the run's (``left_out_by_run``), the site's
    (``remembered_words``) and ``exclude`` (named by the person), less ``include``."""
    out = {**remembered, **by_run}
    for node in exclude:
        out.setdefault(checked_node_name(node, "--exclude"), f"{node} (named with --exclude)")
    for node in include:
        out.pop(checked_node_name(node, "--include"), None)
    return out


def stragglers(blames: Iterable[Blame], job: str | None) -> list[Blame]:
    """The slow blames of job ``job`` (the nodes named stragglers while it runs), one per node."""
    seen: dict[str, Blame] = {}
    for b in blames:
        if b.kind == "slow" and (job is None or b.job == job):
            seen.setdefault(b.node, b)
    return list(seen.values())


def failure_blames(blames: Iterable[Blame], job: str | None) -> list[Blame]:
    """The failed blames of job ``job`` (what explains how it ended), one per node."""
    seen: dict[str, Blame] = {}
    for b in blames:
        if b.kind == "failed" and job is not None and b.job == job:
            seen.setdefault(b.node, b)
    return list(seen.values())


def with_blamed_nodes(reason: str, failed: Sequence[Blame]) -> str:
    """A failed run's reason naming the nodes blamed for it: ``on node03 (rank 2): rank 2 killed by SIGKILL; ...``
    where the reason already tells the cause, else ``bad node node05 (check: ...); exit code 1``."""
    if not failed or all(re.search(rf"\b{re.escape(b.node)}\b", reason) for b in failed):
        return reason  # the note names them already ("rank 2 on node03 killed by SIGKILL", "node check: node03: ...")
    if len(failed) == 1 and failed[0].cause and failed[0].cause in reason:
        return f"on {failed[0].where}: {reason}"
    label = "bad node" if len(failed) == 1 else "bad nodes"
    return f"{label} {', '.join(blame_words(b) for b in failed)}" + (f"; {reason}" if reason else "")


def with_stragglers(reason: str, slow: Sequence[Blame]) -> str:
    """A running run's reason with the nodes named stragglers so far."""
    if not slow:
        return reason
    label = "straggler" if len(slow) == 1 else "stragglers"
    return (f"{reason}; " if reason else "") + f"{label} {', '.join(blame_words(b) for b in slow)}"
