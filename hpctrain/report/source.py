"""Where a report's files come from: a run directory on this machine, or a registered run — local, or on a login
node, whose files are copied over the run's own ssh connection (the transport ``status`` and ``logs`` use) into a
cache directory on this machine. The registry gives the requeue chain, the state and the reason a run ended.

A remote run's files are listed with their size and modification time first: a file above the size the report
reads of it is refused there (not copied), and a refresh of the served report copies only the files that changed.
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.nodes.blame import BLAME_FILE
from hpctrain.report.collect import (
    ATTEMPTS_CAP,
    ATTEMPTS_FILE,
    BLAME_CAP,
    FAILURE_FILE,
    JOB_FILE,
    JSON_CAP,
    LINES_CAP,
    METRICS_FILE,
    NODE_FILE_CAP,
    PROFILE_FILE,
    RANK_TIMES_FILE,
    SCORES_FILE,
    Attempt,
    RunFacts,
    iso_epoch,
)
from hpctrain.run_files import RunFileError, size_text
from hpctrain.text import printable, printable_short

FETCHED = (METRICS_FILE, ATTEMPTS_FILE, PROFILE_FILE, RANK_TIMES_FILE, FAILURE_FILE, JOB_FILE, SCORES_FILE,
           "checkpoints/manifest.json", BLAME_FILE)
# Shell patterns of more files, listed on the login node: the node files naming each rank's host, and label
# volumes (an FFN run's segmentation).
FETCHED_GLOBS = ("ranks/node-*.txt", "*segmentation*.h5")
FETCH_TIMEOUT_S = 120.0
PATH_MAX = 4096  # Linux's longest path: a longer RUN names no directory (and no run)
# The most copied of each file: what the report reads of it (collect's caps). A label volume is copied whole, in
# chunks to disk; the report reads three slices of it.
FETCH_CAPS = {METRICS_FILE: LINES_CAP, RANK_TIMES_FILE: LINES_CAP, ATTEMPTS_FILE: ATTEMPTS_CAP,
              PROFILE_FILE: JSON_CAP, SCORES_FILE: JSON_CAP, FAILURE_FILE: JSON_CAP, JOB_FILE: JSON_CAP,
              "checkpoints/manifest.json": JSON_CAP, BLAME_FILE: BLAME_CAP}
# Each regular file listed as "SIZE MTIME NAME" (GNU stat, else BSD stat; "- -" when neither answers).
_LIST = ("say() { [ -f \"$1\" ] || return 0; "
         "w=$(stat -L -c '%s %Y' -- \"$1\" 2>/dev/null || stat -L -f '%z %m' -- \"$1\" 2>/dev/null || echo '- -'); "
         "printf '%s %s\\n' \"$w\" \"$1\"; }")


@dataclass
class RunSource:
    """One run's files and registry facts; ``refresh()`` reads both again (served mode calls it per refresh)."""

    ref: str
    directory: Path
    facts: RunFacts
    job_file: Path
    site_file: Path | None = None
    run_id: str | None = None
    remote: str | None = None
    remote_dir: str | None = None
    ssh_config: str | None = None
    _pool: Any = field(default=None, repr=False)
    fetched: dict[str, str] = field(default_factory=dict, repr=False)  # name -> "SIZE MTIME" of the copy here

    def refresh(self, poll: bool = False) -> None:
        """Fetch a remote run's files again and re-read the registry (``poll``: ask the scheduler first)."""
        if self.run_id is None:
            return
        from hpctrain.submission.registry import RunRegistry

        with RunRegistry(readonly=not poll) as registry:
            run = registry.get_run(self.run_id)
            if poll:
                from hpctrain.submission.tracking import poll_runs

                poll_runs(registry, [run], self._pool, progress=False)
                run = registry.get_run(self.run_id)
            self.facts = facts_of(registry, run)
        if self.remote is not None:
            fetch(self._pool.get(self.remote, self.ssh_config), str(self.remote_dir), self.directory, self.fetched)


def facts_of(registry: Any, run: Any) -> RunFacts:
    """The registry's facts: state, the reason shown by ``status``, and the chain of attempts."""
    from hpctrain.submission.run_record import read_meta
    from hpctrain.submission.views import chain_starts, is_terminal, view_of

    view = view_of(registry, run)
    chain = [s for s in registry.chain(run.run_id) if s.ok]
    attempts = tuple(Attempt(s.seq, s.kind, iso_epoch(s.submitted_at) or 0.0, s.state, s.state_reason, s.exit_code,
                             how) for s, how in zip(chain, chain_starts(chain), strict=True))
    try:
        total = read_meta(registry, run).total_steps
    except Exception:  # noqa: BLE001 - the step count is only shown
        total = None
    where = f"{run.remote}:{run.run_dir}" if run.remote else run.run_dir
    return RunFacts(title=run.run_id, where=where, state=run.state, reason=view.reason, site=run.site,
                    attempts=attempts, total_steps=total, ended=is_terminal(run.state))


