"""What localisation finds: at one step, the first phase of that step that differs, and how.

A step runs in phases (``PHASES``): the state it starts from, the rows each rank fed, the loss, the
gradients the optimizer saw (after synchronisation and clipping), the update. Each phase module of
this package reads one phase, of every rank and of the reference, and returns ``Finding``s; the
causes table (``causes.py``) reads the earliest one.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Final, List, Literal, Optional, Tuple, get_args

from ..records import TensorError

Phase = Literal["state", "inputs", "loss", "gradients", "update"]
PHASES: Final[Tuple[Phase, ...]] = get_args(Phase)
# How a phase differs: between ranks that should agree (one rank alone), by one factor, in some
# modules only, in some rows, or in a value read exactly (a learning rate, a step counter).
How = Literal["one rank alone", "a uniform factor", "some modules", "certain rows", "a value", "all tensors"]

# The reports these read are parity.report's ParityReport; typed as Any so that this package, which
# parity.report imports, imports nothing back (data flows one way).
Report = Any
REPLICA: Final = "rank "  # replica rows are named "rank r: <name>" (rank r against its stage's first rank)


@dataclass(frozen=True)
class Finding:
    """One piece of evidence: at ``step``, ``phase`` differs ``how``; ``signal`` names the pattern
    (a key the causes table reads), ``evidence`` says it with its numbers, ``detail`` is the longer
    account with its fix (the list of likely causes)."""

    step: int
    phase: Phase
    how: How
    signal: str
    evidence: str
    detail: str = ""
    value: float = math.nan  # the factor, where ``how`` is one
    names: Tuple[str, ...] = field(default_factory=tuple)  # modules, or ranks
    line: str = ""  # "file:line (what)" in the user's code that made it, where the evidence itself knows it

    @property
    def order(self) -> Tuple[int, int]:
        """Earlier steps first, then the phases in the order a step runs them."""
        return self.step, PHASES.index(self.phase)


def replica_name(rank: int, name: str) -> str:
    return f"{REPLICA}{rank}: {name}"


def replica_of(e: TensorError) -> Optional[int]:
    """The rank of a replica row ``rank r: <name>``; None for a row against the reference."""
    if not e.name.startswith(REPLICA) or ": " not in e.name:
        return None
    head = e.name[len(REPLICA):].split(": ", 1)[0]
    return int(head) if head.isdigit() else None


def plain_name(e: TensorError) -> str:
    return e.name.split(": ", 1)[1] if replica_of(e) is not None else e.name


def over(report: Report, step: int, kind: str, replicas: Optional[bool] = None) -> List[TensorError]:
    """The tensors of ``kind`` over the line at ``step`` (replica rows only, reference rows only, or both)."""
    if step >= len(report.records):
        return []
    return [e for e in report.records[step].errors if e.kind == kind and not report.tolerance.passes(e, step)
            and (replicas is None or (replica_of(e) is not None) == replicas)]


def common_factor(ratios: List[float]) -> float:
    """The factor every ||strategy|| / ||reference|| shares (within 2% of their median); 1.0 when
    fewer than two, when they disagree, or when it is within 5% of 1 (roundoff)."""
    if len(ratios) < 2:
        return 1.0
    k = statistics.median(ratios)
    if abs(k - 1) < 0.05 or any(abs(r - k) > 0.02 * abs(k) for r in ratios):
        return 1.0
    return k


def world_factor_of_most(ratios: List[float], world: int) -> int:
    """How many of ``ratios`` are the world size (within 2%), where that is most of them (at least two,
    and over half); 0 otherwise. A gradient reduced twice over the ranks is multiplied by the world size
    in the modules it passes through, while a module that also takes another path (a residual) mixes
    the factor with 1."""
    near = sum(1 for r in ratios if world > 1 and abs(r / world - 1) < 0.02)
    return near if near >= 2 and 2 * near > len(ratios) else 0


def factor_words(k: float, world: int, backwards: int = 1) -> str:
    """``k`` and what it equals, where it is the world size, its inverse or the backward passes:
    "4x (= the 4 backward passes per step)"."""
    if world > 1 and abs(k / world - 1) < 0.02:
        both = f"the {backwards} backward passes per step, and " if backwards == world else ""
        return f"{k:.4g}x (= {both}the world size {world})"
    if world > 1 and abs(k * world - 1) < 0.02:
        return f"{k:.4g}x (= 1/{world}, one over the world size)"
    if backwards > 1 and abs(k / backwards - 1) < 0.02:
        return f"{k:.4g}x (= the {backwards} backward passes per step)"
    return f"{k:.4g}x"


def modules_of(names: List[str]) -> List[str]:
    """The modules owning ``names`` (a parameter's name without its last part), in order."""
    return list(dict.fromkeys(n.rsplit(".", 1)[0] if "." in n else n for n in names))


def listed(names: List[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")
