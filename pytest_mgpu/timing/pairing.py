"""The revision lane's verdict: the head/base ratio of interleaved pairs, with a bootstrap interval.

Pure statistics (no torch, no pytest, no processes): ``judge_pairs`` is the one function that
decides a revision-lane row, in pytest and in ``python -m pytest_mgpu compare`` alike.

Each pair is one batch of iterations on the head's ranks and one on the base's, seconds apart, in
random order ("duet" benchmarking: randomized multiple interleaved trials, Abedi & Brecht 2017;
Bulej et al. 2020). Both batches see the same load, so their ratio cancels the machine's drift that
swamps comparisons between launches (docs/design/revision-lane.md: a 25% heavier step measured 0.92-1.72x its base
between launches under load, 1.23-1.29x interleaved). Per pair the statistic is ln(head / base) of
the batches' median iteration times (each iteration is its slowest rank's time, as in
``Measurement``); over the pairs it is the 20% trimmed mean, which keeps the mean's efficiency on a
quiet machine and ignores the batches a loaded machine preempts (up to 20% at each end).

The interval is the bootstrap percentile interval over pairs, at LEVEL = 99%. The decisions are
one-sided at each end, so a change exactly at the threshold is called slower (or faster) with at
most 0.5%; an unchanged revision lies a whole threshold (10%) away from either edge, so it is
practically never called either (``benchmarks/timing/gate_power.py`` measures it). 95% would leave 2.5% at
the edge, 50 times what the goal of <= 1% false alarms per measurement allows once the interval's
own inexactness with 10-40 heavy-tailed pairs is added; 99.9% would need about 1.5x the pairs for
the same power.

"unstable": an interval that decides neither way (not wholly above 1 + t, not wholly below 1 - t)
and is wider than the "same" band itself, ln(1 + t) - ln(1 - t) for threshold t (0.20 in log space
at 10%, about x1.22 from end to end). Such an interval can hold a slowdown at the threshold and a
speed-up at the threshold at once: the data cannot tell a regression from an improvement, so
"same" would claim what was not measured. An interval wholly beyond an edge decides whatever its
width (a 3.5x slowdown measured at load 9 as x3.15..x4.27 is slower, not unstable). Power is not
lost to the bound where the goal is set: for >= 95% power at +25% with t = 10%, the interval's lower
end must clear +10%, which needs a standard error <= 0.030 and so a width of about 0.156 < 0.20. An
unstable row is never slower or faster (as an unstable history-lane measurement is never either),
and fewer than MIN_PAIRS pairs are unstable whatever they say.
"""
from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Tuple

LEVEL = 0.99
RESAMPLES = 4000  # 0.5% tails are then the 20th value from each end
TRIM = 0.2
MIN_PAIRS = 10  # fewer pairs cannot make a 99% bootstrap interval worth its name
MIN_BLOCK_PAIRS = 4  # a block's pairs are resampled among themselves: fewer would understate its spread


class RevisionStatus(str, Enum):
    """The revision lane's verdict on one measurement (identifiers; ``messages`` words them)."""

    SAME = "same"
    SLOWER = "slower"
    FASTER = "faster"
    UNSTABLE = "unstable"  # interval wider than the "same" band, or too few pairs: not judged
    NEW = "new"  # the file or function does not exist at REV: a benchmark new in this change
    BASE_FAILED = "base failed"  # REV's code raised while being set up or timed: not judged
    UNCHANGED = "unchanged"  # the code the head's ranks imported is REV's (``changes``): a pass, not measured further


@dataclass(frozen=True)
class RevisionVerdict:
    status: RevisionStatus
    ratio: Optional[float] = None  # head / base: exp(trimmed mean of the pairs' log ratios)
    low: Optional[float] = None  # the interval's ends, as ratios
    high: Optional[float] = None
    pairs: int = 0
    threshold: float = 0.10
    level: float = LEVEL
    note: str = ""  # why unstable, new or failed, in words

    @property
    def width_bound(self) -> float:
        return band_width(self.threshold)

    @property
    def settled(self) -> bool:
        """Whether more pairs could change this verdict's word: not when unstable (too wide to tell),
        nor when "same" with the interval across an edge of the band (1 + t or 1 - t inside it: the
        change may be at the threshold or beyond). The lane takes more pairs, up to its cap, while a
        verdict is unsettled. Why: measured quiet (gate_power.py, 21 trials each), +25% injected work
        (+21% achieved) was slower in 19 and "same" in 2 whose intervals held 1.10, at the budget's
        end; an unchanged revision's interval (x1.02, width 0.11 in log) lies inside the band, so it
        costs no extra pairs and keeps its verdict."""
        if self.status == RevisionStatus.UNSTABLE:
            return False
        if self.status != RevisionStatus.SAME or self.low is None or self.high is None:
            return True
        edges = (1 + self.threshold, 1 - self.threshold)
        return not any(self.low < edge < self.high for edge in edges)

    def to_dict(self) -> dict:
        return dict(asdict(self), status=self.status.value)

    @classmethod
    def from_dict(cls, d: dict) -> "RevisionVerdict":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**dict(kw, status=RevisionStatus(kw["status"])))


