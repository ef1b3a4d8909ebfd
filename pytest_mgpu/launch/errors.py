"""How a failed distributed call is described to the user: every failing rank, named, with why."""
from __future__ import annotations

import signal
import textwrap
from dataclasses import dataclass, field
from typing import List, Literal, Optional

ProblemKind = Literal["raised", "died", "hung", "stopped", "returned", "absent", "unreadable"]


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
        causes = sorted(p.rank for p in self.primary())
        head = (f"{len(self.problems)} rank(s) failed ({', '.join(kinds)}) in {self.what}: "
                f"rank(s) {', '.join(map(str, self.ranks))}")
        if causes and len(causes) < len(self.problems):
            head += f"; cause: rank(s) {', '.join(map(str, causes))}"
        lines = [head]
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
        return (RankFailure, (self.what, self.problems, self.hint))


class RankLeftoverWarning(UserWarning):
    """A call left child processes (ended) or threads (still running) in a rank."""
