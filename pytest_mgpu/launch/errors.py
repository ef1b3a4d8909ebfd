"""How a failed distributed call is described to the user: every failing rank, named, with why."""
from __future__ import annotations

import signal
import textwrap
from dataclasses import dataclass, field
from typing import List, Literal, Optional

from ..brief import brief, fit

ProblemKind = Literal["raised", "died", "hung", "computing", "starting", "stopped", "returned", "absent",
                      "unreadable"]
# How a kind reads in the report's first line ("hung" is only ever a blocked rank: launch/unfinished.py).
_KIND_WORDS = {"computing": "still computing", "starting": "still starting"}


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exit code {code}"


@dataclass
class RankProblem:
    """Why one rank did not return a value."""

    rank: int
    kind: ProblemKind
    summary: str
    detail: str = ""  # traceback, Python stack, or the tail of the rank's output
    secondary: bool = False  # a consequence: explained by another rank's failure (launch/attribution.py)
    communication: bool = False  # (raised) a communication error: what a rank sees when a peer vanished
    waiting: bool = False  # (hung) blocked inside a collective (its stack, or its flight recorder)

    def format(self) -> str:
        head = f"rank {self.rank} {self.summary}"
        if self.secondary:
            head += "  [a consequence of another rank's failure, not a cause]"
        if not self.detail:
            return head
        return head + "\n" + textwrap.indent(self.detail.rstrip(), "    | ")


@dataclass
class RankFailure(Exception):
    """A distributed call in which at least one rank raised, died or hung."""

    what: str  # e.g. "test_x.py::test_y: 4 ranks, gloo on cpu (emulated)"
    problems: List[RankProblem] = field(default_factory=list)
    hint: str = ""
    collectives: str = ""  # the first collective the ranks disagree on (launch/desync.py)

    def __post_init__(self):
        super().__init__(self.format())
        self.logs: List[str] = []  # each rank's output, when the launcher could read it

    @property
    def ranks(self) -> List[int]:
        return sorted(p.rank for p in self.problems)

    def primary(self) -> List[RankProblem]:
        return [p for p in self.problems if not p.secondary]

    def format(self) -> str:
        kinds = sorted({p.kind for p in self.primary()}) or sorted({p.kind for p in self.problems})
        words = [_KIND_WORDS.get(k, k) for k in kinds]
        causes = sorted(p.rank for p in self.primary())
        head = (f"{len(self.problems)} rank(s) failed ({', '.join(words)}) in {self.what}: "
                f"rank(s) {', '.join(map(str, self.ranks))}")
        if causes and len(causes) < len(self.problems):
            head += f"; cause: rank(s) {', '.join(map(str, causes))}"
        top = [head]  # what a CI page shows (fit): what failed, the disagreement, the first cause, the fix
        if self.collectives:
            top.append(f"the ranks' collectives disagree (flight recorder): {self.collectives}")
        first = (self.primary() or self.problems)[:1]
        if first and (len(self.problems) > 1 or self.hint or self.collectives):
            summary = first[0].summary.rstrip(":").removesuffix("; its Python stack")
            top.append(f"first cause: rank {first[0].rank} {summary}")  # the full story follows
        if self.hint:
            top.append(f"fix: {brief(self.hint)}")
        lines = fit(top)
        order = sorted(self.problems, key=lambda p: (p.secondary, p.rank))
        for p in order:
            lines.append("")
            lines.append(p.format())
        if self.hint:
            lines.append("")
            lines.append(self.hint)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def __reduce__(self):
        return (RankFailure, (self.what, self.problems, self.hint, self.collectives))


class RankLeftoverWarning(UserWarning):
    """A call left child processes (ended) or threads (still running) in a rank."""


# -- the words for a call that ran out of time (launch/collect.py, launch/unfinished.py) ----------------
def raise_limit(seconds: float, source: str) -> str:
    """How to give a slow call more time, naming the setting that gave it this limit."""
    if source.startswith("dist.run("):
        return (f"raise the limit where it was set: {source} in the test (dist.run(..., timeout=S); the marker "
                "@pytest.mark.mgpu_timeout(S) and --mgpu-timeout set it for a test and a session)")
    if source.startswith("@pytest.mark."):
        return (f"raise the limit where it was set: {source} on the test (@pytest.mark.mgpu_timeout(S); "
                "dist.run(..., timeout=S) sets it for one call)")
    return (f"raise the limit where it was set: {source} (--mgpu-timeout=S or ini mgpu_timeout; "
            "@pytest.mark.mgpu_timeout(S) for one test, dist.run(..., timeout=S) for one call)")


def cut_short(seconds: float, source: str, outer_source: str) -> str:
    return (f"The call was cut short by {outer_source}, not by pytest-mgpu's own limit ({seconds:g}s from "
            f"{source}): raise pytest-timeout's limit (--timeout, or @pytest.mark.timeout).")


def ranks_words(ranks) -> str:
    """``rank 3``, ``ranks 0, 2, 3``, ``ranks 0-2`` (runs of three or more are written as a range)."""
    rs = sorted(set(ranks))
    parts, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts += [f"{rs[i]}-{rs[j]}"] if j - i >= 2 else [str(r) for r in rs[i:j + 1]]
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def _were(ranks) -> str:
    return f"{ranks_words(ranks)} {'was' if len(ranks) == 1 else 'were'}"


def unfinished_summary(kind: str, took: str, which: str, cpu: str, where: str = "", joined: bool = True) -> str:
    """The line of one rank still running at the limit (its kind from launch/unfinished.py)."""
    if kind == "starting":
        what = ("it had not begun the test's function (still importing its module)" if joined
                else "it had not joined the process group")
        return f"was still starting after {took} ({which}): {what}; {cpu}; its Python stack:"
    if kind == "computing":
        return f"is still computing after {took} ({which}): it used {cpu}, so it is slow, not hung; its Python stack:"
    return f"did not finish within {took} (hung; {which}): {where}, {cpu}; its Python stack:"


def timeout_hint(problems: List[RankProblem], seconds: float, source: str, outer_source: str = "") -> str:
    """The hint under a call that ran out of time, chosen by what its causes were doing: "hung" and the
    collective hint only where a cause was blocked; slow ones are told how to raise the limit."""
    causes = [p for p in problems if not p.secondary] or problems
    slow = {k: [p.rank for p in causes if p.kind == k] for k in ("computing", "starting")}
    parts = []
    if any(p.kind not in slow for p in causes):  # blocked, or returned while the others were blocked
        parts.append("Hint: a rank blocked in a collective usually means the ranks disagree on which "
                     "collectives to call (a rank-dependent branch, uneven data).")
    if slow["computing"]:
        parts.append(f"Hint: {_were(slow['computing'])} still computing when the limit came (CPU time "
                     "advancing): the call is slow, not hung.")
    if slow["starting"]:
        parts.append(f"Hint: {_were(slow['starting'])} still starting when the limit came (not yet in the test's "
                     "function: a rank pool rebuilt after a failure imports the test's module again, which takes "
                     "seconds on a loaded machine): nothing hung.")
    if outer_source:
        parts.append(cut_short(seconds, source, outer_source))
    else:
        lead = "To wait longer, " if slow["computing"] or slow["starting"] else "If the work is just slow, "
        parts.append(lead + raise_limit(seconds, source) + ".")
    return " ".join(parts)
