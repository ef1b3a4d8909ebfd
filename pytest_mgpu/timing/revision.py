"""The revision lane (``--mgpu-against=REV``): every ``dist.benchmark`` measured again, in two sets of
warm ranks, one importing the working tree and one importing REV, interleaved under one time budget.

Why: between separate launches a shared runner's speed moves more than the regressions a gate must
catch (README, "Measured": log sd 0.10-0.70 between launches), and the in-run reference tracks that
drift only partly. Batches of the head and of the base taken seconds apart see the same machine, so
their ratio cancels it; ``pairing`` judges the ratio of the pairs.

How: the lane owns two launchers of warm ranks (``PoolLauncher``), "head" and "base", apart from the
test's own ranks, so both sides start alike and hold their step between calls. The base ranks get
REV's folders first on ``sys.path`` (``worktree.Checkout.path_first``) and the function's file at REV;
pytest-mgpu itself is the installed one on both sides. First each side sets the step up and warms it
up (in random order); then pairs of batches, the order inside each pair drawn at random, until the
budget (BUDGET_FACTOR x the benchmark's ``min_run_time``) is spent. A batch has as many iterations
as make about PAIRS_GOAL pairs fit in the budget (at least 1). Each iteration's time is its slowest
rank's, as in ``Measurement``.
"""
from __future__ import annotations

import dataclasses
import os
import random
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..launch.base import Launcher, LaunchSpec
from ..launch.errors import RankFailure
from ..launch.protocol import FnRef, pack_call
from .inrank import LoopConfig
from .messages import revision_line
from .pairing import RevisionStatus, RevisionVerdict, judge_pairs
from .revision_rank import BatchTiming, batch_loop, release
from .worktree import Checkout, Worktrees

BUDGET_FACTOR = 4.0  # lane seconds (both sides) per second of min_run_time: 2x a side's usual time
PAIRS_GOAL = 30  # batches are sized so that about this many pairs fit in the budget
MAX_ITERATIONS = 500  # per batch (as inrank.MAX_REPEAT): a sub-millisecond step needs hundreds


@dataclass
class RevisionResult:
    """One measurement's revision lane: what was compared, the pairs, and the verdict."""

    rev: str
    commit: str
    short: str
    dirty: str  # "" or what is uncommitted: the head side measured the working tree as it is
    verdict: RevisionVerdict
    head_median_s: Optional[float] = None  # of every head iteration in the pairs
    base_median_s: Optional[float] = None
    pairs_head: List[float] = field(default_factory=list)  # per pair: the batch's median iteration
    pairs_base: List[float] = field(default_factory=list)
    head_first: List[bool] = field(default_factory=list)
    iterations: int = 0  # per batch
    budget_s: float = 0.0
    wall_s: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.rev}@{self.short}"

    def format(self) -> str:
        return revision_line(self.to_dict())

    def to_dict(self) -> dict:
        return dict(asdict(self), verdict=self.verdict.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "RevisionResult":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**dict(kw, verdict=RevisionVerdict.from_dict(d["verdict"])))


@dataclass(frozen=True)
class Side:
    """One set of ranks: its launcher, the function as it resolves there, what goes first on sys.path."""

    name: str  # "head" or "base"
    launcher: Launcher
    fn: FnRef
    path_first: Tuple[str, ...] = ()


class BaseFailed(Exception):
    """REV's code raised (or its ranks died) while being set up or timed."""


@dataclass
class Duet:
    """The raw pairs of one lane measurement."""

    head: List[float] = field(default_factory=list)
    base: List[float] = field(default_factory=list)
    head_first: List[bool] = field(default_factory=list)
    head_samples: List[float] = field(default_factory=list)
    base_samples: List[float] = field(default_factory=list)
    iterations: int = 1
    wall_s: float = 0.0
    missing: str = ""  # the base could not resolve the function: new in this change
    last_call_s: float = 0.0  # wall time of the last pair's batch calls (mean of the two)


