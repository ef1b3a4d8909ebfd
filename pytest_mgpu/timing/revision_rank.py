"""The rank side of the revision lane: set the step up, then take turns with the other side's ranks.

Both sides (the head's ranks and the base's, ``timing.revision``) run ``duet_loop`` at the same time,
one call each per block of pairs. First each rank pins its threads to its cores and forgets the
user's modules of the role it had in the last block (``ranksets``). After setting up and warming up, they take turns through a TCPStore the test process
serves for this measurement: in turn t the side that owns it runs ``iterations`` timed steps (each
after a barrier, as ``inrank`` does) while the other side waits in the store (its ranks idle in a
blocking read), then hands turn t + 1 over. Turns 2p and 2p + 1 are pair p; which side goes first in
a pair is drawn per pair from a seed both sides know. Why turns and not one call per batch: a warm
call costs 8-40 ms at load 5-8 (more than a small step), and between two calls the machine's load
moves; a hand-over through the store costs about a millisecond, so the head and base halves of a
pair are measured back to back.

The side that ends pair p past the block's budget (a deadline on the machine's monotonic clock, the same
for every process), with at least ``Turns.pairs_goal`` pairs taken, writes "stop" for the next turns of
both sides. A turn's iterations are sized from the last warm-up iteration (its barrier included). Only
rank 0 of a side talks to the store; it tells its peers with an all-reduce, so every rank runs the same
collectives.

The user's function and arguments travel as a reference and pickled bytes and are resolved here,
after the base's folders were put first on ``sys.path``: REV's modules, not the working tree's, are
what the base ranks import. pytest-mgpu itself was imported before (this module is part of it), so
it is the installed one on both sides. A function that cannot be imported on this side (its file or
name does not exist at REV) is reported back as ``missing``, and the other side is told, so neither
times anything: the benchmark is new in this change.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import pickle
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Iterator, List, Optional, Set, Tuple

from ..launch.protocol import FnRef
from .inrank import Clock, LoopConfig, recorded_setup, warm_up
from .ranksets import forget_modules, pinned, repository_files
from .structure.figures import StepStructure



def turn_owner(seed: int, t: int) -> str:
    """The side that runs turn ``t``: pair t // 2 draws which side goes first."""
    head_first = random.Random(seed * 1_000_003 + t // 2).random() < 0.5
    first, second = ("head", "base") if head_first else ("base", "head")
    return first if t % 2 == 0 else second


@dataclass(frozen=True)
class Turns:
    """How the two sides take turns, and where they meet."""

    host: str
    port: int
    prefix: str  # the keys of this measurement in the store
    side: str  # "head" or "base"
    seed: int  # which side goes first in each pair
    budget_s: float  # timed turns end after this long (the last pair is completed)
    turn_s: float  # a turn's iterations are sized to last about this long
    wait_s: float  # how long a side waits for the other before giving up (the call's limit)
    max_pairs: int = 100_000
    pairs_goal: int = 0  # the block holds at least this many pairs, however long they take
    record: bool = False  # this side's setup and first steps give the call's structure and peak memory

    def owner(self, t: int) -> str:
        return turn_owner(self.seed, t)

    @property
    def other(self) -> str:
        return "base" if self.side == "head" else "head"


@dataclass
class DuetTiming:
    """What one rank measured; crosses the process boundary."""

    rank: int
    turns: List[int] = field(default_factory=list)  # the turn indices this side ran
    samples: List[List[float]] = field(default_factory=list)  # per turn: each iteration's time
    iterations: int = 0
    warmup_samples: List[float] = field(default_factory=list)
    missing: str = ""  # this side cannot resolve the function (why); "other": the other side cannot
    structure: List[StepStructure] = field(default_factory=list)  # ``Turns.record``: setup and first steps
    peak_mem_bytes: Optional[int] = None
    mem_source: str = ""
    imported: List[str] = field(default_factory=list)  # ``Turns.record``: the repository's files it imported


def _put_first(path_first: Tuple[str, ...]) -> None:
    if path_first:
        sys.path[:0] = list(path_first)
        importlib.invalidate_caches()


def _store(turns: Turns):
    import torch.distributed as tdist

    client = tdist.TCPStore(turns.host, turns.port, is_master=False, timeout=timedelta(seconds=turns.wait_s))
    return tdist.PrefixStore(turns.prefix, client)


class _Referee:
    """Rank 0's side of the store (the other ranks have none): hand-overs, the deadline, stop."""

    def __init__(self, turns: Turns, rank: int):
        self.turns = turns
        self.store = _store(turns) if rank == 0 else None
        self.deadline = math.inf

    def meet(self, ready: str) -> bool:
        """Say this side is ready (or "missing"); True when both sides are ready to time."""
        if self.store is None:
            return False
        self.store.set(f"ready/{self.turns.side}", ready)
        other = self.store.get(f"ready/{self.turns.other}").decode()
        if ready == "ok" and other == "ok" and self.turns.owner(0) == self.turns.side:
            self.store.set("deadline", repr(time.monotonic() + self.turns.budget_s))
            self.store.set("go/0", "run")
        return ready == "ok" and other == "ok"

    def may_run(self, t: int) -> bool:
        if self.store is None:
            return False
        if self.store.get(f"go/{t}").decode() != "run":
            return False
        if self.deadline == math.inf:  # set when turn 0 began
            self.deadline = float(self.store.get("deadline").decode())
        return True

    def hand_over(self, t: int, median: float) -> bool:
        """After turn t (its slowest-rank median): the next turn may run, or both sides stop (True:
        this side stops): at the end of the first pair that ends past the deadline with at least
        ``pairs_goal`` pairs taken."""
        if self.store is None:
            return False
        self.store.set(f"med/{t}", repr(median))
        pairs = (t + 1) // 2
        done = t % 2 == 1 and ((time.monotonic() >= self.deadline and pairs >= self.turns.pairs_goal)
                               or pairs >= self.turns.max_pairs)
        self.store.set(f"go/{t + 1}", "stop" if done else "run")
        if done:
            self.store.set(f"go/{t + 2}", "stop")  # the other side's next turn is t + 1 or t + 2
        return done


def _iterations(turn_s: float, wall: float) -> int:
    """Iterations that fill a turn of ``turn_s``, from one iteration's wall time, barriers included:
    for a sub-millisecond step the barrier before each iteration (1-2 ms at load 5) is most of a turn."""
    return max(1, min(500, round(turn_s / max(wall, 1e-9))))


def _warm(clock: Clock, step, loop: LoopConfig) -> Tuple[List[float], float]:
    """Warm-up iterations, and the slowest rank's wall time of the last one (its barrier included),
    which sizes the turns; with no warm-up (``warmup=0``), one iteration is run to measure it."""
    samples = warm_up(clock, step, loop)
    t0 = time.perf_counter()
    if samples:
        clock.align()  # what ``Clock.time`` adds to the step: the barrier and the device sync
        wall = samples[-1] + time.perf_counter() - t0
    else:
        clock.time(step)
        wall = time.perf_counter() - t0
    return samples, clock.agree_max(wall)


def duet_loop(fn_ref: FnRef, payload: bytes, path_first: Tuple[str, ...], forget: Tuple[str, ...], loop: LoopConfig,
              turns: Turns) -> DuetTiming:
    """Runs in every rank of one side for one block: pinned to this rank's cores, with the other
    revision's modules forgotten (``ranksets``), set up, warm up, then this side's turns until "stop"."""
    from .._context import rank_context

    ctx = rank_context()
    with pinned(ctx.rank, ctx.world_size) as cores, spare_core(cores):
        forget_modules(forget)
        _put_first(path_first)
        out = _take_turns(ctx, fn_ref, payload, loop, turns)
        if turns.record:
            out.imported = repository_files(forget)  # after the steps: their lazy imports too
        return out


@contextlib.contextmanager
def spare_core(cores: Optional[Set[int]]) -> Iterator[None]:
    """Intra-op threads for one core fewer than the rank is pinned to (at least one), then back. Why:
    at every hand-over the other side, the store and the test process need a moment of CPU; with a
    thread on every core one of them waits behind that, and a turn takes its time. Measured on 2 cores
    (one 1-rank set pinned to both): MobileNetV2's pairs scattered with a log sd of 0.27-0.46 on 2
    threads (turns of 45 or 67 ms) and 0.08-0.09 on one; 3 of 4 such rows needed 3x the budget to
    settle on 2 threads, none on one."""
    import torch

    before = torch.get_num_threads()
    if cores and len(cores) > 1:
        torch.set_num_threads(min(before, len(cores) - 1))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _take_turns(ctx, fn_ref: FnRef, payload: bytes, loop: LoopConfig, turns: Turns) -> DuetTiming:
    referee = _Referee(turns, ctx.rank)
    out = DuetTiming(ctx.rank)
    try:
        fn = fn_ref.resolve()
    except (ImportError, AttributeError) as exc:
        out.missing = f"{type(exc).__name__}: {exc}"
        referee.meet("missing")
        return out
    args, kwargs = pickle.loads(payload)
    clock = Clock(ctx)
    if turns.record:
        step, out.peak_mem_bytes, out.mem_source, out.structure = recorded_setup(ctx, clock, fn, args, kwargs)
    else:
        made = fn(*args, **kwargs)
        step = made if callable(made) else (lambda: fn(*args, **kwargs))
    out.warmup_samples, wall = _warm(clock, step, loop)
    out.iterations = _iterations(turns.turn_s, wall)
    if not clock.agree_max(1.0 if referee.meet("ok") else 0.0):
        out.missing = out.missing or "other"
        return out
    if turns.record and clock.cuda:  # the head's peak over its turns, as ``rank_loop`` takes it
        import torch

        for i in clock.cuda:
            torch.cuda.reset_peak_memory_stats(i)
        _turns(clock, referee, turns, step, out)
        out.peak_mem_bytes = sum(int(torch.cuda.max_memory_allocated(i)) for i in clock.cuda)
        return out
    _turns(clock, referee, turns, step, out)
    return out


def _turns(clock: Clock, referee: _Referee, turns: Turns, step, out: DuetTiming) -> None:
    """This side's turns until "stop": each ``out.iterations`` timed steps, then the hand-over."""
    t = 0
    while True:
        while turns.owner(t) != turns.side:
            t += 1
        if not clock.agree_max(1.0 if referee.may_run(t) else 0.0):
            return
        out.samples.append([clock.time(step) for _ in range(out.iterations)])
        out.turns.append(t)
        median = statistics.median(clock.slowest(out.samples[-1]))
        if clock.agree_max(1.0 if referee.hand_over(t, median) else 0.0):
            return
        t += 1


def pairs_of(head: List[DuetTiming], base: List[DuetTiming], seed: int) -> Tuple[List[Tuple[float, float]], List[bool],
                                                                                List[float], List[float]]:
    """(head, base) medians per complete pair, head-first per pair, and every iteration of each side
    (each iteration's time is its slowest rank's)."""

    def per_turn(timings: List[DuetTiming]):
        turns = timings[0].turns
        return {t: [max(col) for col in zip(*(tm.samples[i] for tm in timings))] for i, t in enumerate(turns)}

    h, b = per_turn(head), per_turn(base)
    pairs, head_first, hs, bs = [], [], [], []
    for p in sorted({t // 2 for t in h} & {t // 2 for t in b}):
        th, tb = (2 * p, 2 * p + 1) if turn_owner(seed, 2 * p) == "head" else (2 * p + 1, 2 * p)
        if th in h and tb in b:
            pairs.append((statistics.median(h[th]), statistics.median(b[tb])))
            head_first.append(th < tb)
            hs += h[th]
            bs += b[tb]
    return pairs, head_first, hs, bs


def missing_of(timings: Optional[List[DuetTiming]]) -> str:
    return next((t.missing for t in timings or [] if t.missing and t.missing != "other"), "")


def warm_ranks() -> None:
    """Nothing: called once on each side before the duet, so that both pools are started one after
    the other, not from two threads at once."""
