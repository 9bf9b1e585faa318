"""Least-squares fit of a few non-negative model parameters to measured points, in plain Python.

Nelder-Mead on the sum of squared residuals; parameters are kept non-negative by evaluating at |x|. Used
to fit what a scaling study does not publish (``ffn_theta``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def _toward(centroid: list[float], worst: list[float], t: float) -> list[float]:
    """The point at ``t`` along the line from the centroid to the worst vertex (t < 0: reflected)."""
    return [c + t * (w - c) for c, w in zip(centroid, worst, strict=True)]


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], step: Sequence[float], *,
                iterations: int = 2000, tolerance: float = 1e-14) -> tuple[list[float], float]:
    """Minimise ``f`` from ``x0`` (initial simplex sides ``step``); returns (x, f(x))."""
    n = len(x0)
    simplex = [list(x0)] + [[x0[j] + (step[j] if j == i else 0.0) for j in range(n)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tolerance:
            break
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = _toward(centroid, worst, -1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = _toward(centroid, worst, -2.0)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = _toward(centroid, worst, 0.5)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink toward the best point
                best = simplex[0]
                simplex = [best] + [[best[j] + 0.5 * (x[j] - best[j]) for j in range(n)] for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = min(range(n + 1), key=values.__getitem__)
    return simplex[i], values[i]


def fit_nonnegative(residuals: Callable[[list[float]], Sequence[float]], x0: Sequence[float],
                    step: Sequence[float], *, minimax: bool = False) -> tuple[list[float], float]:
    """Non-negative parameters minimising the sum of squared ``residuals`` (or, with ``minimax``, the largest
    absolute residual, starting from the least-squares solution); returns (x, the minimised value)."""

    def sse(x: list[float]) -> float:
        return sum(r * r for r in residuals([abs(v) for v in x]))

    def worst(x: list[float]) -> float:
        return max(abs(r) for r in residuals([abs(v) for v in x]))

    x, value = nelder_mead(sse, x0, step)
    if minimax:
        x, value = nelder_mead(worst, x, [0.2 * abs(v) + 1e-12 for v in x])
    return [abs(v) for v in x], value
