"""The previous regression rule (before the launch history), kept for ``benchmarks/timing/gate_power.py``'s side-by-side
comparison and as information: significantly slower iterations (one-sided Mann-Whitney U) than ONE
stored launch AND a median over the threshold. The gate itself now uses ``rule`` (launch history);
on a shared machine this rule judges the machine's mood between launches (26.5% false alarms).

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
from enum import Enum
from typing import Any, Dict, Final, Optional, Sequence

from .units import fmt_time
from .rule import DEFAULT_THRESHOLD, percent
from .stats import MannWhitney, mann_whitney, min_p

__all__ = ["GateStatus", "MannWhitney", "Verdict", "judge", "mann_whitney", "min_p"]

ALPHA = 0.01  # significance level of the one-sided test


class GateStatus(str, Enum):
    """This rule's verdict (``Verdict.format`` words it)."""

    NEW = "new"  # no baseline for this fingerprint: recorded, never a failure
    SAME = "same"  # no significant and large change
    SLOWER = "slower"  # significant and over the threshold: a regression
    FASTER = "faster"  # significant and over the threshold the other way: re-record the baseline
    UNDECIDABLE = "undecidable"  # so few samples that no outcome could be significant at ALPHA


NEW: Final = GateStatus.NEW
SAME: Final = GateStatus.SAME
SLOWER: Final = GateStatus.SLOWER
FASTER: Final = GateStatus.FASTER
UNDECIDABLE: Final = GateStatus.UNDECIDABLE


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one measurement against its baseline."""

    status: GateStatus
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

    def format(self) -> str:
        """One paragraph that says what was compared and what to do."""
        if self.status == NEW:
            return (f"no baseline for this measurement (median {fmt_time(self.new_median)}): recorded; "
                    "save it with --mgpu-save-timing")
        head = {
            SLOWER: "is slower than its baseline",
            FASTER: "is faster than its baseline",
            SAME: "matches its baseline",
            UNDECIDABLE: "cannot be judged against its baseline",
        }[self.status]
        delta = self.delta
        assert delta is not None  # every status but NEW was judged against a baseline: a ratio
        text = (
            f"{head}: median {fmt_time(self.new_median)} vs baseline {fmt_time(self.baseline_median)} "
            f"(x{self.ratio:.3f}, {delta * 100:+.1f}%; threshold {self.threshold * 100:+.0f}%), "
            f"Mann-Whitney p={self.p_value:.2g} (confidence {percent(self.confidence)}, "
            f"alpha {self.alpha:g}), n={self.n_new} vs {self.n_baseline}"
        )
        if self.baseline_source:
            text += f"; baseline: {self.baseline_source}"
        if self.status == SLOWER:
            text += (". If the slowdown is expected, re-record with --mgpu-save-timing; to only warn, "
                     "use --mgpu-gate=warn")
        elif self.status == FASTER:
            text += ". Re-record with --mgpu-save-timing to tighten the gate"
        elif self.status == UNDECIDABLE:
            text += (f". With so few samples no difference can reach p<{self.alpha:g}: "
                     "time more iterations (repeat=..., at least 5 on each side)")
        return text

    def to_dict(self) -> dict:
        return dict(asdict(self), status=self.status.value)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**dict(kw, status=GateStatus(kw["status"])))


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
    common: Dict[str, Any] = dict(new_median=new_median, baseline_median=base_median, ratio=ratio, threshold=threshold,
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
