"""The straggler term: a synchronous step lasts as long as its slowest rank.

With per-rank step times drawn independently from a distribution of mean mu and spread sigma, a step of N
ranks takes E[max of N draws] = mu + sigma * e(N), where e(N) is the expected maximum of N standard normal
draws (e(1) = 0, e(2) = 1/sqrt(pi), e(3) = 3/(2 sqrt(pi)), growing like sqrt(2 ln N)).
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

_NORMAL = NormalDist()


@lru_cache(maxsize=4096)
def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normal draws], by Simpson's rule over the density of the maximum."""
    if n < 1:
        raise ValueError(f"need at least one draw, got {n}")
    if n == 1:
        return 0.0
    lo, hi = -9.0, 9.0 + math.sqrt(2 * math.log(n))
    steps = 6000  # even; the density of the maximum is smooth and narrow (width ~ 1/sqrt(2 ln n))
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        cdf = _NORMAL.cdf(x)
        density = n * _NORMAL.pdf(x) * (cdf ** (n - 1) if cdf > 0 else 0.0)
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * x * density
    return total * h / 3


def straggler_delay(sigma_s: float, ranks: int) -> float:
    """Seconds a step of ``ranks`` ranks waits beyond the mean step time for its slowest rank."""
    if sigma_s <= 0 or ranks <= 1:
        return 0.0
    return sigma_s * expected_max_standard_normal(ranks)
