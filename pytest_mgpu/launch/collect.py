"""Waiting on ranks: their results, their deaths, the deadline, and the stacks of those that hang.

Shared by the fresh-process launcher and the warm pool: both hand over rank processes, the pipes
their outcomes arrive on, and the files their output goes to.
"""
from __future__ import annotations

import os
import pickle
import re
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Dict, List, Optional, Sequence

from .attribution import attribute, is_communication_error, returned_early
from .errors import RankFailure, RankProblem, describe_exit
from .protocol import RankOutcome, safe_str

FAILURE_GRACE_S = 3.0  # after a first failure, how long the other ranks get to report their own
START_LIMIT_S = 120.0  # how long ranks may take to start and join the group, on top of the call's limit
STACK_WAIT_S = 2.0  # how long a hung rank gets to print its stack
# How long before an outer limit (pytest-timeout) a call is cut, so that the stacks, the kill and the
# report are out before it fires. The stack wait is bounded by STACK_WAIT_S (a rank that does not
# answer); the rest (kill, attribution, report, teardown) took at most 0.22 s over 5 runs of a hung
# 4-rank call on the loaded 2-core machine (benchmarks/attribution.py --only margin): 3 s leaves ~0.8 s
# to spare. When the outer limit is shorter than twice that, the cut falls halfway to it instead.
REPORT_MARGIN_S = 3.0

_STACK_START = re.compile(r"^(Current thread|Thread) 0x", re.M)
_BOOTSTRAP = (
    os.sep + "pytest_mgpu" + os.sep + "launch" + os.sep,
    os.sep + "multiprocessing" + os.sep,
    '"<string>"',
    os.sep + "threading.py",
)
_MAIN_BOTTOM = '"<string>", line 1 in <module>'  # the forkserver child's first frame


@dataclass(frozen=True)
class CallLimit:
    """How long a call may take, and where that limit came from (named when it fires).

    ``outer_deadline`` (time.monotonic()): an outer limit (pytest-timeout) that ends the test then; the
    call is cut ``REPORT_MARGIN_S`` before it, so that our report (ranks, stacks) comes first.
    """

    seconds: float
    source: str = "--mgpu-timeout"
    outer_deadline: Optional[float] = None
    outer_source: str = ""

    def cut(self, start: float) -> Optional[float]:
        """When to stop a call that began at ``start`` (time.monotonic()), for the outer limit."""
        if self.outer_deadline is None:
            return None
        return self.outer_deadline - min(REPORT_MARGIN_S, max(0.0, self.outer_deadline - start) / 2)


@dataclass
class Collected:
    outcomes: Dict[int, RankOutcome] = field(default_factory=dict)
    problems: List[RankProblem] = field(default_factory=list)
    cuts: Dict[int, int] = field(default_factory=dict)  # log offsets where stack dumps begin
    hint: str = ""

    def logs(self, log_paths: Sequence[str]) -> List[str]:
        return [read(path)[: self.cuts.get(r)] for r, path in enumerate(log_paths)]

    @property
    def ranks_intact(self) -> bool:
        """Every rank finished its call and is fine (only a value could not be read back here):
        a warm pool may serve the next test."""
        return all(p.kind == "unreadable" for p in self.problems)

    def raise_if_failed(self, what: str, log_paths: Sequence[str]) -> None:
        if self.problems:
            failure = RankFailure(what, self.problems, hint=self.hint)
            failure.logs = self.logs(log_paths)
            raise failure


