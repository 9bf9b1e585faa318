"""Status of 1000 jobs in one poll: one scheduler call (sacct, or squeue), parsed and stored in the registry.

The scheduler answers through a counting Transport that returns recorded-format text (generated from the
real formats in tests/data/status/), so the numbers are parse + merge + registry cost, not the scheduler's.
Run: .venv/bin/python benchmarks/status_scale.py [--jobs 1000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpctrain.submission.registry import RunRegistry  # noqa: E402
from hpctrain.submission.schedulers import status_parsers as sp  # noqa: E402
from hpctrain.submission.schedulers.slurm import status as slurm_backend  # noqa: E402
from hpctrain.submission.tracking import combine  # noqa: E402
from hpctrain.submission.transport import Completed  # noqa: E402

# (sacct State, ExitCode, Reason, squeue reason) drawn with these weights
_MIX = [
    (("COMPLETED", "0:0", "None", "None"), 30),
    (("RUNNING", "0:0", "None", "None"), 25),
    (("PENDING", "0:0", "Priority", "Priority"), 15),
    (("PENDING", "0:0", "Resources", "Resources"), 10),
    (("FAILED", "1:0", "NonZeroExitCode", "NonZeroExitCode"), 6),
    (("TIMEOUT", "0:0", "TimeLimit", "TimeLimit"), 5),
    (("CANCELLED by 1234", "0:15", "None", "None"), 4),
    (("OUT_OF_MEMORY", "0:125", "OutOfMemory", "OutOfMemory"), 2),
    (("NODE_FAIL", "0:0", "None", "None"), 1),
    (("PENDING", "0:0", "DependencyNeverSatisfied", "DependencyNeverSatisfied"), 2),
]


def make_outputs(n: int, seed: int = 0) -> tuple[list[str], str, str]:
    """Job ids, a ``sacct -P -n -o SACCT_FIELDS`` text (with .batch/.extern steps) and a squeue text."""
    rng = random.Random(seed)
    states = rng.choices([m[0] for m in _MIX], weights=[m[1] for m in _MIX], k=n)
    ids = [str(4_100_000 + i) for i in range(n)]
    sacct, squeue = [], []
    for i, (job, (state, exit_code, reason, sq_reason)) in enumerate(zip(ids, states, strict=True)):
        started = state.split()[0] != "PENDING"
        start = f"2026-11-22T0{i % 10}:{i % 60:02d}:00" if started else "Unknown"
        end = "Unknown" if state in ("RUNNING", "PENDING") else f"2026-11-22T1{i % 10}:{i % 60:02d}:00"
        nodes = f"nid[{i:06d}-{i + 3:06d}]" if started else "None assigned"
        elapsed = f"0{i % 10}:{i % 60:02d}:{i % 59:02d}" if started else "00:00:00"
        sacct.append(f"{job}|ffn-sweep-{i % 7}|{state}|{exit_code}|{reason}|{elapsed}|{start}|{end}|{nodes}")
        if started:
            for step in ("batch", "extern"):
                sacct.append(f"{job}.{step}|{step}|{state.split()[0]}|{exit_code}||{elapsed}|{start}|{end}|"
                             f"nid{i:06d}")
        sq_state = state.split()[0]
        squeue.append(f"{job}|{sq_state}|{sq_reason}|{elapsed.lstrip('0:') or '0:00'}|"
                      f"{nodes if started else ''}|ffn-sweep-{i % 7}")
    return ids, "\n".join(sacct) + "\n", "\n".join(squeue) + "\n"


class CountingTransport:
    """A Transport that answers every command with recorded text and counts the calls."""

    host = "recorded"

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], *, timeout: float, input: bytes | None = None,
            check: bool = True) -> Completed:
        self.calls.append(argv)
        return Completed(0, self.answers[argv[0]], "")

    def put(self, local_path: object, remote_path: str) -> None:
        raise NotImplementedError

    def get(self, remote_path: str, local_path: object) -> None:
        raise NotImplementedError

    def mkdir_p(self, path: str) -> None:
        raise NotImplementedError


def poll(transport: CountingTransport, ids: list[str], command: str) -> dict[str, sp.JobStatus]:
    """One batched poll for all ids: one scheduler call, then parse and merge."""
    if command == "sacct":
        out = transport.run(slurm_backend.sacct_argv(ids), timeout=60).stdout
        return combine(ids, slurm_backend.parse_sacct(out), None)
    out = transport.run(slurm_backend.squeue_argv(ids), timeout=60).stdout
    return combine(ids, None, slurm_backend.parse_squeue(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    ids, sacct_text, squeue_text = make_outputs(args.jobs)
    rows = []
    for command, text in (("sacct", sacct_text), ("squeue", squeue_text)):
        transport = CountingTransport({"sacct": sacct_text, "squeue": squeue_text})
        times, calls = [], []
        for _ in range(args.repeat):
            before = len(transport.calls)
            t0 = time.perf_counter()
            got = poll(transport, ids, command)
            times.append(time.perf_counter() - t0)
            calls.append(len(transport.calls) - before)
        assert len(got) == len(ids) and not any(s.state.value == "missing" for s in got.values())
        argv_len = len(" ".join(transport.calls[-1]))
        rows.append((f"poll via {command}", len(text.splitlines()), statistics.median(times) * 1e3,
                     max(calls), argv_len))

    with tempfile.TemporaryDirectory() as d:
        reg = RunRegistry(Path(d) / "registry.db")
        for i, job in enumerate(ids):
            rid = reg.create_run("ffn-sweep", "polaris", "h", "/r", run_id=f"ffn-sweep-{i:05d}").run_id
            reg.add_submission(rid, job, "submit", ok=True)
        statuses = poll(CountingTransport({"sacct": sacct_text}), ids, "sacct")
        t0 = time.perf_counter()
        active = reg.active_jobs_by_site()
        t_active = time.perf_counter() - t0
        t0 = time.perf_counter()
        changed = reg.update_states(statuses, site="polaris")
        t_update = time.perf_counter() - t0
        reg.close()
    rows.append(("registry.active_jobs_by_site", len(active["polaris"]), t_active * 1e3, 0, 0))
    rows.append((f"registry.update_states ({changed} changed)", len(statuses), t_update * 1e3, 0, 0))

    print(f"{args.jobs} jobs, median of {args.repeat} polls")
    print(f"{'step':<38} {'lines/items':>11} {'ms/poll':>9} {'sched calls':>11} {'argv chars':>10}")
    for name, lines, ms, calls, argv_len in rows:
        print(f"{name:<38} {lines:>11} {ms:>9.2f} {calls:>11} {argv_len:>10}")
    assert all(r[3] <= 1 for r in rows), "a poll must make exactly one scheduler call"


if __name__ == "__main__":
    main()
