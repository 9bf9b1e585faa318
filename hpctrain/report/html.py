"""The report page: one self-contained HTML file — styles and SVG figures inline, no script, no link to any other
file or host — so it opens from a laptop's disk as well as from the served URL. Every section is always there:
where the run has nothing for it, the section says so.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from hpctrain.nodes.blame import rank_text
from hpctrain.report import figures
from hpctrain.report.collect import Mark, ReportData, score_rows
from hpctrain.text import printable

SECTIONS = ("summary", "loss", "throughput", "step-time", "ranks", "plan", "checkpoints", "failure", "nodes",
            "evaluation", "segmentation")

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:70em;color:#222;
padding:0 1em}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.1em;border-bottom:1px solid #ddd;padding-bottom:.2em}
section{margin-bottom:1.6em} .muted{color:#666} .bad{color:#b00020;font-weight:600}
table{border-collapse:collapse;font-size:.9em} td,th{padding:.2em .8em;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} svg.figure{width:100%;height:auto;max-width:60em}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;margin:0} dt{color:#666}
"""


# C0 and C1 control characters but tab and line breaks: a run file's text carries them into a label or a cell.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def esc(value: Any) -> str:
    """A value from the run's files as page text: control characters written as escapes, markup escaped."""
    return html.escape(printable(str(value)), quote=True)


