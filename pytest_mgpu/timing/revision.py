"""The revision lane (``--mgpu-against=REV``): every ``dist.benchmark`` measured again, in two sets of
warm ranks, one importing the working tree and one importing REV, interleaved under one time budget.

Why: between separate launches a shared runner's speed moves more than the regressions a gate must
catch (README, "Measured": log sd 0.10-0.70 between launches), and the in-run reference tracks that
drift only partly. Batches of the head and of the base taken seconds apart see the same machine, so
their ratio cancels it; ``pairing`` judges the ratio of the pairs.

How: the lane owns two launchers of warm ranks (``PoolLauncher``), "head" and "base", apart from the
test's own ranks, so both sides start alike. The base ranks get REV's folders first on ``sys.path``
(``worktree.Checkout.path_first``) and the function's file at REV; pytest-mgpu itself is the
installed one on both sides. Both sides are called at once (one call each, ``revision_rank.duet_loop``):
each sets the step up and warms it up, then they take turns through a TCPStore of the lane, in
pairs whose order is drawn at random, until the budget is spent (BUDGET_FACTOR x the benchmark's
``min_run_time``, and at least what PAIRS_GOAL pairs of the step take: ``lane_budget``); an interval that is still undecided then ("unstable": a noisy machine)
gets more pairs, up to CAP_FACTOR x the budget, so that a loaded runner answers more often instead
of saying "unstable" (the extension looks at the interval's width and place, not at the ratio alone,
and the pairs before it count: at most two looks at the data). A turn runs as many iterations as
last about TURN_S (at least one).
Each iteration's time is its slowest rank's, as in ``Measurement``.
"""
from __future__ import annotations

import dataclasses
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..launch.base import Launcher, LaunchSpec
from ..launch.errors import RankFailure
from ..launch.protocol import FnRef, pack_call
from ..launch.rendezvous import StoreServer
from .inrank import LoopConfig
from .messages import revision_line
from .pairing import RevisionStatus, RevisionVerdict, judge_pairs
from .revision_rank import DuetTiming, Turns, duet_loop, missing_of, pairs_of, warm_ranks
from .worktree import Checkout, Worktrees

BUDGET_FACTOR = 4.0  # lane seconds (both sides) per second of min_run_time: 2x a side's usual time
TURN_S = 0.02  # a turn's iterations last about this long: one iteration of any step over 20 ms
CAP_FACTOR = 3.0  # an interval still undecided at the budget's end may take up to 3x the budget
PAIRS_GOAL = 12  # the budget holds at least this many pairs of the step (MIN_PAIRS is 10)
PAIR_OVERHEAD = 1.25  # a turn's barrier, hand-over and timing on top of its iteration


def lane_budget(min_run_time: float, step_s: Optional[float]) -> float:
    """Seconds of turns for one measurement: BUDGET_FACTOR x ``min_run_time``, and at least the time
    of PAIRS_GOAL pairs of a step of ``step_s`` (the history lane's median of the same benchmark).
    Why: measured on the CPU timing suites (steps of 0.13-0.63 s, min_run_time 0.4 s), a budget of
    1.6 s (4.8 s with the extension) held 5-8 pairs for most rows, fewer than MIN_PAIRS, so 5 of 6
    rows were "unstable", whatever the change. A slow step needs the time its pairs take."""
    floor = PAIRS_GOAL * 2 * step_s * PAIR_OVERHEAD if step_s and step_s > 0 else 0.0
    return max(BUDGET_FACTOR * min_run_time, floor)


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

    head: List[float] = field(default_factory=list)  # per pair: the head turn's median iteration
    base: List[float] = field(default_factory=list)
    head_first: List[bool] = field(default_factory=list)
    head_samples: List[float] = field(default_factory=list)
    base_samples: List[float] = field(default_factory=list)
    iterations: int = 1  # per turn (the head's)
    wall_s: float = 0.0
    missing: str = ""  # the base could not resolve the function: new in this change


def _label(spec: LaunchSpec, side: str) -> LaunchSpec:
    return dataclasses.replace(spec, label=f"{spec.label} [revision lane: {side}]")


def _call(side: Side, spec: LaunchSpec, payload: bytes, loop: LoopConfig, turns: Turns, out: dict) -> None:
    ref, packed = pack_call(duet_loop, (side.fn, payload, side.path_first, loop, turns), {})
    try:
        out[side.name] = list(side.launcher.run(_label(spec, side.name), ref, packed).values)
    except BaseException as exc:  # noqa: B036 - carried to the caller's thread, re-raised there
        out[side.name] = exc


