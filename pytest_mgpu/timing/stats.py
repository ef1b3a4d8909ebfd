"""Pure statistics of the timing gate, without scipy (an optional extra) and without pytest or torch.

Kept apart from the rules that use them, as asv keeps ``_stats.py``: Mann-Whitney U (information
in the report), Student's t distribution (the gate's prediction interval), mean and spread.
``tests/test_timing_stats.py`` checks both against scipy where scipy is installed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class MannWhitney:
    """One-sided Mann-Whitney U test of "x tends to be larger than y"."""

    u: float  # U statistic of x
    p_greater: float  # p-value of H1: x stochastically larger than y
    p_less: float  # p-value of H1: x stochastically smaller than y


def ranks(values: Sequence[float]):
    """Mid-ranks (1-based) of ``values`` and the sizes of tied groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mid = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mid
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def normal_sf(z: float) -> float:
    """Survival function of the standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """U test with the normal approximation, tie correction and continuity correction."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney needs at least one sample on each side")
    rk, ties = ranks(list(x) + list(y))
    u1 = sum(rk[:n1]) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:  # every value tied: no evidence either way
        return MannWhitney(u1, 1.0, 1.0)
    sd = math.sqrt(var)
    u2 = n1 * n2 - u1
    p_greater = min(1.0, normal_sf((u1 - mu - 0.5) / sd))
    p_less = min(1.0, normal_sf((u2 - mu - 0.5) / sd))
    return MannWhitney(u1, p_greater, p_less)


def min_p(n_x: int, n_y: int) -> float:
    """The smallest one-sided p-value that samples of these sizes can give (complete separation)."""
    return mann_whitney([float(n_y + i) for i in range(n_x)], [float(i) for i in range(n_y)]).p_greater


def mean_sd(xs: Sequence[float]):
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_sf``; exact to ~1e-10). Kept per (p, df):
    the gate asks the same few (1 - alpha at 4-29 degrees of freedom, for every launch and every
    history length ``launches_needed`` tries), and each bisection evaluates ``t_sf`` up to 200 times."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0
