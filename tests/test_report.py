"""``hpctrain report`` without a browser: what the collector makes of a run's files (attempts of a requeue chain,
per-rank and per-node busy times, evaluation scores), a page that has every section and nothing from the network,
the metrics sinks' scalars, and the served mode: the token, read-only, 127.0.0.1 only, and its own end.
"""

from __future__ import annotations

import html
import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hpctrain.report.collect import (
    Attempt,
    AttemptSplit,
    AttemptStart,
    Mark,
    ReportData,
    RunFacts,
    attempt_starts,
    collect,
    rank_times,
    score_rows,
)
from hpctrain.report.html import SECTIONS, page
from hpctrain.report.serve import HOST, ReportServer
from hpctrain.report.source import open_source
from hpctrain.runtime.metric_sinks import scalars, tracking_uri

if TYPE_CHECKING:
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.registry_rows import Run

REPO = Path(__file__).resolve().parent.parent


def write_run(d: Path, steps: range, *, final: bool = False, t0: float = 1000.0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"time": t0 + s, "step": s, "loss": 2.0 / s, "lr": 0.1, "per_rank_rate": 10.0, "ranks": 2})
             for s in steps]
    if final:
        lines.append(json.dumps({"time": t0 + steps[-1] + 1, "step": steps[-1], "final": True, "test_accuracy": 0.5}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


# --- collect ------------------------------------------------------------------------------------------------


CHAIN = (Attempt(1, "submit", 9.5, "requeued", "", 75), Attempt(2, "requeue", 35.0, "requeued", "", 75),
         Attempt(3, "requeue", 60.0, "completed", "", 0))
RECORDS = [{"time": t, "step": s, "loss": 1.0} for t, s in ((10, 5), (11, 10), (30, 15), (31, 20), (50, 25))]


def split_attempts(records: list[dict[str, Any]], starts: list[AttemptStart]) -> tuple[list[dict[str, Any]],
                                                                                      list[Mark]]:
    """Each record with the number of the attempt that wrote it, and the marks where later attempts took over:
    ``AttemptSplit`` over a whole list, as read_metrics runs it over metrics.jsonl."""
    split = AttemptSplit(starts)
    out = []
    for record in records:
        attempt = split.attempt_of(record)
        if attempt is not None:
            out.append({**record, "attempt": attempt})
    return out, split.marks


def test_records_are_numbered_by_the_attempt_rank_0_started_before_them() -> None:
    # rank 0 noted each start (attempts.jsonl); the registry saw the requeues later, when a poll came
    starts = attempt_starts([{"time": 9.0, "step": 0}, {"time": 29.0, "step": 10}, {"time": 49.0, "step": 20}],
                            CHAIN)
    out, marks = split_attempts(RECORDS, starts)
    assert [r["attempt"] for r in out] == [0, 0, 1, 1, 2]
    assert [(m.step, m.time, m.label) for m in marks] == [(10, 29.0, "requeue 1"), (20, 49.0, "requeue 2")]


def test_without_attempt_starts_the_chain_times_split_the_records() -> None:
    out, marks = split_attempts(RECORDS, attempt_starts([], CHAIN))
    # polls saw each requeue late: the records between a start and its poll count to the attempt before
    assert [r["attempt"] for r in out] == [0, 0, 0, 0, 1]
    assert [(m.step, m.time, m.label) for m in marks] == [(20, 35.0, "requeue 1")]


def test_without_a_chain_a_step_that_does_not_go_forward_starts_an_attempt() -> None:
    records = [{"step": s, "loss": 1.0} for s in (5, 10, 15, 10, 15, 20)]  # resumed from the checkpoint at 10
    out, marks = split_attempts(records, [])
    assert [r["attempt"] for r in out] == [0, 0, 0, 1, 1, 1]
    assert [m.step for m in marks] == [15]


def test_a_torn_last_line_is_skipped_and_the_final_record_kept_apart(tmp_path: Path) -> None:
    d = write_run(tmp_path / "run", range(5, 25, 5), final=True)
    with (d / "metrics.jsonl").open("a") as f:
        f.write('{"time": 2000, "step": 2')  # a writer mid-append
    data = collect(d, RunFacts(title="run", where=str(d)))
    assert [r["step"] for r in data.records] == [5, 10, 15, 20]
    assert data.final is not None and data.final["test_accuracy"] == 0.5


def test_up_to_64_ranks_each_rank_is_a_row_above_it_each_node_its_slowest_rank() -> None:
    rows = [{"step": 10, "busy_s": [0.01] * 64}, {"step": 20, "busy_s": [0.01] * 63 + [0.05]}]
    per_rank = rank_times(rows, 4, {63: "nid0015"})
    assert per_rank is not None and len(per_rank.rows) == 64
    slowest = per_rank.slowest()
    assert slowest is not None and (slowest.name, slowest.busy) == ("rank 63 (nid0015)", pytest.approx(0.03))
    assert slowest.against == pytest.approx(0.01)  # the median of 64 rows: the mean of the two middle ones
    wide = [{"step": 10, "busy_s": [0.01] * 128}, {"step": 20, "busy_s": [0.01] * 70 + [0.09] + [None] * 57}]
    per_node = rank_times(wide, 8, {64: "nid0008"})
    assert per_node is not None and len(per_node.rows) == 16
    assert per_node.values[8] == (0.01, 0.09)  # node 8 holds ranks 64-71: its slowest rank
    assert per_node.values[9] == (0.01, None)  # no rank of node 9 timed a step in the second interval
    assert per_node.slowest().name == "node 8 (nid0008)"  # type: ignore[union-attr]


def _busy(ms: list[float]) -> list[dict[str, object]]:
    return [{"step": 10, "busy_s": [v / 1e3 for v in ms]}]


def test_two_ranks_are_set_against_each_other_and_more_against_their_true_median(tmp_path: Path) -> None:
    two = rank_times(_busy([57.0, 58.749]), 1, {})
    ranks = section_texts(page(ReportData(RunFacts(title="r", where=str(tmp_path)), ranks=two)))["ranks"]
    assert "58.749 ms busy per step against 57.000 ms for rank 0; the other waits for it" in ranks
    assert "median" not in ranks  # neither in the sentence nor in the heat map's title
    slowest = two.slowest()  # type: ignore[union-attr]
    assert slowest is not None and slowest.name == "rank 1" and slowest.other == "rank 0"
    three = rank_times(_busy([50.0, 52.0, 60.0]), 1, {}).slowest()  # type: ignore[union-attr]
    assert three is not None and (three.name, three.other) == ("rank 2", "")
    assert three.comparison() == "against a median of 52.000 ms"
    four = rank_times(_busy([50.0, 52.0, 54.0, 60.0]), 1, {}).slowest()  # type: ignore[union-attr]
    assert four is not None and four.comparison() == "against a median of 53.000 ms"
    one = rank_times(_busy([50.0]), 1, {})
    assert one is not None and one.slowest().comparison() == ""  # type: ignore[union-attr]
    assert "rank 0</b> alone: 50.000 ms" in section_texts(page(ReportData(RunFacts(title="r", where="d"),
                                                                           ranks=one)))["ranks"]


def test_score_table_rows_are_methods_and_columns_the_shared_metrics() -> None:
    headers, rows = score_rows({"ffn": {"voi": 1.25, "adapted_rand_error": 0.2, "segments": 12},
                                "watershed": {"voi": 1.5, "adapted_rand_error": 0.3},
                                "seconds": {"total": 3.0}, "more": {}})
    assert headers == ["method", "voi", "adapted_rand_error", "segments"]
    assert rows[:2] == [["ffn", "1.250", "0.200", "12"], ["watershed", "1.500", "0.300", "-"]]


# --- the page -----------------------------------------------------------------------------------------------


def section_texts(text: str) -> dict[str, str]:
    out = {}
    for name in SECTIONS:
        start = text.index(f'<section id="{name}">')
        out[name] = text[start:text.index("</section>", start)]
    return out


def test_an_empty_run_directory_still_gives_every_section_a_sentence(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    text = page(collect(d, RunFacts(title="empty", where=str(d))))
    sections = section_texts(text)
    assert list(sections) == list(SECTIONS)
    for name, body in sections.items():
        assert body.split("</h2>", 1)[1].strip(), f"section {name} is empty"
    assert "<svg" not in text  # nothing to draw, and nothing drawn from nothing


def test_the_page_names_no_other_file_or_host(tmp_path: Path) -> None:
    d = write_run(tmp_path / "run", range(5, 55, 5), final=True)
    text = page(collect(d, RunFacts(title="run", where=str(d))))
    assert text.count("<svg") >= 2
    # what a browser would fetch: scripts, style sheets, frames, and any src, url() or href that is not a
    # reference inside the page (#id) or inline data
    for pattern in (r"<script", r"<link", r"<iframe", r"@import", r"\bsrc\s*=", r"url\(\s*['\"]?(?!#)",
                    r"href\s*=\s*['\"](?!#|data:)"):
        assert not re.search(pattern, text), (pattern, re.search(pattern, text))


@pytest.mark.processes
def test_the_cli_writes_the_report_of_a_run_directory(tmp_path: Path) -> None:
    d = write_run(tmp_path / "run", range(5, 25, 5))
    out = tmp_path / "r.html"
    done = subprocess.run([sys.executable, "-m", "hpctrain", "report", str(d), "-o", str(out)], capture_output=True,
                          text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HPCTRAIN_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    sections = section_texts(out.read_text())
    assert "<svg" in sections["loss"] and "no requeue" in sections["loss"]


@pytest.mark.processes
def test_the_report_imports_no_torch_and_no_mpi(tmp_path: Path) -> None:
    """A laptop without the train extra draws reports: matplotlib, never the runtime."""
    d = write_run(tmp_path / "run", range(5, 25, 5))
    code = ("import sys; from hpctrain.cli import main; "
            f"rc = main(['report', {str(d)!r}, '-o', {str(tmp_path / 'r.html')!r}]); "
            "print([m for m in ('torch', 'mpi4py', 'tensorboard', 'mlflow') if m in sys.modules], file=sys.stderr); "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]"


# --- metrics sinks -------------------------------------------------------------------------------------------


def test_sinks_get_every_number_of_a_record_but_the_step_and_the_rank_count() -> None:
    assert scalars({"time": 1.0, "step": 5, "ranks": 2, "loss": 0.5, "lr": 0.1, "note": "x", "nan": float("nan")}) \
        == {"loss": 0.5, "lr": 0.1}
    assert scalars({"step": 9, "final": True, "test_accuracy": 0.75}) == {"final/test_accuracy": 0.75}


def test_a_tracking_directory_is_relative_to_the_run_directory(tmp_path: Path) -> None:
    assert tracking_uri("mlruns", tmp_path) == (tmp_path / "mlruns").resolve().as_uri()
    assert tracking_uri("http://mlflow:5000", tmp_path) == "http://mlflow:5000"


# --- served mode -------------------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def outside_address() -> str:
    """This machine's address on its first non-loopback interface (the route a packet out would take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # a UDP connect sends nothing: it only picks the interface
        address = s.getsockname()[0]
    assert not address.startswith("127."), address
    return address


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = write_run(tmp_path / "run", range(5, 25, 5))
    server = ReportServer(open_source(str(d)), refresh_s=0.5, linger_s=30.0, out=tmp_path / "final.html")
    written: list[Path] = []
    thread = threading.Thread(target=server.serve, args=(written.append,), daemon=True)
    thread.start()
    yield server, d, thread, written
    server.stop()
    thread.join(timeout=60)


def test_served_page_needs_the_token(served) -> None:  # type: ignore[no-untyped-def]
    server, _, _, _ = served
    base = f"http://{HOST}:{server.port}"
    status, body = get(server.url)
    assert status == 200 and '<section id="loss">' in body and 'http-equiv="refresh"' in body
    assert get(f"{base}/")[0] == 403
    assert get(f"{base}/{server.token[:-1]}/")[0] == 403
    assert get(f"{base}/{server.token}/../")[0] in (403, 404)
    assert get(f"{base}/{server.token}/metrics.jsonl")[0] == 403
    request = urllib.request.Request(server.url, data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 405


def test_served_page_is_not_reachable_on_another_interface(served) -> None:  # type: ignore[no-untyped-def]
    server, _, _, _ = served
    assert get(server.url)[0] == 200  # it is listening
    with pytest.raises(OSError):
        socket.create_connection((outside_address(), server.port), timeout=30).close()


@pytest.mark.processes
def test_server_stops_by_itself_once_the_run_has_ended(served) -> None:  # type: ignore[no-untyped-def]
    server, d, thread, written = served
    server.linger_s = 0.0
    assert get(server.url)[0] == 200
    assert thread.is_alive()
    with (d / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"time": 2000.0, "step": 20, "final": True, "test_accuracy": 0.9}) + "\n")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert written == [server.out]
    final = server.out.read_text()
    assert "test_accuracy" in final and 'http-equiv="refresh"' not in final


def test_the_attempt_legend_sits_outside_the_plot_and_covers_no_point() -> None:
    from hpctrain.report.figures import _pyplot, draw_loss

    # three attempts whose losses fill the plot, its lower left corner included
    records = [{"time": 100.0 + s, "step": s, "loss": (0.2 + (s * 7 % 10) / 10), "lr": 0.1, "attempt": s // 40}
               for s in range(1, 120)]
    fig = draw_loss(ReportData(RunFacts(title="r", where="d"), records=records))
    try:
        fig.canvas.draw()
        by_step = fig.axes[0]
        legend = by_step.get_legend()
        assert legend is not None and [t.get_text() for t in legend.get_texts()] == [
            "attempt 1", "attempt 2", "attempt 3"]
        box = legend.get_window_extent()
        plot = by_step.get_window_extent()
        assert box.y0 >= plot.y1, (box, plot)  # above the plotting area, not on it
        points = [p for c in by_step.collections for p in c.get_offset_transform().transform(c.get_offsets())]
        assert len(points) == len(records)
        assert not [p for p in points if box.contains(*p)]
        assert box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1  # and on the figure, not cut off
    finally:
        _pyplot().close(fig)


@pytest.mark.parametrize("facts,want", [
    (RunFacts(title="r1", where="d", state="running"), "no evaluation yet (the run writes its final record when it "
                                                       "finishes)"),
    (RunFacts(title="r1", where="d"), "no evaluation yet"),  # a bare directory: whether it ended is not known
    (RunFacts(title="r1", where="d", state="completed", ended=True),
     "no evaluation for this run: its model gave no evaluation at the end of training (metrics.jsonl has no final "
     "record) and no scores.json is beside it; `hpctrain report r1 --with DIR` adds the scores.json in DIR"),
    (RunFacts(title="r1", where="d", state="cancelled", ended=True),
     "no evaluation for this run: it ended (cancelled) before the end of training, where its model's evaluation is "
     "written; `hpctrain resume r1` trains on from its checkpoint of step 20 and evaluates at the end"),
])
def test_a_run_without_evaluation_says_whether_one_may_still_come(facts: RunFacts, want: str) -> None:
    from hpctrain.report.collect import CheckpointEntry

    data = ReportData(facts, checkpoints=[CheckpointEntry(10, None, 1), CheckpointEntry(20, None, 1)])
    text = html.unescape(section_texts(page(data))["evaluation"])
    assert want in text
    assert ("yet" in text) is (not facts.ended)


# --- how a run went on: the chain's words, as status has them ------------------------------------------------


def _registered(reg: RunRegistry, tmp_path: Path, name: str, job: str) -> tuple[Run, Path]:
    from hpctrain.submission.run_record import META_FILE, RunMeta, record_dir

    run_dir = tmp_path / name
    run = reg.create_run(name, "ci-slurm", "h", str(run_dir))
    reg.add_submission(run.run_id, job, "submit", ok=True)
    record_dir(reg, run.run_id).mkdir(parents=True)
    (record_dir(reg, run.run_id) / META_FILE).write_text(RunMeta("slurm", total_steps=40, max_requeues=2).to_json())
    # two attempts: rank 0 noted each start; the second resumed from the checkpoint of step 20
    write_run(run_dir, range(5, 45, 5))
    (run_dir / "attempts.jsonl").write_text('{"time": 1000, "step": 0}\n{"time": 1020.5, "step": 20}\n')
    return run, run_dir


def _summary_and_marks(reg: RunRegistry, run: Run, run_dir: Path) -> tuple[str, str]:
    from hpctrain.report.source import facts_of

    sections = section_texts(page(collect(run_dir, facts_of(reg, reg.get_run(run.run_id)))))
    attempts = re.search(r"<dt>attempts</dt><dd>([^<]*)</dd>", sections["summary"])
    assert attempts is not None
    return html.unescape(attempts.group(1)), html.unescape(sections["loss"])


def test_a_cancel_and_resume_reads_as_one_not_as_a_requeue(tmp_path: Path) -> None:
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.schedulers.state import JobState
    from hpctrain.submission.schedulers.status_parsers import JobStatus
    from hpctrain.submission.views import chain_starts

    with RunRegistry(tmp_path / "registry.db") as reg:
        run, run_dir = _registered(reg, tmp_path, "cancelled", "50")
        cancel = JobStatus("50", JobState.CANCELLED, "cancelled by uid 1000", 0, 0, "CANCELLED by 1000")
        reg.update_states({"50": cancel})
        reg.add_submission(run.run_id, "51", "resume", ok=True)
        reg.update_states({"51": JobStatus("51", JobState.COMPLETED, "", 0, 0, "COMPLETED")})
        assert chain_starts(reg.chain(run.run_id)) == ["", "by the user after a cancel"]
        attempts, loss = _summary_and_marks(reg, run, run_dir)
    assert attempts == "2 (1 resume by the user after a cancel)"
    assert "requeue" not in attempts and "resume 1 by the user after a cancel: resumed after step 20" in loss


@pytest.mark.parametrize("lost,how", [
    ({}, "after a checkpoint"),
    ({"60": "a node failure (node02 stopped answering the scheduler)"},
     "by the scheduler after a node failure (node02 stopped answering the scheduler)"),
])
def test_a_requeue_is_named_by_what_started_it(tmp_path: Path, lost: dict[str, str], how: str) -> None:
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.schedulers.slurm import SCHEDULER
    from hpctrain.submission.schedulers.state import JobState
    from hpctrain.submission.schedulers.status_parsers import JobStatus, PastRun
    from hpctrain.submission.tracking import record_requeues
    from hpctrain.submission.views import chain_starts

    with RunRegistry(tmp_path / "registry.db") as reg:
        run, run_dir = _registered(reg, tmp_path, "requeued", "60")
        ended = PastRun("NODE_FAIL" if lost else "REQUEUED", "node[01-02]")
        done = {"60": JobStatus("60", JobState.COMPLETED, "", 0, 1, "COMPLETED", earlier_runs=(ended,))}
        assert record_requeues(reg, done, {"60": run}, lost, SCHEDULER) == 1
        reg.update_states(done)
        assert chain_starts(reg.chain(run.run_id)) == ["", how]
        attempts, loss = _summary_and_marks(reg, run, run_dir)
    assert attempts == f"2 (1 requeue {how})"
    assert f"requeue 1 {how}: resumed after step 20" in loss


def test_a_job_that_resubmitted_itself_went_on_after_a_checkpoint(tmp_path: Path) -> None:
    """PBS/Cobalt: the job that stopped at its checkpoint ended (completed, exit 0) and submitted the next one."""
    from hpctrain.submission.registry import RunRegistry
    from hpctrain.submission.schedulers.state import JobState
    from hpctrain.submission.schedulers.status_parsers import JobStatus
    from hpctrain.submission.views import chain_starts

    with RunRegistry(tmp_path / "registry.db") as reg:
        run, run_dir = _registered(reg, tmp_path, "resubmitted", "70.pbs")
        reg.update_states({"70.pbs": JobStatus("70.pbs", JobState.COMPLETED,
                                               "stopped at a checkpoint; resubmitted as job 71.pbs", 0)})
        reg.add_submission(run.run_id, "71.pbs", "resubmit", ok=True)
        assert chain_starts(reg.chain(run.run_id)) == ["", "after a checkpoint"]
        attempts, _ = _summary_and_marks(reg, run, run_dir)
    assert attempts == "2 (1 resubmit after a checkpoint)"
