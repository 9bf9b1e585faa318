"""``--plot FILE.png``: efficiency against node count with the loss terms stacked above it to 1.

matplotlib (with numpy) is imported here only, when a plot is asked for; it is the ``plot`` extra.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.errors import ConfigError
from hpctrain.files import atomic_path
from hpctrain.planning.model import LOSS_TERMS, Prediction

COLOURS = {"oversubscription": "#8c564b", "reduction": "#1f77b4", "straggler": "#ff7f0e", "overhead": "#9467bd",
           "input": "#d62728", "checkpoint": "#bcbd22", "startup": "#7f7f7f"}


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` that could not be written — not a .png, or no matplotlib — before any work (a
    calibration run) is done; nothing is imported."""
    import importlib.util

    if Path(path).suffix.lower() != ".png":
        raise ConfigError(f"--plot {path}: write a .png file")
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot needs matplotlib", hint="pip install 'hpctrain[plot]'")


def plot(predictions: list[Prediction], path: str, title: str) -> Path:
    """Write the figure to ``path`` (atomically) and return the path."""
    check_plot_path(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib", hint="pip install 'hpctrain[plot]'") from None
    out = Path(path)
    nodes = [p.nodes for p in predictions]
    efficiency = [p.efficiency for p in predictions]
    layers = [efficiency] + [[p.losses[t] for p in predictions] for t in LOSS_TERMS]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.stackplot(nodes, layers, labels=["efficiency", *LOSS_TERMS],
                 colors=["#2ca02c", *[COLOURS[t] for t in LOSS_TERMS]], alpha=0.85)
    ax.plot(nodes, efficiency, color="black", marker="o", linewidth=1.5)
    if len(nodes) > 1 and max(nodes) / min(nodes) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xlim(min(nodes), max(nodes))
    ax.set_ylim(0, 1)
    ax.set_xlabel("nodes")
    ax.set_ylabel("share of the step")
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8, ncol=4)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it ({exc.strerror})", key="--plot") from None
    finally:
        plt.close(fig)
    return out