@dataclass
class BatchSizer:
    """Iterations per batch: about PAIRS_GOAL pairs in the budget, but never a batch whose work is
    shorter than a call's own cost. Measured on the 2-core machine at load 5-8, a warm call costs
    8-40 ms (dispatch, the ranks' clean-up) and every iteration a barrier (0.3-1 ms): for a
    sub-millisecond step both dwarf the work, and sizing by the step's time alone gave 4-8 pairs in a
    2 s budget. So the first two pairs (k and 2k iterations) measure the call's wall time, a straight
    line o + k c gives the overhead o and the cost c of an iteration, and k = max(T - o, o) / c for a
    pair's share T of the budget. A step slower than its share needs no probing: one iteration."""

    budget_s: float
    estimate_s: float  # one timed iteration after warmup, the slower side's
    seen: List[Tuple[int, float]] = field(default_factory=list)  # (iterations, wall of one batch call)

    @property
    def share_s(self) -> float:
        return self.budget_s / (2 * PAIRS_GOAL)

    def first(self) -> int:
        return _clamp(self.share_s / self.estimate_s if self.estimate_s > 0 else MAX_ITERATIONS)

    def next(self, k: int, wall_s: float) -> int:
        self.seen.append((k, wall_s))
        if k == 1 and self.estimate_s >= self.share_s / 2:
            return 1
        if len(self.seen) == 1:
            return _clamp(2 * k)
        (k1, w1), (k2, w2) = self.seen[0], self.seen[1]
        if k2 == k1:
            return k2
        cost = max(self.estimate_s, (w2 - w1) / (k2 - k1))
        overhead = max(0.0, w1 - k1 * cost)
        return _clamp(max(self.share_s - overhead, overhead) / cost)


def _clamp(k: float) -> int:
    return int(min(MAX_ITERATIONS, max(1, round(k))))


def _batch(side: Side, spec: LaunchSpec, token: str, payload: bytes, loop: LoopConfig,
           iterations: int) -> List[BatchTiming]:
    ref, packed = pack_call(batch_loop, (token, side.fn, payload, side.path_first, loop, iterations), {})
    this = dataclasses.replace(spec, label=f"{spec.label} [revision lane: {side.name}]")
    try:
        return list(side.launcher.run(this, ref, packed).values)
    except RankFailure as exc:
        if side.name == "base":
            raise BaseFailed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        raise


def _slowest(timings: Sequence[BatchTiming]) -> List[float]:
    return [max(col) for col in zip(*(t.samples for t in timings))]


def run_duet(head: Side, base: Side, spec: LaunchSpec, payload: bytes, loop: LoopConfig, budget_s: float,
             rng: Optional[random.Random] = None) -> Duet:
    """Set both sides up, then pairs of batches in random order until ``budget_s`` is spent."""
    rng = rng or random.Random()
    token = uuid.uuid4().hex
    duet = Duet()
    t0 = time.monotonic()
    try:
        estimates = []
        for side in rng.sample([head, base], 2):
            got = _batch(side, spec, token, payload, loop, 1)  # set up, warm up, one timed: the estimate
            missing = next((t.missing for t in got if t.missing), "")
            if missing:
                if side is head:
                    raise RuntimeError(f"revision lane: the working tree's ranks cannot import {side.fn}: {missing}")
                duet.missing = missing
                return duet
            estimates.append(max(max(t.samples) for t in got))
        sizer = BatchSizer(budget_s, max(estimates))
        duet.iterations = sizer.first()
        start = time.monotonic()
        while not duet.head or time.monotonic() - start < budget_s:
            _pair(duet, head, base, spec, token, payload, loop, rng.random() < 0.5)
            if len(sizer.seen) < 2:
                duet.iterations = sizer.next(duet.iterations, duet.last_call_s)
    finally:
        for side in (head, base):
            _release(side, spec)
        duet.wall_s = time.monotonic() - t0
    return duet


def _pair(duet: Duet, head: Side, base: Side, spec: LaunchSpec, token: str, payload: bytes, loop: LoopConfig,
          head_first: bool) -> None:
    got, walls = {}, []
    for side in ((head, base) if head_first else (base, head)):
        t = time.monotonic()
        got[side.name] = _slowest(_batch(side, spec, token, payload, loop, duet.iterations))
        walls.append(time.monotonic() - t)
    duet.last_call_s = statistics.fmean(walls)
    duet.head.append(statistics.median(got["head"]))
    duet.base.append(statistics.median(got["base"]))
    duet.head_first.append(head_first)
    duet.head_samples += got["head"]
    duet.base_samples += got["base"]