class _Waiter:
    """One wait for a group's outcomes: results, deaths and the deadline, with no verdict yet."""

    def __init__(self, procs, conns, log_paths, limit: CallLimit, started: bool, until_ready: bool):
        self.procs, self.conns, self.log_paths, self.limit = procs, conns, log_paths, limit
        self.until_ready = until_ready
        self.got = Collected()
        self.failed_at: Optional[float] = None
        self.pending = set(range(len(procs)))
        self.unready = set() if started else set(self.pending)
        self.t0 = time.monotonic()
        own = limit.seconds if started else max(START_LIMIT_S, limit.seconds)
        self.limit_at = self.t0 + own
        self.by_conn = {id(c): r for r, c in enumerate(conns)}
        self.by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}

    def deadline(self) -> float:
        cut = self.limit.cut(self.t0)
        end = self.limit_at if cut is None else min(self.limit_at, cut)
        return end if self.failed_at is None else min(end, self.failed_at + FAILURE_GRACE_S)

    @property
    def outer_fired(self) -> bool:
        cut = self.limit.cut(self.t0)
        return cut is not None and cut < self.limit_at

    def accept(self, r: int, outcome: RankOutcome) -> None:
        if outcome.ready:
            self.unready.discard(r)
            if not self.unready:
                self.limit_at = time.monotonic() + self.limit.seconds
                if self.until_ready:
                    self.pending.clear()
            return
        self.pending.discard(r)
        if not outcome.ok:
            return self.fail(raised_problem(outcome))
        problem = rebuild_value(outcome)
        if problem is not None:
            self.got.problems.append(problem)  # the rank itself is fine: no failure clock
        else:
            self.got.outcomes[r] = outcome

    def fail(self, problem: RankProblem) -> None:
        if self.failed_at is None:
            self.failed_at = time.monotonic()
        self.got.problems.append(problem)
        self.pending.discard(problem.rank)

    def drain(self, r: int) -> None:
        """Read what rank ``r`` sent: results before exits, as a rank that reported and then exited
        has not died."""
        conn = self.conns[r]
        while r in self.pending and conn.poll():
            try:
                outcome = recv(conn)
            except RankReportError as exc:
                return self.fail(RankProblem(r, "unreadable", str(exc), exc.detail))
            if outcome is None:
                return
            self.accept(r, outcome)

    def run(self) -> Collected:
        while self.pending:
            now = time.monotonic()
            if now >= self.deadline():
                break
            waitables = [self.conns[r] for r in self.pending] + [self.procs[r].sentinel for r in self.pending]
            ready = wait(waitables, timeout=self.deadline() - now)
            for r in sorted({self.by_conn.get(id(o), self.by_sentinel.get(o)) for o in ready} - {None}):
                self.drain(r)
            for obj in ready:
                r = self.by_sentinel.get(obj)
                if r is not None and r in self.pending:
                    self.drain(r)
                    if r in self.pending:
                        self.procs[r].join(1.0)
                        tail = _tail(read(self.log_paths[r]))
                        self.fail(RankProblem(r, "died", f"died: {describe_exit(self.procs[r].exitcode)}", tail))
        if self.pending:
            self.unfinished()
        returned = sorted(self.got.outcomes) if self.got.problems else []
        self.got.problems = attribute(self.got.problems, returned, returned_early)
        return self.got
    def unfinished(self) -> None:
        """Ranks still running at the deadline (or after the grace that followed a failure): their
        stacks say whether they hang in user code or wait in a collective for a failed peer."""
        pending = sorted(self.pending)
        stacks, self.got.cuts = _stacks(self.procs, pending, self.log_paths)
        timed_out = self.failed_at is None
        elapsed = time.monotonic() - self.t0
        for r in pending:
            stack = stacks.get(r, "(no stack)")
            if timed_out and r in self.unready:
                summary = (f"did not start: it had not joined the process group after {elapsed:.1f}s "
                           f"({self.which_limit()}); its Python stack:")
            elif timed_out:
                took = f"{elapsed:.1f}s" if self.outer_fired else f"{self.limit.seconds:g}s"
                summary = f"did not finish within {took} (hung; {self.which_limit()}); its Python stack:"
            else:
                summary = "was still running when another rank failed; stopped. Its stack:"
            self.got.problems.append(RankProblem(r, "stopped" if not timed_out else "hung", summary, stack))
        if timed_out:
            self.got.hint = self.timeout_hint()

    def which_limit(self) -> str:
        if self.outer_fired:
            return (f"stopped before {self.limit.outer_source} ends the test: it counts from the "
                    "test's start, its setup included")
        return f"the limit set by {self.limit.source}"

    def timeout_hint(self) -> str:
        base = ("Hint: a rank blocked in a collective usually means the ranks disagree on which "
                "collectives to call (a rank-dependent branch, uneven data). ")
        if self.outer_fired:
            return base + (f"The call was cut short by {self.limit.outer_source}, not by pytest-mgpu's own "
                           f"limit ({self.limit.seconds:g}s from {self.limit.source}): if the work is just "
                           "slow, raise pytest-timeout's limit (--timeout, or @pytest.mark.timeout).")
        return base + (f"If the work is just slow, raise the limit ({self.limit.source}): "
                       "dist.run(..., timeout=S), @pytest.mark.mgpu_timeout(S) or --mgpu-timeout.")


