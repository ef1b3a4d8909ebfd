"""The revision lane (``--mgpu-against=REV``): every ``dist.benchmark`` measured again, in two sets of
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
is spent. The budget is BUDGET_FACTOR x the benchmark's ``min_run_time``, and at least what
PAIRS_GOAL pairs of the step take (``lane_budget``), in BLOCKS blocks; a verdict still unsettled then
(unstable, or "same" across an edge of the band: a noisy machine) gets BLOCKS more blocks, up to
CAP_FACTOR x the budget, so that a loaded runner answers more often instead of saying "unstable".
A turn runs as many iterations as last about TURN_S (at least one).
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
from typing import List, Optional, Sequence, Tuple, Union

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
BLOCKS = 2  # blocks of pairs per budget: the two sets of ranks swap roles between blocks (ranksets)


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


@dataclass(frozen=True)
class Version:
    """One side's code: the function as it resolves there, and what goes first on sys.path."""

    name: str  # "head" or "base"
    fn: FnRef
    path_first: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Side:
    """One side in one block: the set of ranks that runs it, the function, what goes first on sys.path."""

    name: str  # "head" or "base"
    launcher: Launcher
    fn: FnRef
    path_first: Tuple[str, ...] = ()


class BaseFailed(Exception):
    """REV's code raised (or its ranks died) while being set up or timed."""


class SwapFailed(Exception):
    """A block after the sets swapped roles failed where the first block had not: most likely a module
    of the repository that cannot be imported twice in one process (it registers a global name that
    refuses a second registration). The lane measures again without swapping (``RevisionLane``)."""


@dataclass
class Duet:
    """The raw pairs of one lane measurement."""

    head: List[float] = field(default_factory=list)  # per pair: the head turn's median iteration
    base: List[float] = field(default_factory=list)
    head_first: List[bool] = field(default_factory=list)
    head_samples: List[float] = field(default_factory=list)
    base_samples: List[float] = field(default_factory=list)
    blocks: List[int] = field(default_factory=list)  # per pair: its block (the sets swap roles between blocks)
    iterations: int = 1  # per turn (the head's, in the first block)
    wall_s: float = 0.0
    missing: str = ""  # the base could not resolve the function: new in this change

    def extend(self, block: "Duet", number: int) -> None:
        """Add one block's pairs, numbered ``number``."""
        if not self.head:
            self.iterations = block.iterations
        self.head += block.head
        self.base += block.base
        self.head_first += block.head_first
        self.head_samples += block.head_samples
        self.base_samples += block.base_samples
        self.blocks += [number] * len(block.head)


def _label(spec: LaunchSpec, side: str) -> LaunchSpec:
    return dataclasses.replace(spec, label=f"{spec.label} [revision lane: {side}]")


def _call(side: Side, spec: LaunchSpec, payload: bytes, forget: Tuple[str, ...], loop: LoopConfig, turns: Turns,
          out: dict) -> None:
    ref, packed = pack_call(duet_loop, (side.fn, payload, side.path_first, forget, loop, turns), {})
    try:
        out[side.name] = list(side.launcher.run(_label(spec, side.name), ref, packed).values)
    except BaseException as exc:  # noqa: B036 - carried to the caller's thread, re-raised there
        out[side.name] = exc


