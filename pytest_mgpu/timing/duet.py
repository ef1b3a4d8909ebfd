"""The revision lane's measurement itself: blocks of interleaved pairs on two sets of warm ranks that
swap roles (``run_duet``), and the head side's timings as ``dist.benchmark``'s (``head_timings``).
``revision`` owns the lane of a session (worktrees, the sets of ranks, the verdict); this module
runs one measurement of it and knows nothing of pytest."""
from __future__ import annotations

import dataclasses
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, List, Optional, Sequence, Tuple

from ..launch.base import Launcher, LaunchSpec
from ..launch.errors import RankFailure
from ..launch.protocol import FnRef, pack_call
from ..launch.rendezvous import StoreServer
from .inrank import LoopConfig, RankTiming
from .pairing import judge_pairs
from .revision_rank import DuetTiming, Turns, duet_loop, missing_of, pairs_of, warm_ranks

TURN_S = 0.02  # a turn's iterations last about this long: one iteration of any step over 20 ms
CAP_FACTOR = 3.0  # an interval still undecided at the budget's end may take up to 3x the budget
PAIRS_GOAL = 10  # the budget holds at least this many pairs (MIN_PAIRS), MIN_BLOCK_PAIRS + 1 per block
BLOCKS = 2  # blocks of pairs per budget: the two sets of ranks swap roles between blocks (ranksets)

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
    head_ranks: List[DuetTiming] = field(default_factory=list)  # per rank: the head's turns, every block
    unchanged: str = ""  # why the head's code is REV's (``changes``): the lane stopped after one block

    def extend(self, block: "Duet", number: int) -> None:
        """Add one block's pairs, numbered ``number``."""
        if not self.head:
            self.iterations = block.iterations
        if not self.head_ranks:
            self.head_ranks = [dataclasses.replace(t, samples=list(t.samples), turns=[]) for t in block.head_ranks]
        else:
            for mine, theirs in zip(self.head_ranks, block.head_ranks):
                mine.samples += theirs.samples
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
             threshold: float = 0.10, forget: Tuple[str, ...] = (), swap: bool = True,
             unchanged: Optional[Callable[[Duet], str]] = None) -> Duet:
    """Blocks of pairs on the two sets of ranks ``sets``, which swap roles from block to block (set 0
    runs the head in even blocks, the base in odd ones: ``ranksets`` says why), BLOCKS blocks per
    ``budget_s``. A verdict still unsettled then (unstable, or "same" across an edge of the band) gets
    BLOCKS more blocks, up to CAP_FACTOR x the budget. ``forget``: the folders whose modules a rank
    drops before each block (the repository and REV's worktree), so that it imports its role's.
    ``swap=False``: set 0 runs the head in every block and the ranks forget only before the first
    (``SwapFailed``). ``unchanged``: after the first block, why the head's code is REV's ("" when it
    may not be); when it says so, the duet stops there."""
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
                                budget_s / BLOCKS, store, rng, forget if swap or block == 0 else (),
                                record=block == 0)
            except (RankFailure, BaseFailed) as exc:
                if swap and block > 0:
                    raise SwapFailed(_first_line(exc)) from None
                raise
            if got.missing:
                return dataclasses.replace(duet, missing=got.missing, wall_s=time.monotonic() - t0)
            duet.extend(got, block)
            block += 1
            if block == 1 and unchanged is not None:
                duet.unchanged = unchanged(duet)
                if duet.unchanged:
                    duet.wall_s = time.monotonic() - t0
                    return duet
        settled = judge_pairs(duet.head, duet.base, threshold, duet.blocks).settled
        if settled or (block // BLOCKS + 1) * budget_s > CAP_FACTOR * budget_s + 1e-9:
            duet.wall_s = time.monotonic() - t0
            return duet


def run_block(head: Side, base: Side, spec: LaunchSpec, payload: bytes, loop: LoopConfig, budget_s: float,
              store: StoreServer, rng: random.Random, forget: Tuple[str, ...] = (), record: bool = False) -> Duet:
    """One block: both sides at once, taking turns through ``store`` until ``budget_s`` is spent (at
    least PAIRS_GOAL / BLOCKS pairs). The base runs in a thread; when either side fails, the other's
    ranks (waiting for it in the store) are ended. ``record``: the head records the call's structure
    and peak memory while it sets up."""
    seed = rng.randrange(2**31)
    rdv = store.new_rendezvous()
    goal = -(-PAIRS_GOAL // BLOCKS)
    turns = {s.name: Turns(rdv.host, rdv.port, rdv.prefix, s.name, seed, budget_s, TURN_S, spec.timeout_s,
                           pairs_goal=goal, record=record and s.name == "head")
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
    duet.head_ranks = list(head)
    return duet


def head_timings(duet: Duet) -> List[RankTiming]:
    """The head's side of the pairs as ``dist.benchmark``'s timings: every iteration of its turns in
    every block, per rank; warm-up, peak memory and structure from the first block (no in-run
    reference: the lane's pairs, not the history, judge it)."""
    return [RankTiming(t.rank, [x for turn in t.samples for x in turn], list(t.warmup_samples), t.peak_mem_bytes,
                       t.mem_source, [], list(t.structure)) for t in duet.head_ranks]


