"""The SQLite run registry: runs, submission chains, state updates, prefixes, schema version, and 8 real
processes writing and polling at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import sqlite3
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from hpctrain.errors import HpctrainError
from hpctrain.submission.registry import RunRegistry, default_registry_path, new_run_id
from hpctrain.submission.registry_db import SCHEMA_VERSION
from hpctrain.submission.registry_rows import SUBMIT_FAILED
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus


@pytest.fixture
def reg(tmp_path: Path) -> RunRegistry:
    r = RunRegistry(tmp_path / "registry.db")
    yield r
    r.close()


def _run(reg: RunRegistry, name: str = "ffn-local", site: str = "local") -> str:
    return reg.create_run(name, site, "abc123", f"/runs/{name}", overrides=["train.lr=0.01"]).run_id


def test_run_id_shape_and_create(reg: RunRegistry) -> None:
    assert re.fullmatch(r"ffn-local-\d{8}-\d{4}-[0-9a-f]{4}", new_run_id("ffn-local"))
    run = reg.create_run("ffn-local", "theta", "h", "/r", remote="alice@login", spec_path="jobs/ffn.yaml",
                         overrides=["train.lr=0.1", "resources.nodes=2"])
    assert run.state == "created" and not run.is_active
    assert run.overrides == ["train.lr=0.1", "resources.nodes=2"] and run.remote == "alice@login"
    assert reg.get_run(run.run_id) == run
    ids = {_run(reg) for _ in range(30)}
    assert len(ids) == 30


def test_wal_and_schema_version(reg: RunRegistry) -> None:
    assert reg._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert reg._db.execute("PRAGMA busy_timeout").fetchone()[0] >= 30000
    assert reg.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    RunRegistry(tmp_path / "r.db").close()
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(HpctrainError, match="newer than this hpctrain"):
        RunRegistry(tmp_path / "r.db")


def test_path_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    assert default_registry_path() == tmp_path / "home" / "registry.db"
    monkeypatch.setenv("HPCTRAIN_REGISTRY", str(tmp_path / "x.db"))
    assert default_registry_path() == tmp_path / "x.db"
    RunRegistry().close()
    assert (tmp_path / "x.db").exists()


def test_prefix_lookup(reg: RunRegistry) -> None:
    a = reg.create_run("ffn_a", "local", "h", "/r", run_id="ffn_a-20261122-0231-a3f9")
    reg.create_run("ffn_a", "local", "h", "/r", run_id="ffn_a-20261122-0231-b000")
    reg.create_run("ffnXa", "local", "h", "/r", run_id="ffnXa-20261122-0231-c000")
    assert reg.get_run("ffn_a-20261122-0231-a").run_id == a.run_id
    with pytest.raises(HpctrainError, match=r"'ffn_a' matches 2 runs: .*a3f9.*b000|.*b000.*a3f9"):
        reg.get_run("ffn_a")  # '_' is not a wildcard: ffnXa must not be a candidate
    with pytest.raises(HpctrainError, match="no run matches 'zzz'"):
        reg.get_run("zzz")


def test_submission_chain_and_states(reg: RunRegistry) -> None:
    rid = _run(reg)
    failed = reg.add_submission(rid, None, "submit", ok=False, error="sbatch: error: invalid partition")
    assert not failed.ok and failed.job_id is None and failed.state == SUBMIT_FAILED
    assert reg.get_run(rid).state == SUBMIT_FAILED
    assert reg.active_jobs_by_site() == {}
    reg.add_submission(rid, "101", "submit", ok=True)
    assert reg.get_run(rid).state == "pending" and reg.active_jobs_by_site() == {"local": ["101"]}

    assert reg.update_states({"101": JobStatus("101", JobState.RUNNING)}) == 1
    assert reg.update_states({"101": JobStatus("101", JobState.RUNNING)}) == 0  # nothing changed
    assert reg.get_run(rid).state == "running"
    reg.update_states({"101": JobStatus("101", JobState.TIMEOUT, "the job reached its walltime")})
    run = reg.get_run(rid)
    assert run.state == "timeout" and "walltime" in run.state_reason and not run.is_active
    assert reg.active_jobs_by_site() == {}

    reg.add_submission(rid, "102", "resume", ok=True)
    # a late answer about the old job changes the old submission but not the run
    reg.update_states({"101": JobStatus("101", JobState.FAILED, exit_code=1)})
    assert reg.get_run(rid).state == "pending"
    reg.update_states({"102": JobStatus("102", JobState.COMPLETED, exit_code=0, restart_count=2)})
    chain = reg.chain(rid[:-2])  # prefixes work here too
    assert [(s.seq, s.job_id, s.kind, s.ok, s.state) for s in chain] == [
        (1, None, "submit", False, SUBMIT_FAILED),
        (2, "101", "submit", True, "failed"),
        (3, "102", "resume", True, "completed"),
    ]
    assert chain[2].restart_count == 2 and chain[2].exit_code == 0
    assert reg.get_run(rid).state == "completed"


def test_failed_resubmit_keeps_queued_job_visible(reg: RunRegistry) -> None:
    rid = _run(reg)
    reg.add_submission(rid, "7", "submit", ok=True)
    reg.add_submission(rid, None, "resubmit", ok=False, error="ssh: unreachable")
    assert reg.get_run(rid).state == "pending"
    assert reg.active_jobs_by_site() == {"local": ["7"]}


def test_submission_validation(reg: RunRegistry) -> None:
    rid = _run(reg)
    with pytest.raises(ValueError, match="kind must be one of"):
        reg.add_submission(rid, "1", "again", ok=True)
    with pytest.raises(ValueError, match="needs its job id"):
        reg.add_submission(rid, None, "submit", ok=True)
    with pytest.raises(ValueError, match="needs its error"):
        reg.add_submission(rid, None, "submit", ok=False)
    with pytest.raises(HpctrainError, match="no run nope"):
        reg.add_submission("nope", "1", "submit", ok=True)


def test_job_ids_are_per_site(reg: RunRegistry) -> None:
    a = _run(reg, site="theta")
    b = _run(reg, site="polaris")
    reg.add_submission(a, "500", "submit", ok=True)
    reg.add_submission(b, "500", "submit", ok=True)
    assert reg.active_jobs_by_site() == {"polaris": ["500"], "theta": ["500"]}
    reg.update_states({"500": JobStatus("500", JobState.RUNNING)}, site="theta")
    assert reg.get_run(a).state == "running" and reg.get_run(b).state == "pending"
    assert [r.run_id for r in reg.list_runs(site="theta")] == [a]
    assert {r.run_id for r in reg.list_runs(active_only=True)} == {a, b}


def test_missing_is_terminal(reg: RunRegistry) -> None:
    rid = _run(reg)
    reg.add_submission(rid, "9", "submit", ok=True)
    reg.update_states({"9": JobStatus("9", JobState.MISSING, "the scheduler no longer knows this job")})
    assert reg.get_run(rid).state == "missing" and reg.list_runs(active_only=True) == []


def test_checkpoints(reg: RunRegistry) -> None:
    rid = _run(reg)
    reg.record_checkpoint(rid, 200, "/ck/200")
    reg.record_checkpoint(rid, 100, "/ck/100")
    reg.record_checkpoint(rid, 200, "/ck/200b")
    assert [(c.step, c.path) for c in reg.checkpoints(rid)] == [(100, "/ck/100"), (200, "/ck/200b")]


# --- concurrency: 8 real processes ----------------------------------------------------------------------

WORKERS = 8
SECONDS = 3.0


def _worker(path: str, wid: int, out: mp.Queue) -> None:
    try:
        reg = RunRegistry(path)
        made: list[tuple[str, str]] = []
        polls = 0
        deadline = time.monotonic() + SECONDS
        n = 0
        while time.monotonic() < deadline:
            rid = reg.create_run(f"w{wid}", f"site{wid % 3}", "h", "/r").run_id
            job = f"{wid}{n:05d}"
            if n % 5 == 4:
                reg.add_submission(rid, None, "submit", ok=False, error="sbatch: error: boom")
            else:
                reg.add_submission(rid, job, "submit", ok=True)
            made.append((rid, job))
            n += 1
            # poll like `hpctrain status` does: batched read, then one batched write
            active = reg.active_jobs_by_site()
            mine = [j for ids in active.values() for j in ids if j.startswith(str(wid))][:20]
            reg.update_states({j: JobStatus(j, JobState.RUNNING if n % 2 else JobState.COMPLETED)
                               for j in mine}, site=None)
            reg.record_checkpoint(rid, n, f"/ck/{n}")
            assert reg.get_run(rid).run_id == rid
            polls += 1
        reg.close()
        out.put(("ok", wid, made, polls))
    except BaseException:  # noqa: B036 - report everything, including 'database is locked'
        out.put(("error", wid, traceback.format_exc(), 0))


@pytest.mark.processes
def test_eight_processes_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "registry.db")
    RunRegistry(path).close()
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, w, out)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=500) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [r[2] for r in results if r[0] == "error"]
    assert not errors, errors[0]
    made = [m for r in results for m in r[2]]
    assert len(made) >= WORKERS  # every worker got at least one write through
    reg = RunRegistry(path)
    runs = {r.run_id for r in reg.list_runs()}
    assert runs == {rid for rid, _ in made}  # no row lost, none invented
    n_sub = reg._db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0]
    n_ck = reg._db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    assert n_sub == len(made) and n_ck == len(made)
    failed = reg._db.execute("SELECT COUNT(*) FROM submissions WHERE ok = 0 AND job_id IS NULL").fetchone()[0]
    assert failed == sum(1 for r in results for i, _ in enumerate(r[2]) if i % 5 == 4)
    reg.close()


# --- damage, locks, read-only files, repair and prune (issue 11) ------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _filled(path: Path, n: int = 300) -> list[str]:
    """A registry with ``n`` runs, each with one submission and one checkpoint record."""
    with RunRegistry(path) as reg:
        ids = []
        for i in range(n):
            rid = reg.create_run(f"job{i}", "local", "h", f"/runs/job{i}", overrides=[f"train.lr={i}"]).run_id
            reg.add_submission(rid, str(1000 + i), "submit", ok=True)
            reg.record_checkpoint(rid, i, f"/ck/{i}")
            ids.append(rid)
    return ids


def _runs_cli(path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCTRAIN_REGISTRY": str(path)}
    return subprocess.run([sys.executable, "-m", "hpctrain", "runs", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=500)


def _flip(path: Path, offsets: list[int]) -> None:
    data = bytearray(path.read_bytes())
    for offset in offsets:
        data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 400)


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 3)


def _drop_table(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("DROP TABLE submissions")
    con.commit()
    con.close()


def _zero(path: Path) -> None:
    path.write_bytes(b"")


def _bit_flips(path: Path) -> None:
    # Past the tables' and indices' root pages (the schema's count of them) the pages hold the runs' rows.
    con = sqlite3.connect(path)
    roots = con.execute("SELECT MAX(rootpage) FROM sqlite_master").fetchone()[0]
    con.close()
    _flip(path, [4096 * 3 + 200, 4096 * (roots + 1) + 37, 4096 * (roots + 11) + 5])


DAMAGE = {"garbage": _garbage, "truncated": _truncate, "dropped table": _drop_table, "zero length": _zero,
          "bit flips": _bit_flips}


@pytest.mark.processes
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_gives_a_clear_error_and_repair_salvages_with_a_backup(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "registry.db"
    ids = _filled(path)
    for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        extra.unlink(missing_ok=True)
    DAMAGE[kind](path)
    damaged_bytes = path.read_bytes()

    listed = _runs_cli(path, "--all")
    if kind != "bit flips":  # a flip may land where no query of `runs` reads: then the listing is fine
        assert listed.returncode != 0, listed.stdout[-500:]
    if listed.returncode != 0:
        assert "Traceback" not in listed.stderr
        assert f"the run registry {path} is damaged" in listed.stderr and "hpctrain runs --repair" in listed.stderr
        assert len(listed.stderr.strip().splitlines()) == 1
    with pytest.raises(HpctrainError, match="damaged"):
        with RunRegistry(path) as reg:  # a writer is refused too, and never "recreates" the file empty
            reg.list_runs()
            for rid in ids:
                reg.chain(rid)
            reg.create_run("after", "local", "h", "/r")
    assert path.read_bytes() == damaged_bytes

    repaired = _runs_cli(path, "--repair")
    assert repaired.returncode == 0 and "Traceback" not in repaired.stderr, repaired.stderr
    backups = sorted(tmp_path.glob("registry.db.damaged-*"))
    assert backups and backups[0].read_bytes() == damaged_bytes  # the damaged file, byte for byte
    assert f"kept at {backups[0]}" in repaired.stdout
    with RunRegistry(path) as reg:
        assert reg.integrity_problems() == []
        kept = {r.run_id for r in reg.list_runs()}
        assert kept <= set(ids) and not reg.damaged_rows
        for rid in kept:  # what was salvaged is whole: its submission came along, or it was dropped with it
            assert [s.job_id for s in reg.chain(rid)] in ([], [str(1000 + ids.index(rid))])
        reg.create_run("after", "local", "h", "/r")  # usable again
    if kind in ("dropped table", "bit flips"):
        assert len(kept) >= len(ids) // 2, repaired.stdout  # most rows survive these
    assert _runs_cli(path, "--all").returncode == 0


@pytest.mark.processes
def test_a_row_with_malformed_json_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    ids = _filled(path, 5)
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET overrides = '[not json' WHERE run_id = ?", (ids[2],))
    con.execute("UPDATE submissions SET exit_code = 'x' WHERE run_id = ?", (ids[3],))
    con.commit()
    con.close()
    with RunRegistry(path, readonly=True) as reg:
        assert {r.run_id for r in reg.list_runs()} == set(ids) - {ids[2]}  # one bad row hides only itself
        assert reg.chain(ids[3]) == [] and len(reg.damaged_rows) == 2
        with pytest.raises(HpctrainError, match=rf"run '{ids[2]}' cannot be read: overrides is not JSON"):
            reg.get_run(ids[2])
    listed = _runs_cli(path, "--all", "--json")
    assert listed.returncode == 0 and {r["run_id"] for r in __import__("json").loads(listed.stdout)} == \
        set(ids) - {ids[2]}
    assert f"run row of run '{ids[2]}' skipped" in listed.stderr and "--repair" in listed.stderr
    repaired = _runs_cli(path, "--repair")
    assert "overrides were reset to none" in repaired.stdout
    with RunRegistry(path) as reg:
        assert reg.get_run(ids[2]).overrides == [] and reg.integrity_problems() == []
        assert reg.chain(ids[3]) == []  # the submission with a text exit code could not be kept


@pytest.mark.processes
def test_read_only_commands_never_write(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    ids = _filled(path, 3)
    with RunRegistry(path, readonly=True) as reg:
        assert len(reg.list_runs()) == 3
        with pytest.raises(HpctrainError, match="read-only and this command writes"):
            reg.create_run("x", "local", "h", "/r")
    missing = tmp_path / "none" / "registry.db"
    with RunRegistry(missing, readonly=True) as reg:  # nothing registered yet: empty, and nothing is created
        assert reg.list_runs() == []
    assert not missing.parent.exists()
    assert _runs_cli(path).returncode == 0 and ids[0] in _runs_cli(path, "--all").stdout


@pytest.mark.processes
def test_runs_on_a_read_only_file_system(tmp_path: Path) -> None:
    """A registry on a file system mounted read-only (root ignores file modes, not this): listing works,
    a write is refused with a message saying so."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs not allowed here")
    try:
        path = mnt / "registry.db"
        ids = _filled(path, 3)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        listed = _runs_cli(path, "--all")
        assert listed.returncode == 0, listed.stderr
        assert all(rid in listed.stdout for rid in ids)
        pruned = _runs_cli(path, "--prune")
        assert pruned.returncode != 0 and "Traceback" not in pruned.stderr and "read-only" in pruned.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