def fetch(transport: Any, remote_dir: str, into: Path, known: dict[str, str] | None = None) -> list[str]:
    """Copy the report's files of ``remote_dir`` on the login node into ``into``; the names listed there.

    ``known`` (name -> "SIZE MTIME" of the copy in ``into``, updated here) skips the files that did not change
    since the last call and removes the copies of files that are gone. A file bigger than the report reads of it
    is a RunFileError, before anything is copied."""
    known = {} if known is None else known
    fixed = " ".join(shlex.quote(f) for f in FETCHED)
    script = (f'{_LIST}; cd "$1" || exit 3; for f in {fixed}; do say "$f"; done; '
              f'for f in {" ".join(FETCHED_GLOBS)}; do say "$f"; done; exit 0')
    listed = transport.run(["sh", "-c", script, "sh", remote_dir], timeout=FETCH_TIMEOUT_S, check=False)
    if listed.returncode == 3:
        from hpctrain.errors import HpctrainError

        raise HpctrainError(f"the run directory {printable(remote_dir)} is not on {transport.host}",
                            hint="was it removed? `hpctrain runs` lists where each run is")
    found: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        size, _, rest = line.partition(" ")
        mtime, _, name = rest.partition(" ")
        if name and not name.startswith("/") and ".." not in name.split("/"):
            found[name] = f"{size} {mtime}"
            cap = FETCH_CAPS.get(name, NODE_FILE_CAP if name.startswith("ranks/") else None)
            if cap is not None and size.isdigit() and int(size) > cap:
                raise RunFileError(f"{transport.host}:{printable_short(remote_dir)}/{printable(name)}: "
                                   f"{size_text(int(size))}, above the {size_text(cap)} that hpctrain reads of this "
                                   "file (docs/report.md)")
    for name in [n for n in known if n not in found]:
        (into / name).unlink(missing_ok=True)
        del known[name]
    for name, stamp in found.items():
        target = into / name
        if known.get(name) == stamp and "-" not in stamp and target.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        transport.get(f"{remote_dir}/{name}", target)
        known[name] = stamp
    return list(found)


def registered_id(directory: Path) -> str | None:
    """The id of the registered run whose run directory this is (a run directory is named after its run id)."""
    from hpctrain.errors import HpctrainError
    from hpctrain.submission.registry import RunRegistry, default_registry_path
    from hpctrain.submission.registry_db import registry_file_exists

    try:
        if not registry_file_exists(default_registry_path()):
            return None
        with RunRegistry(readonly=True) as registry:
            run = registry.get_run(directory.name)
    except HpctrainError:
        return None
    return run.run_id if run.remote is None and Path(run.run_dir).resolve() == directory else None


def open_source(ref: str, *, pool: Any = None, cache_dir: Path | None = None) -> RunSource:
    """A run directory (a path that exists; the registry's facts too where it is a registered run's), else a run id
    or unique prefix in the registry."""
    from hpctrain.errors import UnknownRun
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.run_record import SITE_FILE, read_meta, record_dir
    from hpctrain.submission.transport import TransportPool

    expected = "give a run id, a unique prefix of one, or a run directory"
    if not ref:
        raise UnknownRun("RUN is empty", hint=expected)
    if len(ref) > PATH_MAX:
        raise UnknownRun(f"RUN {printable_short(ref)}: longer than any path or run id", hint=expected)
    path = Path(ref)
    try:
        is_dir = path.is_dir()
    except OSError as exc:
        raise UnknownRun(f"RUN {printable_short(ref)}: {exc.strerror or exc}", hint=expected) from None
    if is_dir:
        d = path.resolve()
        registered = registered_id(d)
        if registered is None:
            return RunSource(ref, d, RunFacts(title=d.name, where=str(d)), d / JOB_FILE)
        ref = registered
    pool = pool or TransportPool()
    with RunRegistry(readonly=True) as registry:
        run = registry.get_run(ref)
        facts = facts_of(registry, run)
        record = record_dir(registry, run.run_id)
        meta = read_meta(registry, run)
    job_file = record / JOB_FILE if (record / JOB_FILE).is_file() else Path(run.run_dir) / JOB_FILE
    source = RunSource(ref, Path(run.run_dir), facts, job_file, record / SITE_FILE, run.run_id, run.remote,
                       run.run_dir, meta.ssh_config, pool)
    if run.remote is not None:
        base = cache_dir or Path(tempfile.mkdtemp(prefix="hpctrain-report-"))
        source.directory = base / run.run_id
        source.directory.mkdir(parents=True, exist_ok=True)
        fetch(pool.get(run.remote, meta.ssh_config), run.run_dir, source.directory, source.fetched)
        if not job_file.is_file():
            source.job_file = source.directory / JOB_FILE
    return source
