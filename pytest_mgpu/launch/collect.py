"""Waiting on ranks: their results, their deaths, the deadline, and what those still running at it were
doing (``unfinished.py``: blocked, computing, starting), with the first collective the ranks disagree on
(``desync.py``).

Shared by the fresh-process launcher and the warm pool: both hand over rank processes, the pipes
their outcomes arrive on, and the files their output goes to.
"""
from __future__ import annotations

import pickle
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .attribution import attribute, is_communication_error, returned_early
from .desync import Trace, first_disagreement
from .errors import ProblemKind, RankFailure, RankProblem, describe_exit, timeout_hint, unfinished_summary
from .poller import RankPoller
from .protocol import RankOutcome, safe_str
from .unfinished import CpuWatch, Verdict, classify, collective_name, cpu_words, read, request_dumps

FAILURE_GRACE_S = 3.0  # after a first failure, how long the other ranks get to report their own
START_LIMIT_S = 120.0  # how long ranks may take to start and join the group, on top of the call's limit
# How long before an outer limit (pytest-timeout) a call is cut, so that the stacks, the kill and the
# report are out before it fires. The stack wait is bounded by unfinished.STACK_WAIT_S (a rank that
# does not answer); the rest (kill, attribution, report, teardown) took at most 0.22 s over 5 runs of a hung
# 4-rank call on the loaded 2-core machine (benchmarks/launch/attribution.py --only margin): 3 s leaves ~0.8 s
# to spare. When the outer limit is shorter than twice that, the cut falls halfway to it instead.
REPORT_MARGIN_S = 3.0
# The longest one wait on the ranks blocks the main thread. Python runs a signal's handler (Ctrl-C's
# KeyboardInterrupt) in the main thread, after the system call the signal interrupted; a SIGINT that
# the kernel hands to another thread of the process (the TCPStore's pt_tcpstore_uv thread, found at
# load 8) interrupts nothing there, so the main thread slept on to the call's limit (300 s) before it
# saw Ctrl-C. Waking every 0.5 s costs nothing measurable and bounds that.
SIGNAL_POLL_S = 0.5


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
    collectives: str = ""  # the first collective the ranks disagree on

    def logs(self, log_paths: Sequence[str]) -> List[str]:
        """The ranks' output; a log its rank reported empty is not read."""
        return ["" if getattr(self.outcomes.get(r), "log_size", None) == 0 else read(path)[: self.cuts.get(r)]
                for r, path in enumerate(log_paths)]

    @property
    def ranks_intact(self) -> bool:
        """Every rank finished its call and is fine (only a value could not be read back here):
        a warm pool may serve the next test."""
        return all(p.kind == "unreadable" for p in self.problems)

    def raise_if_failed(self, what: str, log_paths: Sequence[str]) -> None:
        if self.problems:
            failure = RankFailure(what, self.problems, hint=self.hint, collectives=self.collectives)
            failure.logs = self.logs(log_paths)
            raise failure