HOLD_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA locking_mode = EXCLUSIVE")
con.execute("BEGIN EXCLUSIVE")
con.execute("UPDATE runs SET state = state")
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_locked_registry_is_a_bounded_wait_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    _filled(path, 2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        for readonly in (True, False):
            with pytest.raises(HpctrainError) as info:
                with RunRegistry(path, readonly=readonly, lock_timeout_s=0.5) as reg:
                    reg.list_runs()
                    reg.create_run("x", "local", "h", "/r")
            text = str(info.value)
            assert f"the run registry {path} is locked by another process (waited 0.5 s" in text
            assert "fuser" in text
    finally:
        holder.communicate("", timeout=30)
    with RunRegistry(path, lock_timeout_s=0.5) as reg:  # released: usable again
        assert len(reg.list_runs()) == 2


@pytest.mark.processes
def test_prune_removes_only_old_runs_that_never_ran_and_old_dry_runs(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    with RunRegistry(path) as reg:
        failed = reg.create_run("failed", "local", "h", "/r").run_id
        reg.add_submission(failed, None, "submit", ok=False, error="sbatch: error: no")
        created = reg.create_run("created", "local", "h", "/r").run_id
        ran = reg.create_run("ran", "local", "h", "/r").run_id
        reg.add_submission(ran, "77", "submit", ok=True)
        fresh = reg.create_run("fresh", "local", "h", "/r").run_id
        parent = reg.create_run("arr", "local", "h", "/r", run_id="arr-1_0", array_parent=None).run_id
        reg.create_run("arr", "local", "h", "/r", run_id="arr-1_1", array_parent=parent)
        reg.add_submission("arr-1_1", "78", "submit", ok=True)  # a task that ran keeps its parent row
        reg.record_checkpoint(failed, 5, "/ck/5")
        escape = reg.create_run("escape", "local", "h", "/r", run_id="../escape").run_id  # a hostile id
        old = "2020-01-01T00:00:00.000000Z"
        reg._db.execute("UPDATE runs SET created = ? WHERE run_id != ?", (old, fresh))
    records = tmp_path / "runs"
    for rid in (failed, created, ran):
        (records / rid).mkdir(parents=True)
    (tmp_path / "escape").mkdir()  # where record_dir("../escape") points: must survive
    dry = tmp_path / "dry-run"
    (dry / "old-try").mkdir(parents=True)
    (dry / "new-try").mkdir()
    os.utime(dry / "old-try", (0, 0))

    preview = _runs_cli(path, "--prune", "--older-than", "7d", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert "would remove 3 run(s)" in preview.stdout and "3 folder(s)" in preview.stdout
    for rid in (failed, created, escape):
        assert rid in preview.stdout
    assert parent not in preview.stdout  # array task 1 ran and still names it as its parent
    with RunRegistry(path) as reg:
        assert len(reg.list_runs()) == 7  # the preview changed nothing
    assert (dry / "old-try").is_dir()

    done = _runs_cli(path, "--prune", "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    with RunRegistry(path) as reg:
        assert {r.run_id for r in reg.list_runs()} == {ran, fresh, parent, "arr-1_1"}
        assert reg.checkpoints(failed) == []
    assert sorted(p.name for p in records.iterdir()) == [ran] and (tmp_path / "escape").is_dir()
    assert sorted(p.name for p in dry.iterdir()) == ["new-try"]
    bad_age = _runs_cli(path, "--prune", "--older-than", "soon")
    assert bad_age.returncode != 0 and "12h, 7d or 2w" in bad_age.stderr and "Traceback" not in bad_age.stderr
