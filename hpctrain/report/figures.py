"""The report's figures: matplotlib, drawn to SVG text that the page embeds (no files beside the page, no script).

Lines are thinned to at most MAX_POINTS points each so that a long run's page stays small; the heat map is an
image inside its SVG.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

from hpctrain.report.collect import Mark, RankTimes, ReportData
from hpctrain.text import printable

MAX_POINTS = 1500
WIDE, TALL = 9.0, 3.2
ATTEMPT_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                                "axes.spines.right": False, "svg.hashsalt": "hpctrain"})
    import matplotlib.pyplot as plt

    return plt


def shown(text: str) -> str:
    """Text from a run's files as a figure shows it: as written (control characters escaped, as the page escapes
    them; dollar signs literal, not the start of TeX that matplotlib would parse)."""
    return printable(text).replace("$", r"\$")


def svg(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no fixed pixel size: it scales with the page)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _pyplot().close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.DOTALL)
    text = re.sub(r'\s+xmlns:(?:dc|cc|rdf)="[^"]*"', "", text)
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="figure"', text, count=1)


def thin(xs: list[float], ys: list[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """Every k-th point so that at most ``limit`` remain (the last is always kept)."""
    if len(xs) <= limit:
        return xs, ys
    k = math.ceil(len(xs) / limit)
    keep = list(range(0, len(xs), k))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def _by_attempt(records: list[dict[str, Any]], key: str, x: str) -> dict[int, tuple[list[float], list[float]]]:
    out: dict[int, tuple[list[float], list[float]]] = {}
    for r in records:
        if isinstance(r.get(key), int | float) and isinstance(r.get(x), int | float) and math.isfinite(r[key]):
            xs, ys = out.setdefault(int(r.get("attempt", 0)), ([], []))
            xs.append(float(r[x]))
            ys.append(float(r[key]))
    return out


def _marks(ax: Any, marks: list[Mark], at: str, start: float = 0.0) -> None:
    for m in marks:
        x = m.step if at == "step" else (m.time - start) / 60.0
        ax.axvline(x, color="#555", linestyle="--", linewidth=1)
        ax.annotate(shown(m.label), (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=8, color="#555")


def _continuous(ax: Any, series: dict[int, tuple[list[float], list[float]]]) -> None:
    """One line through every attempt in order (the run's curve), each attempt's points in its own colour."""
    xs = [v for a in sorted(series) for v in series[a][0]]
    ys = [v for a in sorted(series) for v in series[a][1]]
    lx, ly = thin(xs, ys)
    ax.plot(lx, ly, color="#444", linewidth=1.2, zorder=1)
    for attempt, (axs, ays) in sorted(series.items()):
        axs, ays = thin(axs, ays, MAX_POINTS // max(1, len(series)))
        ax.scatter(axs, ays, s=9, color=ATTEMPT_COLOURS[attempt % len(ATTEMPT_COLOURS)], zorder=2,
                   label=f"attempt {attempt + 1}")


def loss_figure(data: ReportData) -> str:
    """Loss (and the learning rate) against step and against wall time, every attempt on one axis."""
    return svg(draw_loss(data))


def draw_loss(data: ReportData) -> Any:
    """The loss figure (matplotlib's Figure); the legend naming the attempts sits above the plot, off the points."""
    plt = _pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(WIDE, TALL))
    start = min(r["time"] for r in data.records if isinstance(r.get("time"), int | float))
    timed = [{**r, "minutes": (r["time"] - start) / 60.0} for r in data.records
             if isinstance(r.get("time"), int | float)]
    for ax, source, x, label in ((by_step, data.records, "step", "step"),
                                 (by_time, timed, "minutes", "wall time since the first record (min)")):
        _continuous(ax, _by_attempt(source, "loss", x))
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        _marks(ax, data.marks, "step" if x == "step" else "time", start)
    lr = _by_attempt(data.records, "lr", "step")
    if lr:
        twin = by_step.twinx()
        xs = [v for a in sorted(lr) for v in lr[a][0]]
        ys = [v for a in sorted(lr) for v in lr[a][1]]
        xs, ys = thin(xs, ys)
        twin.plot(xs, ys, color="#999", linewidth=1, linestyle=":", label="learning rate")
        twin.set_ylabel("learning rate", color="#777")
        twin.spines["right"].set_visible(True)
    attempts = len({r.get("attempt", 0) for r in data.records})
    if attempts > 1 and by_step.get_legend_handles_labels()[0]:  # no loss logged: no points, no legend
        by_step.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), borderaxespad=0.0, ncol=min(attempts, 4),
                       fontsize=8, frameon=False, handletextpad=0.2, columnspacing=1.0)
    fig.tight_layout()
    return fig


