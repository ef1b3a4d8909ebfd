"""The revision lane (``--mgpu-against=REV``): every ``dist.benchmark`` measured in two sets of
warm ranks, one importing the working tree and one importing REV, interleaved under one time budget.

Why: between separate launches a shared runner's speed moves more than the regressions a gate must
catch (docs/design/timing-gate.md: log sd 0.10-0.70 between launches), and the in-run reference tracks that
drift only partly. Batches of the head and of the base taken seconds apart see the same machine, so
their ratio cancels it; ``pairing`` judges the ratio of the pairs.

How: the lane owns two launchers of warm ranks (``PoolLauncher``) apart from the test's own ranks, so
both sides start alike. A measurement is a run of blocks; in each block one set runs the head (the
working tree) and the other the base (REV's folders first on ``sys.path``, ``worktree.Checkout.
path_first``, and the function's file at REV), and the sets swap roles from block to block, with
every rank pinned to the same cores in both sets (``ranksets``: a set of ranks carries a speed of
its own, measured up to 12% in A/A runs, which pairs cannot see and the swap cancels). pytest-mgpu
itself is the installed one on both sides. In a block both sides are called at once (one call each,
``revision_rank.duet_loop``): each sets the step up and warms it up, then they take turns through a
TCPStore of the lane, in pairs whose order is drawn at random, until the block's share of the budget
is spent and the block holds at least its share of PAIRS_GOAL pairs. The budget is BUDGET_FACTOR x
the benchmark's ``min_run_time`` (``lane_budget``), in BLOCKS blocks; a verdict still unsettled then
(unstable, or "same" across an edge of the band: a noisy machine) gets BLOCKS more blocks, up to
CAP_FACTOR x the budget, so that a loaded runner answers more often instead of saying "unstable".
A turn runs as many iterations as last about TURN_S (at least one), sized from the last warm-up
iteration. Each iteration's time is its slowest rank's, as in ``Measurement``.

The head side is the benchmark's measurement (``head_timings``): in the first block it records the
call's structure and peak memory while it sets up, as ``inrank.rank_loop`` does, so ``dist.benchmark``
runs nothing in the test's own ranks unless the lane timed nothing (new in this change, REV failed).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

from ..launch.base import Launcher
from ..launch.protocol import FnRef
from ..launch.rendezvous import StoreServer
from .changes import Changes, changes
from .duet import BLOCKS, CAP_FACTOR, PAIRS_GOAL, TURN_S, BaseFailed, Duet, SwapFailed, Version, head_timings, run_duet
from .inrank import LoopConfig, RankTiming
from .messages import revision_line
from .pairing import RevisionStatus, RevisionVerdict, judge_pairs
from .worktree import Checkout, Worktrees

__all__ = ["BLOCKS", "BUDGET_FACTOR", "CAP_FACTOR", "PAIRS_GOAL", "TURN_S", "BoundLane", "RevisionLane",
           "RevisionResult", "Version", "lane_budget", "run_duet"]

BUDGET_FACTOR = 4.0  # lane seconds (both sides) per second of min_run_time: 2x a side's usual time


def lane_budget(min_run_time: float) -> float:
    """Seconds of turns for one measurement: BUDGET_FACTOR x ``min_run_time``; each block also holds
    at least PAIRS_GOAL / BLOCKS pairs however long they take (``revision_rank``). Why the pairs: on
    the CPU timing suites (steps of 0.13-0.63 s, min_run_time 0.4 s), a budget of 1.6 s (4.8 s with
    the extension) held 5-8 pairs for most rows, fewer than MIN_PAIRS, so 5 of 6 rows were
    "unstable", whatever the change. A slow step needs the time its pairs take."""
    return BUDGET_FACTOR * min_run_time


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
    pairs_block: List[int] = field(default_factory=list)  # per pair: its block (empty: one block)
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


class RevisionLane:
    """The lane of one pytest process: worktrees per repository, two sets of warm ranks."""

    def __init__(self, rev: str, threshold: float):
        self.rev = rev
        self.threshold = threshold
        self.worktrees = Worktrees(rev)
        self._sets: Tuple[Launcher, ...] = ()
        self.store = StoreServer()  # where the two sides hand turns over
        self.no_swap = ""  # why the sets keep their roles, once a swap failed: for the rest of the session
        self._changes: Dict[Tuple[str, str], Changes] = {}  # what differs at REV, per repository

    def sets(self) -> Tuple[Launcher, ...]:
        """The two launchers of warm ranks that take turns (one pool per world size each)."""
        if not self._sets:
            from ..launch.pool import PoolLauncher

            self._sets = (PoolLauncher(), PoolLauncher())
        return self._sets

    def forget_sets(self) -> None:
        """After a failure: close both launchers (some of their ranks were ended) and start new ones
        on next use."""
        for launcher in self._sets:
            launcher.close()
        self._sets = ()

    def for_test(self, test_file: Union[str, Path]) -> "BoundLane":
        return BoundLane(self, str(test_file))

    def measure(self, dist, test_file: str, ref: FnRef, payload: bytes, loop: LoopConfig, single_process: bool,
                timeout: Optional[float]) -> Tuple[RevisionResult, List[RankTiming]]:
        """The lane's measurement, and the head's timings per rank (its turns in every block, its
        warm-up, structure and peak memory from the first block: what ``dist.benchmark`` reports as
        the measurement); none where the lane timed nothing (new in this change, REV's code failed)."""
        checkout = self.worktrees.checkout(test_file)
        budget = lane_budget(loop.min_run_time)
        result = RevisionResult(checkout.rev, checkout.commit, checkout.short, checkout.dirty,
                                RevisionVerdict(RevisionStatus.NEW, threshold=self.threshold), budget_s=budget)
        base_file = checkout.base_path(ref.file)
        if base_file is not None and not os.path.exists(base_file):
            assert ref.file is not None  # base_path found a path for it
            rel = os.path.relpath(os.path.realpath(ref.file), checkout.repo)
            return self._unjudged(result, RevisionStatus.NEW, f"new in this change: {rel} does not exist at "
                                                              f"{checkout.label}"), []
        spec = dist.spec(1 if single_process else dist.world_size, timeout)
        head = Version("head", ref)
        # a closure's own code travels by value (the same on both sides); what it calls is REV's
        base = Version("base", FnRef(ref.module, ref.qualname, base_file or ref.file, ref.blob),
                       checkout.path_first(sys.path))
        forget = (checkout.repo, checkout.path)
        try:
            try:
                duet = run_duet(head, base, self.sets(), spec, payload, loop, budget, self.store,
                                threshold=self.threshold, forget=forget, swap=not self.no_swap,
                                unchanged=self._unchanged_for(checkout))
            except SwapFailed as exc:  # the module fails the same way in every later measurement
                self.forget_sets()
                self.no_swap = (f"measured without swapping the sets of ranks, so a set's own speed is not "
                                f"cancelled: after a swap a rank failed ({exc}); a module of the repository "
                                "that cannot be imported twice in one process does that")
                duet = run_duet(head, base, self.sets(), spec, payload, loop, budget, self.store,
                                threshold=self.threshold, forget=forget, swap=False,
                                unchanged=self._unchanged_for(checkout))
        except BaseFailed as exc:
            self.forget_sets()  # the head's ranks were ended if the base failed while they took turns
            return self._unjudged(result, RevisionStatus.BASE_FAILED, f"{checkout.label}'s code failed: {exc}"), []
        except BaseException:
            self.forget_sets()  # the base's ranks were ended: they waited for the failed head
            raise
        if duet.missing:
            return self._unjudged(result, RevisionStatus.NEW, f"new in this change: {ref.qualname} cannot be "
                                                              f"imported at {checkout.label} ({duet.missing})"), []
        verdict = judge_pairs(duet.head, duet.base, self.threshold, duet.blocks)
        if duet.unchanged:  # the two sides ran the same code: its pairs are kept, no ratio is told (one
            # block cannot cancel a set of ranks' own speed, so it could read several % either way)
            verdict = RevisionVerdict(RevisionStatus.UNCHANGED, pairs=verdict.pairs, threshold=self.threshold,
                                      note=duet.unchanged.replace("REV", checkout.label))
        if self.no_swap:
            verdict = dataclasses.replace(verdict, note="; ".join(n for n in (verdict.note, self.no_swap) if n))
        return dataclasses.replace(
            result, verdict=verdict,
            head_median_s=statistics.median(duet.head_samples), base_median_s=statistics.median(duet.base_samples),
            pairs_head=duet.head, pairs_base=duet.base, head_first=duet.head_first, pairs_block=duet.blocks,
            iterations=duet.iterations, wall_s=duet.wall_s), head_timings(duet)

    def _unchanged_for(self, checkout: Checkout) -> Callable[[Duet], str]:
        """``run_duet``'s question after the first block, from the files that differ at REV (read once
        per repository and REV)."""
        key = (checkout.repo, checkout.commit)
        if key not in self._changes:
            self._changes[key] = changes(checkout)
        found = self._changes[key]
        return lambda duet: found.unchanged([f for t in duet.head_ranks for f in t.imported], checkout.repo)

    def _unjudged(self, result: RevisionResult, status: RevisionStatus, note: str) -> RevisionResult:
        return dataclasses.replace(result, verdict=RevisionVerdict(status, threshold=self.threshold, note=note))

    def checkout_for(self, test_file: str) -> Checkout:
        return self.worktrees.checkout(test_file)

    def close(self) -> None:
        self.forget_sets()
        self.worktrees.close()


@dataclass(frozen=True)
class BoundLane:
    """The lane as one test's ``dist`` carries it (``dist.against``): it knows the test's file."""

    lane: RevisionLane
    test_file: str

    def measure(self, dist, ref: FnRef, payload: bytes, loop: LoopConfig, single_process: bool,
                timeout: Optional[float]) -> Tuple[RevisionResult, List[RankTiming]]:
        return self.lane.measure(dist, self.test_file, ref, payload, loop, single_process, timeout)