def collect(procs, conns, log_paths: Sequence[str], limit: CallLimit, *, started: bool = False,
            until_ready: bool = False) -> Collected:
    """Wait until every rank has sent an outcome, or one failed (plus a grace period for the
    others to report), or time ran out; ask the ranks still running for their stacks; then decide
    which failures are causes and which consequences (``attribution.attribute``).

    Ranks first say they are ready (joined the group); the call's limit counts from the moment all
    are, so a slow start on a loaded machine is not charged to the test. ``started``: they already
    are (warm ranks). ``until_ready``: stop once all are (starting a warm pool).
    """
    return _Waiter(procs, conns, log_paths, limit, started, until_ready).run()


def _stacks(procs, ranks, log_paths):
    """Ask each rank for its Python stack (faulthandler on SIGUSR1) and read it back."""
    sizes = {}
    for r in ranks:
        path = log_paths[r]
        sizes[r] = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    got: Dict[int, str] = {}
    seen: Dict[int, int] = {}
    end = time.perf_counter() + STACK_WAIT_S
    while len(got) < len(ranks) and time.perf_counter() < end:
        for r in ranks:
            if r in got:
                continue
            text = read(log_paths[r])[sizes[r]:]
            m = _STACK_START.search(text)
            # the dump is complete once the main thread's bottom frame is out and it stops growing
            if m and _MAIN_BOTTOM in text and seen.get(r) == len(text):
                got[r] = _user_stack(text[m.start():])
            seen[r] = len(text)
        if len(got) < len(ranks):
            wait([procs[r].sentinel for r in ranks if r not in got], timeout=0.05)
    for r in ranks:
        if r not in got:
            text = read(log_paths[r])[sizes[r]:]
            m = _STACK_START.search(text)
            got[r] = _user_stack(text[m.start():]) if m else "(the rank did not answer the stack request)"
    return got, sizes


def _user_stack(dump: str) -> str:
    """A faulthandler dump without the frames of the launcher, multiprocessing and threading, and
    without the threads that are only ours (the launcher watch)."""
    kept = []
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip()):
        head, *frames = block.strip().splitlines()
        frames = [ln for ln in frames if ln.strip() and not any(b in ln for b in _BOOTSTRAP)]
        if frames:
            kept.append("\n".join([head] + frames))
    return "\n\n".join(kept) or dump.strip()


class RankReportError(Exception):
    """What a rank sent could not be read back in the test process."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


def recv(conn) -> Optional[RankOutcome]:
    """The next outcome on a rank's pipe; None when the pipe is closed."""
    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        return None
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise RankReportError(f"sent a report the test process cannot read ({type(exc).__name__}: "
                              f"{safe_str(exc)})", traceback.format_exc()) from None


def rebuild_value(o: RankOutcome) -> Optional[RankProblem]:
    """Unpickle a rank's return value here, under a guard that names the rank and the value's type
    (a class whose ``__init__`` needs an argument pickles in the rank and fails to unpickle here)."""
    if o.value_bytes is None:
        return None
    try:
        o.value = pickle.loads(o.value_bytes)
    except Exception as exc:
        return RankProblem(
            o.rank, "unreadable",
            f"returned a {o.value_type} that cannot be rebuilt in the test process "
            f"({type(exc).__name__}: {safe_str(exc)}). Return plain data (tensors, numbers, strings, "
            "containers of them), or give the class a __reduce__ that rebuilds it.",
            "".join(traceback.format_exception_only(type(exc), exc)),
        )
    finally:
        o.value_bytes = None
    return None


def raised_problem(o: RankOutcome) -> RankProblem:
    """The problem report of a rank that sent back an exception."""
    where = {
        "init": " while joining the process group",
        "import": " while loading the function",
        "return": " while sending its result",
    }.get(o.phase, "")
    return RankProblem(o.rank, "raised", f"raised {o.exc_type}: {o.exc_message}{where}", o.traceback,
                       communication=is_communication_error(o.exc_type, o.exc_message))


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _tail(text: str, lines: int = 30) -> str:
    rows = text.rstrip().splitlines()
    if not rows:
        return "(the rank printed nothing)"
    head = "last lines of its output:" if len(rows) > lines else "its output:"
    return head + "\n" + "\n".join(rows[-lines:])
