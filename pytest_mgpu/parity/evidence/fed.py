"""How another argument of the model's call differs, where the rows (its first argument) are the same:
read against the same argument of every row the reference fed, not only the matched one.

- ``slice``: a floating input (not a 0/1 or -inf mask) whose rows on the rank are each exactly one other
  row's of the reference's (every rank the first block of a batch-wide draw, or another offset): the loop
  slices a batch-wide input otherwise for each rank;
- ``draw``: a floating input (not a 0/1 or -inf mask) none of whose differing rows is any of the
  reference's: drawn per rank (noise with a seed of the rank's own) where the reference drew it for the
  whole batch;
- ``built``: an integer, boolean or mask input built otherwise (an attention mask, decoder inputs,
  positions or labels)."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Literal, Tuple

from ..record.trail import FED
from .facts import UserFacts
from .trail import Apart, rows_apart

FedKind = Literal["slice", "draw", "built"]
MASKS = (0.0, 1.0)  # values of a float mask; below -1e4 too (an additive attention mask)


def _marks(probes: List[Any], name: str) -> Iterator[Tuple[Any, Any]]:
    """(probe, mark) for each probe's fed mark called ``name``."""
    for p in probes:
        for m in getattr(p, "trail", None) or []:
            if m.key[2] == FED and m.name == name:
                yield p, m


def _mask_like(rows: List[Tuple[float, List[float]]]) -> bool:
    return all(v in MASKS or v < -1e4 for _, values in rows for v in values)


def fed_kind(f: UserFacts, apart: Apart) -> FedKind:
    """Which of the three the differing argument of ``apart`` is (``built`` where it cannot be told)."""
    name = apart.mark.name
    ref_rows: List[Tuple[float, List[float]]] = []
    ref_of: Dict[str, Tuple[float, List[float]]] = {}  # reference row (by fingerprint) -> its value of the argument
    for q, m in _marks(f.ref_probes, name):
        ref_rows += m.rows
        ref_of.update((f"{r:.12g}", row) for r, row in zip(q.rows, m.rows))
    differing = other = 0
    drawn = True  # floating values, no mask: what a random draw gives
    for p, m in (pm for probes in f.rank_probes for pm in _marks(probes, name)):
        drawn = drawn and m.eps > 0 and not _mask_like(m.rows)
        for i, r in enumerate(p.rows):
            mine, theirs = m.rows[i] if i < len(m.rows) else None, ref_of.get(f"{r:.12g}")
            if mine is None or theirs is None or not rows_apart(mine, theirs, m.eps):
                continue
            differing += 1
            other += sum(not rows_apart(mine, row, m.eps) for row in ref_rows) == 1  # exactly one other row's
    if not differing or not drawn:
        return "built"  # an integer, boolean or mask argument: rows alike by design (masks of one length)
    return "slice" if 2 * other >= differing else "draw" if other == 0 else "built"
