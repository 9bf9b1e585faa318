"""Findings -> a site profile: YAML with each value's source as a comment, every value the machine did not
give under ``guessed:`` and in a to-do list, validated by the same schema as every shipped profile.

``write_profile`` writes it atomically and never replaces an existing file unless told to.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from hpctrain.config.common import Name, QueueName, Word
from hpctrain.config.site import SiteProfile
from hpctrain.config.validation import validate_model
from hpctrain.config.walltime import format_hms
from hpctrain.config.yamlio import parse_yaml
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.files import atomic_path
from hpctrain.submission.discovery.facts import (
    NO_LIMIT_S,
    NO_LIMIT_TEXT,
    Fact,
    Findings,
    NodeFacts,
    QueueFacts,
    describe_shape,
)
from hpctrain.submission.schedulers.base import Scheduler, get_scheduler

REMOTE_ROOT = "$HOME/hpctrain-runs"
_WORD = TypeAdapter(Word)
_QUEUE_NAME = TypeAdapter(QueueName)
# More queues than any centre has: a profile of more would be too long to read (or to load).
MAX_QUEUES = 200
# Loaded modules named in a comment.
MAX_LISTED = 20
_NAME = TypeAdapter(Name)
_CLOCK = re.compile(r"\d+(-\d+)?(:\d+)+")


@dataclass(frozen=True)
class Draft:
    """A discovered profile: its YAML text, the validated model, the to-do list and notes for the user."""

    text: str
    profile: SiteProfile
    todo: list[str]
    notes: list[str] = field(default_factory=list)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and _CLOCK.fullmatch(value):
        return f'"{value}"'  # walltimes quoted as in the shipped profiles: YAML 1.1 reads 24:00:00 as a number
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _comment(text: str) -> str:
    """One line of comment text: whatever a scheduler printed, it cannot end the comment or break the YAML."""
    return " ".join("".join(c if c.isprintable() else "?" for c in text).split())


class _Writer:
    """Builds the YAML line by line: ``key: value  # source``; guessed facts are collected on the way."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.guessed: dict[str, tuple[Any, str]] = {}

    def value(self, path: tuple[str, ...], value: Any, source: str = "", guessed: bool = False) -> None:
        key = _yaml_scalar(path[-1])
        note = f"  # {'GUESSED: ' if guessed else ''}{_comment(source)}" if source else ""
        self.lines.append(f"{'  ' * (len(path) - 1)}{key}: {_yaml_scalar(value)}{note}")
        if guessed:
            self.guessed[".".join(path)] = (value, source)

    def fact(self, path: tuple[str, ...], fact: Fact[Any], value: Any = None) -> None:
        self.value(path, fact.value if value is None else value, fact.source, fact.guessed)

    def section(self, path: tuple[str, ...], source: str = "") -> None:
        note = f"  # {_comment(source)}" if source else ""
        self.lines.append(f"{'  ' * (len(path) - 1)}{_yaml_scalar(path[-1])}:{note}")


def _walltime_text(seconds: int) -> str:
    return NO_LIMIT_TEXT if seconds >= NO_LIMIT_S else format_hms(seconds)


def profile_name(findings: Findings, requested: str | None) -> str:
    """``requested`` (checked), else the cluster's name, else the login host's name without ``login``/digits."""
    if requested is not None:
        if not _valid(_NAME, requested):
            raise ConfigError(f"--name {requested!r} is not a valid site name",
                              hint="use letters, digits, '_', '.' and '-' (at most 64 characters)")
        return requested
    candidates = [findings.scheduler.cluster_name or ""]
    host = (findings.remote or "").rpartition("@")[2] or findings.host
    for label in host.split("."):
        candidates.append(re.sub(r"[-_]?(login|uan|ln)[-_]?\d*$|[-_]?\d+$", "", label, flags=re.I))
    for candidate in candidates:
        cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", candidate).strip("-._")[:64]
        if cleaned and not re.fullmatch(r"(login|uan|ln)\d*", cleaned, re.I) and _valid(_NAME, cleaned):
            return cleaned
    return "discovered"