def run_duet(head: Side, base: Side, spec: LaunchSpec, payload: bytes, loop: LoopConfig, budget_s: float,
             store: StoreServer, rng: Optional[random.Random] = None, threshold: float = 0.10) -> Duet:
    """Both sides at once, taking turns through ``store`` until ``budget_s`` is spent. The base runs
    in a thread; when either side fails, the other's ranks (waiting for it in the store) are ended."""
    rng = rng or random.Random()
    seed = rng.randrange(2**31)
    rdv = store.new_rendezvous()
    limit = spec.timeout_s
    turns = {s.name: Turns(rdv.host, rdv.port, rdv.prefix, s.name, seed, budget_s, TURN_S, limit, threshold,
                           CAP_FACTOR * budget_s) for s in (head, base)}
    for side in (head, base):  # start both pools first, one after the other (not in two threads)
        ref, packed = pack_call(warm_ranks, (), {})
        try:
            side.launcher.run(_label(spec, side.name), ref, packed)
        except RankFailure as exc:
            if side is base:
                raise BaseFailed(_first_line(exc)) from None
            raise
    got: dict = {}
    t0 = time.monotonic()
    thread = threading.Thread(target=_base_call, args=(base, head, spec, payload, loop, turns["base"], got),
                              name="mgpu-revision-base", daemon=True)
    thread.start()
    try:
        _call(head, spec, payload, loop, turns["head"], got)
        if isinstance(got["head"], BaseException):
            base.launcher.close()  # its ranks wait for the head in the store
        thread.join()
    except BaseException:
        base.launcher.close()
        raise
    if isinstance(got["head"], BaseException):
        raise got["head"]
    if isinstance(got["base"], BaseException):
        if isinstance(got["base"], RankFailure):
            raise BaseFailed(_first_line(got["base"]))
        raise got["base"]
    return _assemble(got["head"], got["base"], seed, time.monotonic() - t0)


def _base_call(base: Side, head: Side, spec: LaunchSpec, payload: bytes, loop: LoopConfig, turns: Turns,
               out: dict) -> None:
    """The base's call (in a thread). When it fails, the head's ranks wait for it in the store: before
    the two sides met, tell them (they stop and return); after, end them (``BaseFailed`` follows)."""
    _call(base, spec, payload, loop, turns, out)
    if not isinstance(out.get("base"), BaseException):
        return
    import torch.distributed as tdist

    try:
        client = tdist.TCPStore(turns.host, turns.port, is_master=False, timeout=timedelta(seconds=30))
        store = tdist.PrefixStore(turns.prefix, client)
        if not store.check(["ready/base"]):
            store.set("ready/base", "failed")
            return
    except Exception:
        pass
    head.launcher.close()


def _first_line(exc: BaseException) -> str:
    """The failure's first line and the first rank's error, e.g. "rank 0 raised ValueError: ..."."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    cause = next((ln for ln in lines[1:] if ln.startswith("rank ")), "")
    return cause or lines[0]


def _assemble(head: List[DuetTiming], base: List[DuetTiming], seed: int, wall_s: float) -> Duet:
    duet = Duet(wall_s=wall_s, missing=missing_of(base))
    missing_head = missing_of(head)
    if missing_head:
        raise RuntimeError(f"revision lane: the working tree's ranks cannot import the timed function: {missing_head}")
    if duet.missing:
        return duet
    pairs, duet.head_first, duet.head_samples, duet.base_samples = pairs_of(head, base, seed)
    duet.head = [h for h, _ in pairs]
    duet.base = [b for _, b in pairs]
    duet.iterations = head[0].iterations
    return duet


class RevisionLane:
    """The lane of one pytest process: worktrees per repository, two launchers of warm ranks."""

    def __init__(self, rev: str, threshold: float):
        self.rev = rev
        self.threshold = threshold
        self.worktrees = Worktrees(rev)
        self._launchers: Dict[str, Launcher] = {}
        self.store = StoreServer()  # where the two sides hand turns over

    def launcher(self, name: str) -> Launcher:
        if name not in self._launchers:
            from ..launch.pool import PoolLauncher

            self._launchers[name] = PoolLauncher()
        return self._launchers[name]

    def forget(self, name: str) -> None:
        """After a failure: close the launcher (its ranks may have been ended already) and start a
        new one on next use."""
        launcher = self._launchers.pop(name, None)
        if launcher is not None:
            launcher.close()

    def for_test(self, test_file: Union[str, Path]) -> "BoundLane":
        return BoundLane(self, str(test_file))

    def measure(self, dist, test_file: str, ref: FnRef, payload: bytes, loop: LoopConfig, single_process: bool,
                timeout: Optional[float], step_s: Optional[float] = None) -> RevisionResult:
        checkout = self.worktrees.checkout(test_file)
        budget = lane_budget(loop.min_run_time, step_s)
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
            duet = run_duet(head, base, spec, payload, loop, budget, self.store, threshold=self.threshold)
        except BaseFailed as exc:
            self.forget("head")  # ended if the base failed while they took turns
            return self._unjudged(result, RevisionStatus.BASE_FAILED, f"{checkout.label}'s code failed: {exc}")
        except BaseException:
            self.forget("base")  # run_duet ended the base's ranks, which waited for the failed head
            raise
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
                timeout: Optional[float], step_s: Optional[float] = None) -> RevisionResult:
        return self.lane.measure(dist, self.test_file, ref, payload, loop, single_process, timeout, step_s)