def run_duet(head: Version, base: Version, sets: Sequence[Launcher], spec: LaunchSpec, payload: bytes,
             loop: LoopConfig, budget_s: float, store: StoreServer, rng: Optional[random.Random] = None,
             threshold: float = 0.10, forget: Tuple[str, ...] = (), swap: bool = True) -> Duet:
    """Blocks of pairs on the two sets of ranks ``sets``, which swap roles from block to block (set 0
    runs the head in even blocks, the base in odd ones: ``ranksets`` says why), BLOCKS blocks per
    ``budget_s``. A verdict still unsettled then (unstable, or "same" across an edge of the band) gets
    BLOCKS more blocks, up to CAP_FACTOR x the budget. ``forget``: the folders whose modules a rank
    drops before each block (the repository and REV's worktree), so that it imports its role's.
    ``swap=False``: set 0 runs the head in every block and the ranks forget only before the first
    (``SwapFailed``)."""
    rng = rng or random.Random()
    for launcher, name in zip(sets, ("set 0", "set 1")):  # start both pools, one after the other
        ref, packed = pack_call(warm_ranks, (), {})
        launcher.run(_label(spec, name), ref, packed)
    duet = Duet()
    t0 = time.monotonic()
    block = 0
    while True:
        for _ in range(BLOCKS):
            first, second = (sets[1], sets[0]) if swap and block % 2 else (sets[0], sets[1])
            try:
                got = run_block(Side("head", first, head.fn, head.path_first),
                                Side("base", second, base.fn, base.path_first), spec, payload, loop,
                                budget_s / BLOCKS, store, rng, forget if swap or block == 0 else ())
            except (RankFailure, BaseFailed) as exc:
                if swap and block > 0:
                    raise SwapFailed(_first_line(exc)) from None
                raise
            if got.missing:
                return dataclasses.replace(duet, missing=got.missing, wall_s=time.monotonic() - t0)
            duet.extend(got, block)
            block += 1
        settled = judge_pairs(duet.head, duet.base, threshold, duet.blocks).settled
        if settled or (block // BLOCKS + 1) * budget_s > CAP_FACTOR * budget_s + 1e-9:
            duet.wall_s = time.monotonic() - t0
            return duet


def run_block(head: Side, base: Side, spec: LaunchSpec, payload: bytes, loop: LoopConfig, budget_s: float,
              store: StoreServer, rng: random.Random, forget: Tuple[str, ...] = ()) -> Duet:
    """One block: both sides at once, taking turns through ``store`` until ``budget_s`` is spent. The
    base runs in a thread; when either side fails, the other's ranks (waiting for it in the store)
    are ended."""
    seed = rng.randrange(2**31)
    rdv = store.new_rendezvous()
    turns = {s.name: Turns(rdv.host, rdv.port, rdv.prefix, s.name, seed, budget_s, TURN_S, spec.timeout_s)
             for s in (head, base)}
    got: dict = {}
    t0 = time.monotonic()
    thread = threading.Thread(target=_base_call, args=(base, head, spec, payload, forget, loop, turns["base"], got),
                              name="mgpu-revision-base", daemon=True)
    thread.start()
    try:
        _call(head, spec, payload, forget, loop, turns["head"], got)
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


def _base_call(base: Side, head: Side, spec: LaunchSpec, payload: bytes, forget: Tuple[str, ...], loop: LoopConfig,
               turns: Turns, out: dict) -> None:
    """The base's call (in a thread). When it fails, the head's ranks wait for it in the store: before
    the two sides met, tell them (they stop and return); after, end them (``BaseFailed`` follows)."""
    _call(base, spec, payload, forget, loop, turns, out)
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
    """The lane of one pytest process: worktrees per repository, two sets of warm ranks."""

    def __init__(self, rev: str, threshold: float):
        self.rev = rev
        self.threshold = threshold
        self.worktrees = Worktrees(rev)
        self._sets: Tuple[Launcher, ...] = ()
        self.store = StoreServer()  # where the two sides hand turns over
        self.no_swap = ""  # why the sets keep their roles, once a swap failed: for the rest of the session

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
                timeout: Optional[float], step_s: Optional[float] = None) -> RevisionResult:
        checkout = self.worktrees.checkout(test_file)
        budget = lane_budget(loop.min_run_time, step_s)
        result = RevisionResult(checkout.rev, checkout.commit, checkout.short, checkout.dirty,
                                RevisionVerdict(RevisionStatus.NEW, threshold=self.threshold), budget_s=budget)
        base_file = checkout.base_path(ref.file)
        if base_file is not None and not os.path.exists(base_file):
            assert ref.file is not None  # base_path found a path for it
            rel = os.path.relpath(os.path.realpath(ref.file), checkout.repo)
            return self._unjudged(result, RevisionStatus.NEW, f"new in this change: {rel} does not exist at "
                                                              f"{checkout.label}")
        spec = dist.spec(1 if single_process else dist.world_size, timeout)
        head = Version("head", ref)
        base = Version("base", FnRef(ref.module, ref.qualname, base_file or ref.file), checkout.path_first(sys.path))
        forget = (checkout.repo, checkout.path)
        try:
            try:
                duet = run_duet(head, base, self.sets(), spec, payload, loop, budget, self.store,
                                threshold=self.threshold, forget=forget, swap=not self.no_swap)
            except SwapFailed as exc:  # the module fails the same way in every later measurement
                self.forget_sets()
                self.no_swap = (f"measured without swapping the sets of ranks, so a set's own speed is not "
                                f"cancelled: after a swap a rank failed ({exc}); a module of the repository "
                                "that cannot be imported twice in one process does that")
                duet = run_duet(head, base, self.sets(), spec, payload, loop, budget, self.store,
                                threshold=self.threshold, forget=forget, swap=False)
        except BaseFailed as exc:
            self.forget_sets()  # the head's ranks were ended if the base failed while they took turns
            return self._unjudged(result, RevisionStatus.BASE_FAILED, f"{checkout.label}'s code failed: {exc}")
        except BaseException:
            self.forget_sets()  # the base's ranks were ended: they waited for the failed head
            raise
        if duet.missing:
            return self._unjudged(result, RevisionStatus.NEW, f"new in this change: {ref.qualname} cannot be "
                                                              f"imported at {checkout.label} ({duet.missing})")
        verdict = judge_pairs(duet.head, duet.base, self.threshold, duet.blocks)
        if self.no_swap:
            verdict = dataclasses.replace(verdict, note="; ".join(n for n in (verdict.note, self.no_swap) if n))
        return dataclasses.replace(
            result, verdict=verdict,
            head_median_s=statistics.median(duet.head_samples), base_median_s=statistics.median(duet.base_samples),
            pairs_head=duet.head, pairs_base=duet.base, head_first=duet.head_first, pairs_block=duet.blocks,
            iterations=duet.iterations, wall_s=duet.wall_s)

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
                timeout: Optional[float], step_s: Optional[float] = None) -> RevisionResult:
        return self.lane.measure(dist, self.test_file, ref, payload, loop, single_process, timeout, step_s)