def _valid(adapter: TypeAdapter[str], value: str) -> bool:
    """True when ``value`` passes the schema's own check (Name, Word)."""
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def _is_word(name: str) -> bool:
    return _valid(_WORD, name)


def _node(w: _Writer, path: tuple[str, ...], node: NodeFacts, base: NodeFacts | None = None) -> None:
    """The node mapping; with ``base``, only the fields that differ from it (a queue's node override)."""
    fields = [("cores", node.cores), ("threads_per_core", node.threads_per_core), ("gpus", node.gpus),
              ("gpu_kind", node.gpu_kind), ("memory_gb", node.memory_gb)]
    if base is not None:
        ref = {"cores": base.cores, "threads_per_core": base.threads_per_core, "gpus": base.gpus,
               "gpu_kind": base.gpu_kind, "memory_gb": base.memory_gb}
        fields = [(k, f) for k, f in fields if f.value != ref[k].value]
        if not fields:
            return
    w.section(path, f"{node.count} nodes like this" if node.count > 1 else "")
    for key, fact in fields:
        w.fact((*path, key), fact)


def _policies(w: _Writer, path: tuple[str, ...], queue: QueueFacts) -> None:
    """The queue's policy rules the scheduler states."""
    for key, fact in queue.policies().items():
        w.fact((*path, key), fact, _walltime_text(fact.value) if key == "min_walltime" else None)


def _qos_sources(w: _Writer, path: tuple[str, ...], queue: QueueFacts, source: str, scheduler: Scheduler) -> None:
    """The rules a partition's QOS sets are cited with that QOS's limit (a refusal names the QOS's limit, not only
    the partition)."""
    rules = {"max_nodes": queue.max_nodes, "max_walltime": queue.max_walltime_s, **queue.policies()}
    from_qos = {key: fact for key, fact in rules.items() if scheduler.is_qos_limit(fact)}
    if not from_qos:
        return
    w.section((*path, "sources"), "the rules the partition's QOS sets")
    for key, fact in from_qos.items():
        w.value((*path, "sources", key), f"{fact.source}; {source}")


def _queues(w: _Writer, findings: Findings, notes: list[str], stamp: str) -> dict[str, QueueFacts]:
    """The queues mapping and default_queue; queues whose names cannot reach a script are left out."""
    facts, title = findings.scheduler, get_scheduler(findings.scheduler.name).title
    queues = {qname: queue for qname, queue in facts.queues.items() if _valid(_QUEUE_NAME, qname)}
    left_out = [qname for qname in facts.queues if qname not in queues]
    if left_out:
        shown = ", ".join(repr(_comment(q[:40])) for q in left_out[:5]) + (", ..." if len(left_out) > 5 else "")
        notes.append(f"{len(left_out)} queue(s) left out: their names cannot be written into a batch script as one "
                     f"queue ({shown})")
    if len(queues) > MAX_QUEUES:
        notes.append(f"{get_scheduler(facts.name).title} lists {len(queues)} queues: the profile keeps the first "
                     f"{MAX_QUEUES}")
        queues = dict(list(queues.items())[:MAX_QUEUES])
    for qname, queue in list(queues.items()):
        if queue.routes_to is not None:
            kept = [d for d in queue.routes_to.value if d in queues]
            queues[qname] = replace(queue, routes_to=Fact(kept, queue.routes_to.source) if kept else None)
    source = f"{title}'s settings read by `hpctrain sites discover` on {findings.host}, {stamp}"
    if not queues or get_scheduler(facts.name).runs_here:
        return {}
    w.section(("queues",), f"{len(queues)} from {title}")
    for qname, queue in queues.items():
        path = ("queues", qname)
        w.section(path)
        if queue.description:
            w.value((*path, "description"), queue.description, f"from {title}'s queue list")
        w.fact((*path, "max_nodes"), queue.max_nodes)
        if queue.min_nodes is not None and queue.min_nodes.value > 1:
            w.fact((*path, "min_nodes"), queue.min_nodes)
        w.fact((*path, "max_walltime"), queue.max_walltime_s, _walltime_text(queue.max_walltime_s.value))
        _policies(w, path, queue)
        w.value((*path, "source"), source, "what a job refused by these limits is told they come from")
        _qos_sources(w, path, queue, source, get_scheduler(facts.name))
        if queue.node is not None:
            _node(w, (*path, "node"), queue.node, base=findings.node)
    direct = [n for n, q in queues.items() if q.direct_submit is None or q.direct_submit.value]
    default = facts.default_queue
    if default is not None and default.value in direct:
        w.fact(("default_queue",), default)
    else:
        w.value(("default_queue",), (direct or list(queues))[0], "the first queue listed that takes jobs directly",
                guessed=True)
    for name, qos in facts.qos.items():
        limits = [f.source.partition(": ")[2] for f in (qos.max_walltime_s, qos.max_nodes, qos.max_nodes_per_user,
                                                         qos.max_running_per_user, qos.max_queued_per_user) if f]
        if limits:
            notes.append(f"{title} QOS {name!r} sets {', '.join(limits)}: a queue that submits with it names it "
                         f"(qos: {name}) and states these limits")
    return queues