def band_width(threshold: float) -> float:
    """Width in log space of the "same" band between 1 - threshold and 1 + threshold."""
    faster_edge = math.log1p(-threshold) if threshold < 1 else -math.log1p(threshold)
    return math.log1p(threshold) - faster_edge


def trimmed_mean(values: Sequence[float], trim: float = TRIM) -> float:
    xs = sorted(values)
    k = int(len(xs) * trim)
    kept = xs[k:len(xs) - k] or xs
    return math.fsum(kept) / len(kept)


def _seed(values: Sequence[float]) -> int:
    """The same pairs give the same interval, wherever it is computed (pytest, compare, reports)."""
    text = ",".join(f"{v:.12g}" for v in values)
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16)


def _grouped(values: Sequence[float], blocks: Sequence[int]) -> List[List[float]]:
    by: Dict[int, List[float]] = {}
    for v, b in zip(values, blocks):
        by.setdefault(b, []).append(v)
    return [by[b] for b in sorted(by)]


def block_mean(values: Sequence[float], blocks: Sequence[int], trim: float = TRIM) -> float:
    """The mean over blocks of each block's trimmed mean. Every block weighs the same, so a set of
    ranks' own speed, which enters the blocks with alternating signs as the sets swap roles
    (``ranksets``), cancels over an even number of blocks."""
    groups = _grouped(values, blocks)
    return math.fsum(trimmed_mean(g, trim) for g in groups) / len(groups)


def bootstrap_interval(values: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES,
                       blocks: Optional[Sequence[int]] = None) -> Tuple[float, float]:
    """Percentile bootstrap interval of ``block_mean`` (one block when ``blocks`` is None): the pairs
    are resampled with replacement within each block (stratified: the blocks are the design of the
    measurement, not a sample of it)."""
    groups = _grouped(values, [0] * len(values) if blocks is None else blocks)
    rng = random.Random(_seed(values))
    stats = sorted(math.fsum(trimmed_mean(rng.choices(g, k=len(g))) for g in groups) / len(groups)
                   for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    lo = stats[max(0, int(math.floor(tail * resamples)))]
    hi = stats[min(resamples - 1, int(math.ceil((1.0 - tail) * resamples)) - 1)]
    return lo, hi


def log_ratios(head: Sequence[float], base: Sequence[float]) -> List[float]:
    if len(head) != len(base):
        raise ValueError(f"pairs need as many head as base batches, got {len(head)} and {len(base)}")
    return [math.log(h / b) for h, b in zip(head, base) if h > 0 and b > 0]


def _blocks_of(head: Sequence[float], base: Sequence[float], blocks: Optional[Sequence[int]]) -> List[int]:
    if blocks is None:
        return [0] * sum(1 for h, b in zip(head, base) if h > 0 and b > 0)
    if len(blocks) != len(head):
        raise ValueError(f"every pair needs its block, got {len(blocks)} block number(s) for {len(head)} pairs")
    return [k for h, b, k in zip(head, base, blocks) if h > 0 and b > 0]


def judge_pairs(head: Sequence[float], base: Sequence[float], threshold: float,
                blocks: Optional[Sequence[int]] = None) -> RevisionVerdict:
    """The verdict from the pairs' batch times (seconds; head[i] and base[i] are pair i, measured in
    block ``blocks[i]``; None: all in one block)."""
    r = log_ratios(head, base)
    ks = _blocks_of(head, base, blocks)
    n = len(r)
    smallest = min(len(g) for g in _grouped(r, ks)) if r else 0
    if n < MIN_PAIRS or smallest < MIN_BLOCK_PAIRS:
        ratio = math.exp(statistics.median(r)) if r else None
        why = (f"only {n} pair(s) fit in the lane's time budget (at least {MIN_PAIRS} needed)" if n < MIN_PAIRS else
               f"a block of pairs held only {smallest} (at least {MIN_BLOCK_PAIRS} needed)")
        return RevisionVerdict(RevisionStatus.UNSTABLE, ratio, pairs=n, threshold=threshold,
                               note=f"{why}: give this benchmark a larger min_run_time")
    est = block_mean(r, ks)
    lo, hi = bootstrap_interval(r, blocks=ks)
    common: Dict[str, Any] = dict(ratio=math.exp(est), low=math.exp(lo), high=math.exp(hi), pairs=n,
                                  threshold=threshold)
    if lo > math.log1p(threshold):
        return RevisionVerdict(RevisionStatus.SLOWER, **common)
    if threshold < 1 and hi < math.log1p(-threshold):
        return RevisionVerdict(RevisionStatus.FASTER, **common)
    if hi - lo > band_width(threshold):
        return RevisionVerdict(RevisionStatus.UNSTABLE, **common,
                               note=f"the {LEVEL:.0%} interval x{math.exp(lo):.3f}..x{math.exp(hi):.3f} is wider "
                                    f"than the same-band 1 -/+ {threshold:.0%}: the pairs disagree too much to "
                                    "tell; run it on a quieter machine or with a larger min_run_time")
    return RevisionVerdict(RevisionStatus.SAME, **common)
