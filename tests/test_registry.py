"""The SQLite run registry: runs, submission chains, state updates, prefixes, schema version, and 8 real
processes writing and polling at once."""

from __future__ import annotations

import multiprocessing as mp
import re
import sqlite3
import time
import traceback
from pathlib import Path

import pytest

from hpctrain.errors import HpctrainError
from hpctrain.submission.registry import (
    SCHEMA_VERSION,
    SUBMIT_FAILED,
    Registry,
    default_registry_path,
    new_run_id,
)
from hpctrain.submission.schedulers.state import JobState
from hpctrain.submission.schedulers.status_parsers import JobStatus


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    r = Registry(tmp_path / "registry.db")
    yield r
    r.close()


def _run(reg: Registry, name: str = "ffn-local", site: str = "local") -> str:
    return reg.create_run(name, site, "abc123", f"/runs/{name}", overrides=["train.lr=0.01"]).run_id


def test_run_id_shape_and_create(reg: Registry) -> None:
    assert re.fullmatch(r"ffn-local-\d{8}-\d{4}-[0-9a-f]{4}", new_run_id("ffn-local"))
    run = reg.create_run("ffn-local", "theta", "h", "/r", remote="alice@login", spec_path="jobs/ffn.yaml",
                         overrides=["train.lr=0.1", "resources.nodes=2"])
    assert run.state == "created" and not run.is_active
    assert run.overrides == ["train.lr=0.1", "resources.nodes=2"] and run.remote == "alice@login"
    assert reg.get_run(run.run_id) == run
    ids = {_run(reg) for _ in range(30)}
    assert len(ids) == 30


def test_wal_and_schema_version(reg: Registry) -> None:
    assert reg._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert reg._db.execute("PRAGMA busy_timeout").fetchone()[0] >= 30000
    assert reg.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    Registry(tmp_path / "r.db").close()
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(HpctrainError, match="newer than this hpctrain"):
        Registry(tmp_path / "r.db")


def test_path_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HPCTRAIN_REGISTRY", raising=False)
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    assert default_registry_path() == tmp_path / "home" / "registry.db"
    monkeypatch.setenv("HPCTRAIN_REGISTRY", str(tmp_path / "x.db"))
    assert default_registry_path() == tmp_path / "x.db"
    Registry().close()
    assert (tmp_path / "x.db").exists()


def test_prefix_lookup(reg: Registry) -> None:
    a = reg.create_run("ffn_a", "local", "h", "/r", run_id="ffn_a-20261122-0231-a3f9")
    reg.create_run("ffn_a", "local", "h", "/r", run_id="ffn_a-20261122-0231-b000")
    reg.create_run("ffnXa", "local", "h", "/r", run_id="ffnXa-20261122-0231-c000")
    assert reg.get_run("ffn_a-20261122-0231-a").run_id == a.run_id
    with pytest.raises(HpctrainError, match=r"'ffn_a' matches 2 runs: .*a3f9.*b000|.*b000.*a3f9"):
        reg.get_run("ffn_a")  # '_' is not a wildcard: ffnXa must not be a candidate
    with pytest.raises(HpctrainError, match="no run matches 'zzz'"):
        reg.get_run("zzz")


def test_submission_chain_and_states(reg: Registry) -> None:
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


def test_failed_resubmit_keeps_queued_job_visible(reg: Registry) -> None:
    rid = _run(reg)
    reg.add_submission(rid, "7", "submit", ok=True)
    reg.add_submission(rid, None, "resubmit", ok=False, error="ssh: unreachable")
    assert reg.get_run(rid).state == "pending"
    assert reg.active_jobs_by_site() == {"local": ["7"]}


def test_submission_validation(reg: Registry) -> None:
    rid = _run(reg)
    with pytest.raises(ValueError, match="kind must be one of"):
        reg.add_submission(rid, "1", "again", ok=True)
    with pytest.raises(ValueError, match="needs its job id"):
        reg.add_submission(rid, None, "submit", ok=True)
    with pytest.raises(ValueError, match="needs its error"):
        reg.add_submission(rid, None, "submit", ok=False)
    with pytest.raises(HpctrainError, match="no run nope"):
        reg.add_submission("nope", "1", "submit", ok=True)


def test_job_ids_are_per_site(reg: Registry) -> None:
    a = _run(reg, site="theta")
    b = _run(reg, site="polaris")
    reg.add_submission(a, "500", "submit", ok=True)
    reg.add_submission(b, "500", "submit", ok=True)
    assert reg.active_jobs_by_site() == {"polaris": ["500"], "theta": ["500"]}
    reg.update_states({"500": JobStatus("500", JobState.RUNNING)}, site="theta")
    assert reg.get_run(a).state == "running" and reg.get_run(b).state == "pending"
    assert [r.run_id for r in reg.list_runs(site="theta")] == [a]
    assert {r.run_id for r in reg.list_runs(active_only=True)} == {a, b}


def test_missing_is_terminal(reg: Registry) -> None:
    rid = _run(reg)
    reg.add_submission(rid, "9", "submit", ok=True)
    reg.update_states({"9": JobStatus("9", JobState.MISSING, "the scheduler no longer knows this job")})
    assert reg.get_run(rid).state == "missing" and reg.list_runs(active_only=True) == []


def test_checkpoints(reg: Registry) -> None:
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
        reg = Registry(path)
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


def test_eight_processes_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "registry.db")
    Registry(path).close()
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, w, out)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [r[2] for r in results if r[0] == "error"]
    assert not errors, errors[0]
    made = [m for r in results for m in r[2]]
    assert len(made) >= WORKERS  # every worker got at least one write through
    reg = Registry(path)
    runs = {r.run_id for r in reg.list_runs()}
    assert runs == {rid for rid, _ in made}  # no row lost, none invented
    n_sub = reg._db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0]
    n_ck = reg._db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    assert n_sub == len(made) and n_ck == len(made)
    failed = reg._db.execute("SELECT COUNT(*) FROM submissions WHERE ok = 0 AND job_id IS NULL").fetchone()[0]
    assert failed == sum(1 for r in results for i, _ in enumerate(r[2]) if i % 5 == 4)
    reg.close()