def _accounts(w: _Writer, findings: Findings, notes: list[str]) -> None:
    facts = findings.scheduler
    usable = [a for a in (facts.accounts.value if facts.accounts else []) if _is_word(a)]
    if len(usable) == 1 and facts.accounts is not None:
        w.value(("account",), usable[0], facts.accounts.source)
    elif len(usable) > 1:
        notes.append(f"you have {len(usable)} accounts ({', '.join(usable)}): set `account:` in the profile or "
                     "resources.account in the job spec")
    w.value(("account_required",), False,
            f"{get_scheduler(facts.name).title} does not say whether jobs must name an account", guessed=True)


def _software(w: _Writer, findings: Findings) -> None:
    """Modules, the communication backend and the MPI."""
    if findings.module_system or findings.loaded_modules:
        modules = findings.loaded_modules
        loaded = ", ".join(m[:60] for m in modules[:MAX_LISTED]) or "none"
        if len(modules) > MAX_LISTED:
            loaded += f" and {len(modules) - MAX_LISTED} more"
        w.section(("environment",), f"{findings.module_system or 'modules'}; loaded on {findings.host}: {loaded}")
        w.value(("environment", "modules"), [], "the modules your jobs need (python, the framework)",
                guessed=True)
    w.fact(("comm_backend",), findings.comm_backend)
    if findings.mpi_library is not None:
        w.section(("mpi",))
        usable = [m for m in findings.mpi_modules if _is_word(m)]
        if usable:
            w.value(("mpi", "modules"), usable, "loaded on the login node")
        w.fact(("mpi", "expected_library"), findings.mpi_library)


def _description(findings: Findings, queues: dict[str, QueueFacts]) -> str:
    node, title = findings.node, get_scheduler(findings.scheduler.name).title
    if get_scheduler(findings.scheduler.name).runs_here:
        return f"{findings.host}, no scheduler ({describe_shape(node.shape())})"
    text = f"{title} cluster" + ("" if node.cores.guessed else f", nodes of {describe_shape(node.shape())}")
    largest = max((q.max_nodes.value for q in queues.values()), default=0)
    return text + (f"; largest queue {largest} nodes" if largest else "")