def without_controls(text: str) -> str:
    """The page with any control character left in it (a figure's label drawn from a file) written as an escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def stamp(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def none(text: str) -> str:
    return f'<p class="muted">{esc(text)}</p>'


def _figure(draw: Callable[[], str], what: str) -> str:
    """A figure, or one line saying why it could not be drawn (a report is still written)."""
    try:
        return draw()
    except ImportError as exc:
        return none(f"{what}: matplotlib is needed to draw it ({exc}); pip install matplotlib")
    except (ValueError, TypeError, KeyError, ZeroDivisionError, OverflowError) as exc:
        return none(f"{what}: cannot be drawn from these files ({exc})")


def summary(d: ReportData) -> str:
    f = d.facts
    last = d.records[-1] if d.records else {}
    total = f.total_steps or (d.final or {}).get("step")
    progress = f"step {last.get('step', '-')}" + (f" of {total}" if total else "") if last else "no step logged yet"
    attempts = d.attempts or (len({r.get("attempt", 0) for r in d.records}) if d.records else len(f.attempts))
    items = [("run", f.title), ("where", f.where), ("site", f.site or "-"), ("state", f.state),
             ("progress", progress),
             ("attempts", attempts_text(max(1, attempts), d.marks, max(0, d.restarts - len(d.marks)))),
             ("ranks", (d.profile or {}).get("ranks", last.get("ranks", "-")))]
    if d.intervals > len(d.records):
        items.append(("records", f"{d.intervals} logged; the figures draw an evenly spaced {len(d.records)} of them"))
    if f.reason:
        items.append(("reason", f.reason))
    body = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    problems = "".join(none(p) for p in d.problems)
    return f"<dl>{body}</dl>{problems}"


def attempts_text(attempts: int, marks: list[Mark], more: int = 0) -> str:
    """"3 (2 requeues after a checkpoint)", "2 (1 resume by the user after a cancel)": how the run went on;
    ``more``: restarts beyond those marked."""
    counts: dict[tuple[str, str], int] = {}
    for m in marks:
        counts[(m.kind, m.how)] = counts.get((m.kind, m.how), 0) + 1
    parts = [f"{n} {kind}{'s' * (n != 1)}" + (f" {how}" if how else "") for (kind, how), n in counts.items()]
    if more:
        parts.append(f"{more} more restart{'s' * (more != 1)} not marked")
    return f"{attempts}" + (f" ({', '.join(parts)})" if parts else "")


def loss_section(d: ReportData) -> str:
    if not any("loss" in r for r in d.records):
        return none("no loss logged yet (metrics.jsonl has no interval record)")
    marks = "".join(f"<li>{esc(m.label)}{esc(' ' + m.how if m.how else '')}: resumed after step {m.step}, "
                    f"started {esc(stamp(m.time))}</li>" for m in d.marks)
    listed = f"<ul>{marks}</ul>" if marks else none("no requeue: one attempt")
    return _figure(lambda: figures.loss_figure(d), "loss") + listed


def throughput_section(d: ReportData) -> str:
    if not any("per_rank_rate" in r for r in d.records):
        return none("no rate logged yet")
    return _figure(lambda: figures.throughput_figure(d), "throughput")


def step_section(d: ReportData) -> str:
    if not d.profile:
        return none("no step profile (profile.json) yet: the first steps are not timed")
    parts = figures.step_parts(d.profile)
    if not parts:
        return none("profile.json holds no step timings (compute_s, reduction_wait_s, ...): nothing to draw")
    rows = [[label, f"{s * 1e3:.3f}", f"{100 * s / max(1e-12, sum(p[1] for p in parts)):.1f} %"]
            for label, s, _ in parts]
    return _figure(lambda: figures.step_split_figure(d.profile or {}), "step split") + \
        table(["part of the step", "ms", "share"], rows)


def ranks_section(d: ReportData) -> str:
    if d.ranks is None:
        return none("no per-rank busy times (rank_times.jsonl): the run logged no interval yet, or its hpctrain "
                    "predates them")
    slowest = d.ranks.slowest()
    line = ""
    if slowest is not None and slowest.against is None:
        line = f"<p><b>{esc(slowest.name)}</b> alone: {slowest.busy * 1e3:.3f} ms busy per step.</p>"
    elif slowest is not None:
        waiting = "the other waits" if slowest.other else "the others wait"
        line = (f"<p>Slowest: <b>{esc(slowest.name)}</b>, {slowest.busy * 1e3:.3f} ms busy per step "
                f"{esc(slowest.comparison())}; {waiting} for it in the reduction.</p>")
    return line + _figure(lambda: figures.heatmap_figure(d.ranks), "heat map")


def plan_section(d: ReportData) -> str:
    e = d.efficiency
    if e is None:
        return none(d.efficiency_note or "no comparison with the plan")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.3f}"

    rows = [[name, ms(p), ms(m), "-" if m is None or p <= 0 else f"{m / p:.2f}"] for name, p, m in e.rows]
    measured = "-" if e.measured is None else f"{e.measured:.2f}"
    head = (f"<p>At the run's size ({e.nodes} node{'s' * (e.nodes != 1)}, {e.ranks} ranks): measured efficiency "
            f"<b>{measured}</b>, predicted <b>{e.predicted:.2f}</b> (<code>hpctrain plan --from RUN --compare</code>)."
            "</p>")
    return head + _figure(lambda: figures.efficiency_figure(e.predicted, e.measured), "efficiency") + \
        table(["quantity", "predicted ms", "measured ms", "measured / predicted"], rows)


def checkpoints_section(d: ReportData) -> str:
    if not d.checkpoints:
        return none("no committed checkpoint yet")
    rows = [[str(c.step), stamp(c.written), f"{c.nbytes / 1e6:.3f}"] for c in d.checkpoints]
    return table(["step", "written", "MB"], rows)


def failure_section(d: ReportData) -> str:
    if d.failure:
        return f'<p class="bad">{esc(d.failure)}</p>'
    if d.facts.state in ("failed", "timeout", "cancelled", "preempted", "missing", "submit_failed"):
        return f'<p class="bad">{esc(d.facts.reason or d.facts.state)}</p>'
    return none(f"no failure: the run is {d.facts.state}")


def nodes_section(d: ReportData) -> str:
    if not d.blames:
        return none("no node blamed: no node check, failure or straggler watch named one")
    rows = [[b.node, b.kind, b.cause, rank_text(b.ranks) if b.ranks else "-", b.source or "-",
             (f"job {b.job}" if b.job else "-") + f", restart {b.restart}"] for b in d.blames]
    return table(["node", "kind", "cause", "ranks", "source", "attempt"], rows)


def evaluation_section(d: ReportData) -> str:
    parts = []
    if d.final:
        rows = [[k, f"{v:.4g}" if isinstance(v, float) else str(v)] for k, v in d.final.items()
                if k not in ("time", "final") and isinstance(v, int | float) and not isinstance(v, bool)]
        parts.append("<p>The run's final record:</p>" + table(["metric", "value"], rows))
    if d.scores:
        headers, rows = score_rows(d.scores)
        if rows:
            parts.append("<p>Evaluation scores (scores.json):</p>" + table(headers, rows))
    return "".join(parts) or none(no_evaluation(d))


def no_evaluation(d: ReportData) -> str:
    """Why the evaluation section is empty: not yet, or never for this run (and how to get one)."""
    f = d.facts
    if not f.ended:
        return "no evaluation yet (the run writes its final record when it finishes)"
    if f.state == "completed":
        return ("no evaluation for this run: its model gave no evaluation at the end of training (metrics.jsonl has "
                f"no final record) and no scores.json is beside it; `hpctrain report {f.title} --with DIR` adds the "
                "scores.json in DIR (`hpctrain demo` writes one for its FFN run)")
    stopped = f"no evaluation for this run: it ended ({f.state}) before the end of training, where its model's " \
        "evaluation is written"
    if d.checkpoints:
        return (f"{stopped}; `hpctrain resume {f.title}` trains on from its checkpoint of step "
                f"{d.checkpoints[-1].step} and evaluates at the end")
    return f"{stopped}; it has no checkpoint to resume from: submit the job again to train and evaluate it"


def segmentation_section(d: ReportData) -> str:
    if not d.slices:
        return none(d.slices_note or "no segmentation in the run's files")
    return _figure(lambda: figures.segmentation_figure(d.slices), "segmentation")


TITLES = {"summary": "Run", "loss": "Loss and learning rate", "throughput": "Samples per second",
          "step-time": "Where a step's time goes", "ranks": "Busy time per rank", "plan": "Measured against the plan",
          "checkpoints": "Checkpoints", "failure": "Failure", "nodes": "Nodes", "evaluation": "Evaluation",
          "segmentation": "Segmentation slices"}
BUILDERS: dict[str, Callable[[ReportData], str]] = {
    "summary": summary, "loss": loss_section, "throughput": throughput_section, "step-time": step_section,
    "ranks": ranks_section, "plan": plan_section, "checkpoints": checkpoints_section, "failure": failure_section,
    "nodes": nodes_section, "evaluation": evaluation_section, "segmentation": segmentation_section}


def page(d: ReportData, refresh_s: float | None = None) -> str:
    """The whole page; ``refresh_s``: reload itself that often (served mode, while the run goes on)."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_s:g}">' if refresh_s else ""
    body = "".join(f'<section id="{s}"><h2>{TITLES[s]}</h2>{BUILDERS[s](d)}</section>' for s in SECTIONS)
    made = stamp(time.time())
    live = f" — live, reloads every {refresh_s:g} s" if refresh_s else ""
    text = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{refresh}'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>hpctrain report: {esc(d.facts.title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>hpctrain report: {esc(d.facts.title)}</h1><p class=\"muted\">made {made}{live}</p>"
            f"{body}</body></html>\n")
    return without_controls(text)
