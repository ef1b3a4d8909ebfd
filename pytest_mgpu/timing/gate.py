"""The regression rule: a timing fails its baseline only if it is significantly slower (one-sided
Mann-Whitney U on the samples) AND the effect is large (median ratio over the threshold).

Significance alone flags tiny, real but irrelevant shifts (timed samples within a run are tight, so
any drift becomes "significant"); a bare percentage (pytest-benchmark's rule) flags noise when
samples are few and spread. Both together are asv's rule. Implemented here without scipy (an
optional extra): U with mid-ranks, normal approximation, tie and continuity corrections, which
matches ``scipy.stats.mannwhitneyu(..., method="asymptotic")``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from .measure import fmt_time

ALPHA = 0.01  # significance level of the one-sided test
DEFAULT_THRESHOLD = 0.10  # effect size: the median must be this much slower (10%)

class TimingRegressionWarning(UserWarning):
    """A measurement is significantly slower than its baseline, in a run where that only warns."""


# verdict statuses
NEW = "new"  # no baseline for this fingerprint: recorded, never a failure
SAME = "same"  # no significant and large change
SLOWER = "slower"  # significant and over the threshold: a regression
FASTER = "faster"  # significant and over the threshold the other way: re-record the baseline
UNDECIDABLE = "too few samples"  # so few samples that no outcome could be significant at ALPHA


@dataclass(frozen=True)
class MannWhitney:
    """One-sided Mann-Whitney U test of "x tends to be larger than y"."""

    u: float  # U statistic of x
    z: float
    p_greater: float  # p-value of H1: x stochastically larger than y
    p_less: float  # p-value of H1: x stochastically smaller than y
    n_x: int
    n_y: int


def _ranks(values: Sequence[float]):
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


def _sf(z: float) -> float:
    """Survival function of the standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """U test with the normal approximation, tie correction and continuity correction."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney needs at least one sample on each side")
    ranks, ties = _ranks(list(x) + list(y))
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:  # every value tied: no evidence either way
        return MannWhitney(u1, 0.0, 1.0, 1.0, n1, n2)
    sd = math.sqrt(var)
    u2 = n1 * n2 - u1
    p_greater = min(1.0, _sf((u1 - mu - 0.5) / sd))
    p_less = min(1.0, _sf((u2 - mu - 0.5) / sd))
    return MannWhitney(u1, (u1 - mu) / sd, p_greater, p_less, n1, n2)


def min_p(n_x: int, n_y: int) -> float:
    """The smallest one-sided p-value that samples of these sizes can give (complete separation)."""
    return mann_whitney([float(n_y + i) for i in range(n_x)], [float(i) for i in range(n_y)]).p_greater


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one measurement against its baseline."""

    status: str
    new_median: float
    baseline_median: Optional[float] = None
    ratio: Optional[float] = None  # new / baseline medians
    p_value: Optional[float] = None  # of the direction the ratio points to
    threshold: float = DEFAULT_THRESHOLD
    alpha: float = ALPHA
    n_new: int = 0
    n_baseline: int = 0
    baseline_source: str = ""  # file, and a note when its software versions differ

    @property
    def confidence(self) -> Optional[float]:
        return None if self.p_value is None else 1.0 - self.p_value

    @property
    def regression(self) -> bool:
        return self.status == SLOWER

    @property
    def delta(self) -> Optional[float]:
        return None if self.ratio is None else self.ratio - 1.0

    def short(self) -> str:
        """The report's "vs baseline" cell, e.g. ``+23.1% (p=0.001)``."""
        if self.ratio is None:
            return "no baseline"
        text = f"{self.delta * 100:+.1f}%"
        if self.p_value is not None:
            text += f" (p={self.p_value:.2g})"
        return text

    def format(self) -> str:
        """One paragraph that says what was compared and what to do."""
        if self.status == NEW:
            return (f"no baseline for this measurement (median {fmt_time(self.new_median)}): recorded; "
                    "save it with --mgpu-save-baselines")
        head = {
            SLOWER: "is slower than its baseline",
            FASTER: "is faster than its baseline",
            SAME: "matches its baseline",
            UNDECIDABLE: "cannot be judged against its baseline",
        }[self.status]
        text = (
            f"{head}: median {fmt_time(self.new_median)} vs baseline {fmt_time(self.baseline_median)} "
            f"(x{self.ratio:.3f}, {self.delta * 100:+.1f}%; threshold {self.threshold * 100:+.0f}%), "
            f"Mann-Whitney p={self.p_value:.2g} (confidence {_percent(self.confidence)}, "
            f"alpha {self.alpha:g}), n={self.n_new} vs {self.n_baseline}"
        )
        if self.baseline_source:
            text += f"; baseline: {self.baseline_source}"
        if self.status == SLOWER:
            text += (". If the slowdown is expected, re-record with --mgpu-save-baselines; to only warn, "
                     "use --mgpu-gate=warn")
        elif self.status == FASTER:
            text += ". Re-record with --mgpu-save-baselines to tighten the gate"
        elif self.status == UNDECIDABLE:
            text += (f". With so few samples no difference can reach p<{self.alpha:g}: "
                     "time more iterations (repeat=..., at least 5 on each side)")
        return text

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _percent(confidence: float) -> str:
    """99.2%, 99.97%, >99.99%: enough digits to tell confidences apart near 100%."""
    if confidence >= 0.9999:
        return ">99.99%"
    return f"{confidence * 100:.2f}%" if confidence >= 0.99 else f"{confidence * 100:.1f}%"


def judge(
    new: Sequence[float],
    baseline: Optional[Sequence[float]],
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = ALPHA,
    baseline_source: str = "",
) -> Verdict:
    """Compare new step-time samples with a baseline's; both in seconds."""
    if not new:
        raise ValueError("judge() needs at least one new sample")
    new_median = statistics.median(new)
    if not baseline:
        return Verdict(NEW, new_median, threshold=threshold, alpha=alpha, n_new=len(new))
    base_median = statistics.median(baseline)
    ratio = new_median / base_median if base_median > 0 else math.inf
    test = mann_whitney(new, baseline)
    common = dict(new_median=new_median, baseline_median=base_median, ratio=ratio, threshold=threshold,
                  alpha=alpha, n_new=len(new), n_baseline=len(baseline), baseline_source=baseline_source)
    if min_p(len(new), len(baseline)) >= alpha:
        return Verdict(UNDECIDABLE, p_value=min(test.p_greater, test.p_less), **common)
    if ratio >= 1.0:
        p = test.p_greater
        status = SLOWER if (p < alpha and ratio > 1.0 + threshold) else SAME
    else:
        p = test.p_less
        status = FASTER if (p < alpha and ratio < 1.0 / (1.0 + threshold)) else SAME
    return Verdict(status, p_value=p, **common)