def _header(findings: Findings, notes: list[str], now: datetime.datetime | None) -> list[str]:
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    who = f" (as {findings.user})" if findings.user else ""
    lines = [f"# Discovered by `hpctrain sites discover` on {findings.host}{who}, {stamp}.",
             "# Each value's comment names the command it came from; GUESSED values (also under `guessed:`)",
             "# are placeholders the machine did not report: check them, then delete them from `guessed:`."]
    if findings.scratch is not None:
        lines.append(f"# Node-local scratch: {findings.scratch.value} ({_comment(findings.scratch.source)}); the "
                     "profile has no key for it: point data paths there in the job spec.")
    return lines + [f"# Note: {_comment(n)}" for n in notes]


def draft_profile(findings: Findings, name: str | None = None, *, now: datetime.datetime | None = None) -> Draft:
    """The profile for ``findings``, validated (an HpctrainError naming it a bug if it does not validate)."""
    facts = findings.scheduler
    site_name = profile_name(findings, name)
    w = _Writer()
    notes = list(findings.notes)
    w.value(("scheduler",), facts.name, f"{get_scheduler(facts.name).title} found on {findings.host}"
            if not get_scheduler(facts.name).runs_here else "no scheduler commands found")
    w.fact(("launcher",), findings.launcher)
    if findings.launcher_args.value:
        w.fact(("launcher_args",), findings.launcher_args)
    login = (findings.remote or "").rpartition("@")[2] or findings.host
    w.value(("login_host",), login, "where discovery ran" + (" (over ssh)" if findings.remote else ""))
    w.value(("remote_root",), REMOTE_ROOT, "a default: run directories must be on a file system the compute "
            "nodes see, with room for checkpoints", guessed=not get_scheduler(facts.name).runs_here)
    _node(w, ("node",), findings.node)
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    queues = _queues(w, findings, notes, stamp)
    if not get_scheduler(facts.name).runs_here:
        _accounts(w, findings, notes)
    _software(w, findings)

    top = [f"name: {_yaml_scalar(site_name)}", f"description: {_yaml_scalar(_description(findings, queues))}"]
    if w.guessed:
        top += ["guessed:", *(f"  - {_yaml_scalar(key)}" for key in w.guessed)]
    text = "\n".join(_header(findings, notes, now) + top + w.lines) + "\n"
    profile = validate_discovered(text)
    todo = [f"{key} = {_yaml_scalar(v)}  ({_comment(why)})" for key, (v, why) in w.guessed.items()]
    return Draft(text=text, profile=profile, todo=todo, notes=notes)


def validate_discovered(text: str, path: str = "<discovered profile>") -> SiteProfile:
    """The profile in ``text``, validated exactly as a profile file would be."""
    try:
        return validate_model(SiteProfile, parse_yaml(text, path))
    except ConfigError as exc:
        raise HpctrainError(f"the scheduler's and login shell's answers make a profile that does not validate: {exc}",
                            hint="check what the scheduler reports for that key (scontrol, qstat, pbsnodes); if it "
                                 "looks right, report it with the output of `hpctrain sites discover`") from None


def write_profile(text: str, path: str | os.PathLike[str], force: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically; an existing file is replaced only with ``force``."""
    dest = Path(path)
    if dest.is_dir():
        raise ConfigError("is a directory, not a profile file", path=str(dest), hint="give a file name like NAME.yaml")
    if dest.exists() and not force:
        raise ConfigError("file exists; not replaced", path=str(dest), hint="pass --force to replace it")
    directory = dest.parent if str(dest.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write here: {exc.strerror}", path=str(dest)) from None
    try:
        # exclusive: a file created meanwhile is not replaced either (without --force); readable by its owner only,
        # as it names the user's accounts and login node
        with atomic_path(dest, exclusive=not force, mode=0o600) as tmp:
            try:
                out = open(tmp, "x", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot write here: {exc.strerror}", path=str(dest)) from None
            with out:
                out.write(text)
    except FileExistsError:
        raise ConfigError("file exists; not replaced", path=str(dest), hint="pass --force to replace it") from None
    except OSError as exc:
        raise ConfigError(f"cannot write the profile: {exc.strerror}", path=str(dest)) from None
    return dest
