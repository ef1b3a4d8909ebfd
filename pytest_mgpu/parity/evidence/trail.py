"""Where inside the model a forward goes apart: for the rows fed on both sides (the same input rows,
matched by fingerprint), each rank's trail of submodule calls (``record/trail.py``) against the
reference's, in call order. The first input or output that differs names the place:

- an output that differs from the same input: that module computes otherwise (its buffers or mode,
  its randomness, a collective inside it);
- an input that differs where everything before it agreed: the code between the two modules (a random
  draw, a mask, an index or a count taken from the rank's rows, not the whole batch's);
- another argument of the call itself (an attention mask, decoder inputs, labels) where the first is
  the same: the loop builds it otherwise.

Submodule calls are matched by class and by their order among that class's calls (wrappers add calls
of their own: those match nothing and are passed over)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..record.trail import FED, ROUTED
from .facts import UserFacts

NORM = 1e-4  # relative: a row's norm that is the reference's
VALUES = 1e-3  # relative: its sampled values, as a vector
ROUNDOFF = 16  # x the dtype's epsilon: the least difference said in a low-precision activation


@dataclass(frozen=True)
class Apart:
    """The first mark that differs, the mark before it that agreed (None: the first the forward made),
    and in how many of the rows compared it was the first."""

    mark: Any
    before: Any
    rows: int
    of: int

    @property
    def between(self) -> bool:
        return self.mark.key[2] == "input"

    @property
    def fed(self) -> bool:
        """Another of the call's own arguments differs (the rows, its first, the same)."""
        return self.mark.key[2] == FED

    @property
    def argument(self) -> str:
        """``argument eps``: how a fed mark (one of the call's arguments) is said."""
        return self.mark.name if self.mark.name.startswith("argument ") else f"argument {self.mark.name}"

    def words(self) -> str:
        """``norm1's input differs first (4 of 8 rows), patch_embed's output before it the same``, or
        ``attn's output differs first (8 of 8 rows), from the same input`` (short: the cause line keeps its fix)."""
        name = self.mark.name or self.mark.key[0]
        rows = f"({self.rows} of {self.of} rows)"
        if self.fed:
            return f"the model's {self.argument} differs {rows}"
        if not self.between:
            return f"the output of {name} ({self.mark.key[0]}) differs first {rows}, from the same input"
        if self.before is None:
            return f"{name}'s input differs first {rows}, the first module called"
        return f"{name}'s input differs first {rows}, {self.before.name or self.before.key[0]}'s {self.before.key[2]} " \
               f"before it the same"

    def line(self) -> str:
        """``file:line (name)`` where the user's code called that module; "" where unknown."""
        return f"{self.mark.line} ({self.mark.name or self.mark.key[0]})" if self.mark.line else ""


def rows_apart(a: Tuple[float, List[float]], b: Tuple[float, List[float]], eps: float = 0.0) -> bool:
    """Two rows differ beyond roundoff: ``NORM`` / ``VALUES`` relative, or ``ROUNDOFF`` x the dtype's
    epsilon where that is more (a half-precision activation)."""
    (na, va), (nb, vb) = a, b
    if abs(na - nb) > max(NORM, ROUNDOFF * eps) * max(abs(na), abs(nb), 1e-30):
        return True
    if len(va) != len(vb):
        return True
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(va, vb)))
    scale = max(math.sqrt(sum(x * x for x in va)), math.sqrt(sum(y * y for y in vb)), 1e-30)
    return diff > max(VALUES, 10 * ROUNDOFF * eps) * scale


def _pairs(mine: List[Any], ref: List[Any]) -> List[Tuple[Any, Any]]:
    """Each of the rank's marks (the rows fed apart: matched already) with the reference's it is matched
    to, by name, else by class; in the rank's call order."""
    named = {o.named: o for o in ref}
    keyed = {o.key: o for o in ref}
    out = []
    for m in mine:
        o = named.get(m.named) or keyed.get(m.key)
        if o is not None and not (m.key[2] == FED and m.key[1] == 0) and m.key[2] != ROUTED:
            out.append((m, o))
    return out


def _first(matched: List[Tuple[Any, Any]], i: int, j: int) -> Tuple[Any, Any]:
    """(the first of the rank's marks whose row ``i`` differs from the reference's row ``j``, the mark
    compared before it); (None, None) where none does."""
    before = None
    for m, o in matched:
        if i >= len(m.rows) or j >= len(o.rows):
            continue
        if rows_apart(m.rows[i], o.rows[j], max(getattr(m, "eps", 0.0), getattr(o, "eps", 0.0))):
            return m, before
        before = m
    return None, None


def first_apart(f: UserFacts) -> Optional[Apart]:
    """The mark that is first to differ in most of the rows fed on both sides whose trails differ; None
    where no trail was recorded or none differs, or where the ranks hold layers sharded (tensor parallel,
    by DTensor or by hand: their modules' outputs are parts by design)."""
    if f.tensor_parallel or f.hand_sharded:
        return None
    ref: Dict[str, Optional[Tuple[Any, int]]] = {}
    for q in f.ref_probes:
        for j, r in enumerate(q.rows):
            k = f"{r:.12g}"
            ref[k] = None if k in ref else (q, j)  # a row fed twice: not matched
    firsts: Counter = Counter()
    seen: Dict[Tuple[str, int, str], Tuple[Any, Any]] = {}
    compared = 0
    for probes in f.rank_probes:
        for p in probes:
            if not getattr(p, "trail", None):
                continue
            matched: Dict[int, List[Tuple[Any, Any]]] = {}  # per reference probe
            for i, r in enumerate(p.rows):
                got = ref.get(f"{r:.12g}")
                if got is None or not getattr(got[0], "trail", None):
                    continue
                compared += 1
                if id(got[0]) not in matched:
                    matched[id(got[0])] = _pairs(p.trail, got[0].trail)
                m, before = _first(matched[id(got[0])], i, got[1])
                if m is not None:
                    firsts[m.key] += 1
                    seen.setdefault(m.key, (m, before))
    if not firsts:
        return None
    key = max(firsts, key=lambda k: firsts[k])
    m, before = seen[key]
    return Apart(m, before, firsts[key], compared)