def _release(side: Side, spec: LaunchSpec) -> None:
    ref, packed = pack_call(release, (), {})
    try:
        side.launcher.run(dataclasses.replace(spec, label=f"{spec.label} [revision lane: release]"), ref, packed)
    except Exception:
        pass  # a pool that failed is gone already, and with it what it held


class RevisionLane:
    """The lane of one pytest process: worktrees per repository, two launchers of warm ranks."""

    def __init__(self, rev: str, threshold: float):
        self.rev = rev
        self.threshold = threshold
        self.worktrees = Worktrees(rev)
        self._launchers: Dict[str, Launcher] = {}

    def launcher(self, name: str) -> Launcher:
        if name not in self._launchers:
            from ..launch.pool import PoolLauncher

            self._launchers[name] = PoolLauncher()
        return self._launchers[name]

    def for_test(self, test_file: Union[str, Path]) -> "BoundLane":
        return BoundLane(self, str(test_file))

    def measure(self, dist, test_file: str, ref: FnRef, payload: bytes, loop: LoopConfig, single_process: bool,
                timeout: Optional[float]) -> RevisionResult:
        checkout = self.worktrees.checkout(test_file)
        budget = BUDGET_FACTOR * loop.min_run_time
        result = RevisionResult(checkout.rev, checkout.commit, checkout.short, checkout.dirty,
                                RevisionVerdict(RevisionStatus.NEW, threshold=self.threshold), budget_s=budget)
        base_file = checkout.base_path(ref.file)
        if base_file is not None and not os.path.exists(base_file):
            rel = os.path.relpath(os.path.realpath(ref.file), checkout.repo)
            return self._unjudged(result, RevisionStatus.NEW, f"new in this change: {rel} does not exist at "
                                                              f"{checkout.label}")
        spec = dist.spec(1 if single_process else dist.world_size, timeout)
        head = Side("head", self.launcher("head"), ref)
        base = Side("base", self.launcher("base"), FnRef(ref.module, ref.qualname, base_file or ref.file),
                    checkout.path_first(sys.path))
        try:
            duet = run_duet(head, base, spec, payload, loop, budget)
        except BaseFailed as exc:
            return self._unjudged(result, RevisionStatus.BASE_FAILED, f"{checkout.label}'s code failed: {exc}")
        if duet.missing:
            return self._unjudged(result, RevisionStatus.NEW, f"new in this change: {ref.qualname} cannot be "
                                                              f"imported at {checkout.label} ({duet.missing})")
        return dataclasses.replace(
            result, verdict=judge_pairs(duet.head, duet.base, self.threshold),
            head_median_s=statistics.median(duet.head_samples), base_median_s=statistics.median(duet.base_samples),
            pairs_head=duet.head, pairs_base=duet.base, head_first=duet.head_first, iterations=duet.iterations,
            wall_s=duet.wall_s)

    def _unjudged(self, result: RevisionResult, status: RevisionStatus, note: str) -> RevisionResult:
        return dataclasses.replace(result, verdict=RevisionVerdict(status, threshold=self.threshold, note=note))

    def checkout_for(self, test_file: str) -> Checkout:
        return self.worktrees.checkout(test_file)

    def close(self) -> None:
        for launcher in self._launchers.values():
            launcher.close()
        self._launchers.clear()
        self.worktrees.close()


@dataclass(frozen=True)
class BoundLane:
    """The lane as one test's ``dist`` carries it (``dist.against``): it knows the test's file."""

    lane: RevisionLane
    test_file: str

    def measure(self, dist, ref: FnRef, payload: bytes, loop: LoopConfig, single_process: bool,
                timeout: Optional[float]) -> RevisionResult:
        return self.lane.measure(dist, self.test_file, ref, payload, loop, single_process, timeout)