class _Waiter:
    """One wait for a group's outcomes: results, deaths and the deadline, with no verdict yet."""

    def __init__(self, procs, conns, log_paths, limit: CallLimit, started: bool, until_ready: bool):
        self.procs, self.conns, self.log_paths, self.limit = procs, conns, log_paths, limit
        self.until_ready = until_ready
        self.started = started  # warm ranks: those that returned stay alive (and can be asked)
        self.got = Collected()
        self.failed_at: Optional[float] = None
        self.pending = set(range(len(procs)))
        self.unready = set() if started else set(self.pending)
        self.t0 = time.monotonic()
        own = limit.seconds if started else max(START_LIMIT_S, limit.seconds)
        self.limit_at = self.t0 + own
        self.poller = RankPoller(conns, procs)
        self.cpu = CpuWatch([p.pid for p in procs])
        self.traces: Dict[int, Trace] = {}  # what is known of each rank's collectives in this call
        self.behind: set = set()  # ranks whose absence from a collective is explained (slow, raised, died)

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
        self.traces[r] = Trace(outcome.collectives, outcome.last_collectives)
        if not outcome.ok:
            self.behind.add(r)
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

    def drain(self, r: int, readable: bool = False) -> None:
        """Read what rank ``r`` sent: results before exits, as a rank that reported and then exited
        has not died. ``readable``: its pipe was just reported readable (not asked again)."""
        conn = self.conns[r]
        while r in self.pending and (readable or conn.poll()):
            readable = False
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
            self.cpu.poll(now, self.deadline(), self.pending)  # once, in the window before the limit
            if now >= self.deadline():
                break
            until = min(self.cpu.due(self.deadline()), self.deadline(), now + SIGNAL_POLL_S)
            ready = self.poller.ready(self.pending, until - now)
            piped = {r for r, died in ready if not died}
            for rank in sorted({r for r, _ in ready}):
                self.drain(rank, readable=rank in piped)
            for r, died in ready:
                if died and r in self.pending:
                    self.drain(r)
                    if r in self.pending:
                        self.procs[r].join(1.0)
                        tail = _tail(read(self.log_paths[r]))
                        self.behind.add(r)
                        self.fail(RankProblem(r, "died", f"died: {describe_exit(self.procs[r].exitcode)}", tail))
        timed_out = bool(self.pending) and self.failed_at is None
        if self.pending or any(p.kind != "unreadable" for p in self.got.problems):
            self.unfinished()
        returned = sorted(self.got.outcomes) if self.got.problems else []
        self.got.problems = attribute(self.got.problems, returned, returned_early)
        if timed_out:
            outer = self.limit.outer_source if self.outer_fired else ""
            self.got.hint = timeout_hint(self.got.problems, self.limit.seconds, self.limit.source, outer)
        if self.got.problems:
            self.got.collectives = first_disagreement(self.traces, self.behind)
        return self.got

    def unfinished(self) -> None:
        """Ranks still running at the deadline (or after the grace that followed a failure): blocked
        (hung), still computing or still starting, from their CPU time, stacks and flight recorders
        (``unfinished.py``); their stacks and recorders also say which collective they wait in."""
        pending = sorted(self.pending)
        returned = [r for r in sorted(self.got.outcomes) if self.started and self.procs[r].is_alive()
                    and (r not in self.traces or self.traces[r].collectives is None)]
        if not pending and not returned:
            return
        timed_out = self.failed_at is None
        used, window = self.cpu.used(pending) if timed_out and pending else ({}, 0.0)  # before the dumps
        stacks, evidence, self.got.cuts = request_dumps(self.procs, pending, self.log_paths, returned)
        elapsed = time.monotonic() - self.t0
        limit = f"{elapsed:.1f}s" if self.outer_fired else f"{self.limit.seconds:g}s"
        for r, ev in evidence.items():
            if ev is not None:
                self.traces[r] = Trace(ev.collectives, ev.last)
        if timed_out:
            used, window = self._fresh_window(pending, used, window, stacks, evidence)
        for r in pending:
            ev, stack = evidence.get(r), stacks.get(r, "(no stack)")
            if not timed_out:
                self.got.problems.append(RankProblem(
                    r, "stopped", "was still running when another rank failed; stopped. Its stack:", stack))
                continue
            v = classify(r not in self.unready, used.get(r), window, stack, ev)
            if v.kind != "blocked":
                self.behind.add(r)
            took = f"{elapsed:.1f}s" if r in self.unready else limit  # joining has a limit of its own
            self.got.problems.append(self.verdict_problem(r, v, took, stack))

    def _fresh_window(self, pending, used, window, stacks, evidence):
        """The CPU window again, from now, where it would call a rank computing only because its
        function began inside it (``CpuWatch.began_inside``); unchanged otherwise."""
        late = [r for r in pending if self.cpu.began_inside(evidence.get(r)) and r not in self.unready and classify(
            True, used.get(r), window, stacks.get(r, ""), evidence.get(r)).kind == "computing"]
        if not late:
            return used, window
        return self.cpu.resample(pending)

    def verdict_problem(self, r: int, v: Verdict, took: str, stack: str) -> RankProblem:
        kind: ProblemKind = "hung" if v.kind == "blocked" else v.kind
        if v.waiting_in is not None:
            where = f"blocked in {collective_name(v.waiting_in)}"
        else:
            where = "blocked in a collective" if v.in_collective else "blocked outside any collective"
        summary = unfinished_summary(v.kind, took, self.which_limit(), cpu_words(v), where,
                                     joined=r not in self.unready)
        return RankProblem(r, kind, summary, stack, waiting=v.in_collective)

    def which_limit(self) -> str:
        if self.outer_fired:
            return (f"stopped before {self.limit.outer_source} ends the test: it counts from the "
                    "test's start, its setup included")
        return f"the limit set by {self.limit.source}"


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
    message = o.exc_message
    if "\n" in message and o.traceback and message.rstrip() in o.traceback:  # said in full below once
        message = message.splitlines()[0]
    return RankProblem(o.rank, "raised", f"raised {o.exc_type}: {message}{where}", o.traceback,
                       communication=is_communication_error(o.exc_type, o.exc_message))


def _tail(text: str, lines: int = 30) -> str:
    rows = text.rstrip().splitlines()
    if not rows:
        return "(the rank printed nothing)"
    head = "last lines of its output:" if len(rows) > lines else "its output:"
    return head + "\n" + "\n".join(rows[-lines:])