def throughput_figure(data: ReportData) -> str:
    """Samples per second of the whole run (the slowest rank's rate times the ranks) against step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDE, TALL * 0.8))
    rows = [{**r, "total_rate": r["per_rank_rate"] * int(r.get("ranks", 1))} for r in data.records
            if isinstance(r.get("per_rank_rate"), int | float)]
    _continuous(ax, _by_attempt(rows, "total_rate", "step"))
    _marks(ax, data.marks, "step")
    ax.set_xlabel("step")
    ax.set_ylabel(f"{shown(data.sample_unit)}/s (all ranks)")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    return svg(fig)


STEP_PARTS = (("input_s", "input", "#8c564b"), ("compute_s", "compute", "#1f77b4"),
              ("reduction_wait_s", "reduction wait", "#d62728"), ("control_s", "control (stop vote)", "#ff7f0e"))


def step_parts(profile: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(part, mean seconds per step, colour), the time between steps (metrics, saves) last."""
    parts = []
    for key, label, colour in STEP_PARTS:
        stat = profile.get(key)
        if isinstance(stat, dict) and isinstance(stat.get("mean"), int | float):
            parts.append((label, float(stat["mean"]), colour))
    loop, step = profile.get("loop_s"), profile.get("step_s")
    if isinstance(loop, dict) and isinstance(step, dict) and loop.get("count"):
        control = next((s for label, s, _ in parts if label.startswith("control")), 0.0)
        parts.append(("between steps", max(0.0, loop["mean"] - step["mean"] - control), "#7f7f7f"))
    return parts


def step_split_figure(profile: dict[str, Any]) -> str:
    plt = _pyplot()
    parts = step_parts(profile)
    fig, ax = plt.subplots(figsize=(WIDE, 1.2))
    left = 0.0
    for label, seconds, colour in parts:
        ax.barh([0], [seconds * 1e3], left=[left], color=colour, label=f"{label} {seconds * 1e3:.2f} ms")
        left += seconds * 1e3
    ax.set_yticks([])
    ax.set_xlabel("ms per step (mean over the timed steps of the newest attempt)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(parts), fontsize=8, frameon=False)
    fig.tight_layout()
    return svg(fig)


def heatmap_figure(ranks: RankTimes) -> str:
    """Busy time per step of each rank (or node) per logging interval; the slowest row is named."""
    plt = _pyplot()
    rows = len(ranks.rows)
    fig, ax = plt.subplots(figsize=(WIDE, min(8.0, 2.0 + 0.16 * rows)))
    values = [[math.nan if v is None else v * 1e3 for v in row] for row in ranks.values]
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis",
                      extent=(-0.5, len(ranks.steps) - 0.5, rows - 0.5, -0.5))
    ax.set_xlabel("logging interval (ends at step)")
    ticks = list(range(0, len(ranks.steps), max(1, len(ranks.steps) // 10)))
    ax.set_xticks(ticks, [str(ranks.steps[i]) for i in ticks])
    listed = list(range(0, rows, max(1, rows // 16)))
    ax.set_yticks(listed, [shown(ranks.rows[i]) for i in listed], fontsize=7)
    slowest = ranks.slowest()
    if slowest is not None:
        against = slowest.comparison(digits=2)
        ax.set_title(shown(f"slowest: {slowest.name}, {slowest.busy * 1e3:.2f} ms busy per step"
                           + (f" ({against})" if against else "")))
    fig.colorbar(image, ax=ax, label="busy ms per step\n(input + compute)", fraction=0.04, pad=0.02)
    fig.tight_layout()
    return svg(fig)


def efficiency_figure(predicted: float, measured: float | None) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDE, 1.4))
    labels = ["predicted (hpctrain plan)", "measured"]
    values = [predicted, measured if measured is not None else 0.0]
    ax.barh(labels, values, color=["#7f7f7f", "#1f77b4"])
    for i, v in enumerate(values):
        ax.annotate(f"{v:.2f}" if (i == 0 or measured is not None) else "-", (v, i), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(0, max(1.05, max(values) * 1.15))
    ax.set_xlabel("efficiency (per-rank throughput against one rank alone)")
    fig.tight_layout()
    return svg(fig)


def segmentation_figure(slices: list[tuple[str, Any]]) -> str:
    """Label slices, each object in its own colour (labels shuffled so that neighbours differ)."""
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(slices), figsize=(3.0 * len(slices), 3.0), squeeze=False)
    palette = np.random.default_rng(0).uniform(0.15, 1.0, size=(4096, 3))
    for ax, (title, labels) in zip(axes[0], slices, strict=True):
        labels = np.asarray(labels)
        rgb = palette[labels % len(palette)]
        rgb[labels == 0] = 0.0
        ax.imshow(rgb, interpolation="nearest")
        ax.set_title(shown(title), fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    return svg(fig)
