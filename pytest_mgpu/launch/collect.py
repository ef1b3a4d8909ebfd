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
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Dict, List, Optional, Sequence

from .errors import RankFailure, RankProblem, describe_exit
from .protocol import RankOutcome

FAILURE_GRACE_S = 3.0  # after a first failure, how long the other ranks get to report their own
START_LIMIT_S = 120.0  # how long ranks may take to start and join the group, on top of the call's limit
STACK_WAIT_S = 2.0  # how long a hung rank gets to print its stack

_STACK_START = re.compile(r"^(Current thread|Thread) 0x", re.M)
_BOOTSTRAP = (
    os.sep + "pytest_mgpu" + os.sep + "launch" + os.sep,
    os.sep + "multiprocessing" + os.sep,
    '"<string>"',
    os.sep + "threading.py",
)
_MAIN_BOTTOM = '"<string>", line 1 in <module>'  # the forkserver child's first frame


@dataclass
class Collected:
    outcomes: Dict[int, RankOutcome] = field(default_factory=dict)
    problems: List[RankProblem] = field(default_factory=list)
    cuts: Dict[int, int] = field(default_factory=dict)  # log offsets where stack dumps begin

    def logs(self, log_paths: Sequence[str]) -> List[str]:
        return [read(path)[: self.cuts.get(r)] for r, path in enumerate(log_paths)]

    def raise_if_failed(self, what: str, log_paths: Sequence[str]) -> None:
        if self.problems:
            failure = RankFailure(what, self.problems, hint=hint(self.problems))
            failure.logs = self.logs(log_paths)
            raise failure


def kill_tree(pid: int) -> None:
    """SIGKILL a rank and everything in its process group (it made itself group leader)."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass


def collect(procs, conns, log_paths: Sequence[str], timeout_s: float, *, started: bool = False,
            until_ready: bool = False) -> Collected:
    """Wait until every rank has sent an outcome, or one failed (plus a grace period for the
    others to report), or time ran out; ask the ranks still running for their stacks.

    Ranks first say they are ready (joined the group); the call's ``timeout_s`` counts from the
    moment all are, so a slow start on a loaded machine is not charged to the test. ``started``:
    they already are (warm ranks). ``until_ready``: stop once all are (starting a warm pool).
    """
    got = Collected()
    first_failure: Optional[float] = None
    pending = set(range(len(procs)))
    unready = set() if started else set(pending)
    t0 = time.perf_counter()
    deadline = t0 + (timeout_s if started else START_LIMIT_S + timeout_s)
    phase_limit = t0 + timeout_s if started else t0 + max(START_LIMIT_S, timeout_s)
    by_conn = {id(c): r for r, c in enumerate(conns)}
    by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}

    def accept(r: int, outcome: RankOutcome) -> None:
        nonlocal deadline, phase_limit
        if outcome.ready:
            unready.discard(r)
            if not unready:
                phase_limit = deadline = time.perf_counter() + timeout_s
                if until_ready:
                    pending.clear()
            return
        pending.discard(r)
        if outcome.ok:
            got.outcomes[r] = outcome
        else:
            fail(raised_problem(outcome))

    def fail(problem: RankProblem) -> None:
        nonlocal first_failure
        problem.secondary = first_failure is not None
        if first_failure is None:
            first_failure = time.perf_counter()
        got.problems.append(problem)
        pending.discard(problem.rank)

    while pending:
        now = time.perf_counter()
        limit = phase_limit if first_failure is None else min(phase_limit, first_failure + FAILURE_GRACE_S)
        if now >= limit:
            break
        waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        ready = wait(waitables, timeout=limit - now)
        # Results first: a rank that sent its outcome and then exited has not died.
        for obj in ready:
            r = by_conn.get(id(obj))
            while r is not None and r in pending and obj.poll():
                outcome = recv(obj)
                if outcome is None:
                    break
                accept(r, outcome)
        for obj in ready:
            r = by_sentinel.get(obj)
            if r is None or r not in pending:
                continue
            outcome = None
            while r in pending and conns[r].poll():
                outcome = recv(conns[r])
                if outcome is None:
                    break
                accept(r, outcome)
            if r not in pending:
                continue
            procs[r].join(1.0)
            tail = _tail(read(log_paths[r]))
            fail(RankProblem(r, "died", f"died: {describe_exit(procs[r].exitcode)}", tail))
    if pending:
        timed_out = first_failure is None
        stacks, got.cuts = _stacks(procs, sorted(pending), log_paths)
        for r in sorted(pending):
            if timed_out and r in unready:
                summary = (f"did not start: it had not joined the process group after "
                           f"{max(START_LIMIT_S, timeout_s):g}s; its Python stack:")
                got.problems.append(RankProblem(r, "hung", summary, stacks.get(r, "(no stack)")))
            elif timed_out:
                summary = f"did not finish within {timeout_s:g}s (hung); its Python stack:"
                got.problems.append(RankProblem(r, "hung", summary, stacks.get(r, "(no stack)")))
            else:
                summary = "was still running when another rank failed; stopped. Its stack:"
                got.problems.append(
                    RankProblem(r, "stopped", summary, stacks.get(r, "(no stack)"), secondary=True)
                )
    return got


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


def recv(conn) -> Optional[RankOutcome]:
    try:
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return None


def raised_problem(o: RankOutcome) -> RankProblem:
    """The problem report of a rank that sent back an exception."""
    where = {
        "init": " while joining the process group",
        "import": " while loading the function",
        "return": " while sending its result",
    }.get(o.phase, "")
    return RankProblem(o.rank, "raised", f"raised {o.exc_type}: {o.exc_message}{where}", o.traceback)


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


def hint(problems: List[RankProblem]) -> str:
    if "hung" in {p.kind for p in problems if not p.secondary}:
        return (
            "Hint: a rank blocked in a collective usually means the ranks disagree on which "
            "collectives to call (a rank-dependent branch, uneven data). Raise the limit with "
            "dist.run(..., timeout=S) or --mgpu-timeout if the work is just slow."
        )
    return ""
