"""Phase 3, the loss, to the line: where step 0's loss differs on the same outputs (``outputs.py``: the
rows' loss gradients differ with the same weights and outputs), the calls that made each side's loss from
its output (``record/loss_ops.py``), the reference's lined up against rank 0's, name the first call that
differs, with its line in the loop.

What a data-parallel loop does otherwise for its layout is not read as a difference: calls that move or
shape tensors (gathering the ranks' parts, slicing a rank's rows, building index tensors), sizes that
differ by the world size, a multiplication or division by the world size the ranks add. A difference a loop
makes again at the same lines (each output of deep supervision) is one place. Where more than ``MOST``
places differ, or fewer than half the calls are made alike (a surrogate backward of cached gradients against
the loss itself), the two loops are written otherwise, and nothing is said."""
from __future__ import annotations

import difflib
import re
from dataclasses import replace
from typing import Any, Final, List, Optional, Sequence, Tuple

from .facts import UserFacts
from .finding import Finding

MOST: Final = 3  # places that differ, at most, for a first one to be named
ALIKE: Final = 0.5  # the share of calls the two sides make alike (difflib's ratio), at least, for any to be named
# The loss-phase signals of outputs.py that say the loss differs on the same outputs.
ON_SAME_OUTPUTS: Final = ("loss-formula", "loss-row-weights", "loss-rows-moved", "loss-positions",
                          "loss-positions-extra", "loss-positions-other", "loss-row-mean", "loss-row-sum",
                          "loss-call-scale", "loss-rank-scale")
GENERIC: Final = ("loss-formula", "loss-row-weights")  # those that say no more than that the loss differs
# Calls that move, shape, convert or make tensors: how a layout gathers and slices, not what a loss computes.
SHAPING: Final = frozenset(
    "cat concat concatenate stack hstack vstack split chunk tensor_split unbind view view_as reshape reshape_as "
    "flatten unflatten contiguous clone to float double half bfloat16 long int bool type type_as squeeze unsqueeze "
    "expand expand_as narrow repeat permute transpose t movedim empty empty_like zeros zeros_like ones ones_like full "
    "full_like new_zeros new_ones new_empty new_full new_tensor tensor as_tensor arange cpu cuda copy_ fill_ zero_ "
    "__setitem__ detach all_gather all_gather_into_tensor all_reduce reduce_scatter wait_tensor".split())
SCALES: Final = frozenset("mul div true_divide __mul__ __truediv__ __rmul__".split())
NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?$")


def _name(op: Any) -> str:
    return op.name


def _args(op: Any) -> List[str]:
    return list(op.args)


def _rows_index(op: Any) -> bool:
    """An index that picks rows (one index, or several whose first is not a whole ``:``): a rank's slice of
    the batch."""
    args = _args(op)
    return _name(op) == "__getitem__" and len(args) >= 2 and not (args[1].startswith("(") and
                                                                 args[1][1:].split(",")[0].strip() == ":")


def _by_world(a: str, b: str, world: int) -> bool:
    """Two numbers whose ratio is the world size (a global count against a rank's)."""
    if not (NUMBER.match(a) and NUMBER.match(b)):
        return False
    x, y = float(a), float(b)
    return bool(x and y) and any(abs(r - world) < 1e-6 * world for r in (x / y, y / x))


def _same_but_layout(r: Any, m: Any, world: int) -> bool:
    """One call on both sides whose arguments differ only as a layout makes them."""
    if _name(r) in SHAPING or (_rows_index(r) and _rows_index(m)):
        return True
    pairs = [(a, b) for a, b in zip(_args(r), _args(m)) if a != b]
    return len(_args(r)) == len(_args(m)) and bool(pairs) and all(_by_world(a, b, world) for a, b in pairs)


def _by_world_scale(op: Any, world: int) -> bool:
    """A multiplication or division by the world size."""
    return _name(op) in SCALES and any(NUMBER.match(a) and abs(float(a) - world) < 1e-6 for a in _args(op))


def _identity(op: Any) -> bool:
    """``x + 0``, ``x * 1``: a rank's offset or factor that is nothing on rank 0."""
    args = _args(op)
    unit = {"add": "0", "sub": "0", "__add__": "0", "__sub__": "0", "__radd__": "0", "mul": "1", "__mul__": "1",
            "__rmul__": "1", "div": "1", "__truediv__": "1"}.get(_name(op))
    return unit is not None and len(args) == 2 and unit in args


def _layout_only(ops: Sequence[Any], world: int, scales: bool = True) -> bool:
    """Calls one side makes alone that only gather, slice or add a rank's offset (or, with ``scales``, scale by
    the world size)."""
    return all(_name(op) in SHAPING or _rows_index(op) or _identity(op) or (scales and _by_world_scale(op, world))
               for op in ops)


def _meaningful(block: Tuple[str, int, int, int, int], ref: Sequence[Any], mine: Sequence[Any], world: int,
                scales: bool = False) -> bool:
    """A place where the calls differ otherwise than a layout makes them; a scale by the world size counts as
    a layout's only with ``scales`` or where it scales the loss itself (the last call before backward)."""
    tag, i1, i2, j1, j2 = block
    if tag == "replace" and i2 - i1 == j2 - j1 and all(_name(a) == _name(b) for a, b in zip(ref[i1:i2], mine[j1:j2])):
        return not all(_same_but_layout(a, b, world) for a, b in zip(ref[i1:i2], mine[j1:j2]))
    last = i2 == len(ref) and j2 == len(mine)
    return not (_layout_only(ref[i1:i2], world, scales or last) and _layout_only(mine[j1:j2], world, scales or last))


SOURCE: Final = 60  # characters of a line's code quoted


def _code(op: Any) -> str:
    code = op.source if len(op.source) <= SOURCE else op.source[:SOURCE - 3] + "..."
    return f": `{code}`" if code else ""


def _split(op: Any) -> Tuple[List[str], dict]:
    """An op's arguments: the positional ones, and the named ones by name."""
    pos, named = [], {}
    for a in _args(op):
        key, eq, value = a.partition("=")
        if eq and key.isidentifier():
            named[key] = value
        else:
            pos.append(a)
    return pos, named


def _pair(r: Any, m: Any) -> Tuple[str, str]:
    """Two calls of one function, each said by the arguments that differ alone (``kl_div(reduction='mean')``,
    ``cross_entropy(no weight)``)."""
    (rp, rn), (mp, mn) = _split(r), _split(m)
    if r.shown.startswith("x") or len(rp) != len(mp):
        return r.shown, m.shown
    theirs = [a for a, b in zip(rp, mp) if a != b]
    ours = [b for a, b in zip(rp, mp) if a != b]
    for k in dict.fromkeys(list(rn) + list(mn)):
        if rn.get(k) != mn.get(k):
            theirs.append(f"{k}={rn[k]}" if k in rn else f"no {k}")
            ours.append(f"{k}={mn[k]}" if k in mn else f"no {k}")
    return f"{_name(r)}({', '.join(theirs)})", f"{_name(m)}({', '.join(ours)})"


def _count(r: Any, m: Any) -> str:
    """Said of a division by a smaller whole number on the rank than in the reference: what such a divisor
    usually is (a temperature is no whole number's division)."""
    if _name(r) not in ("div", "true_divide", "__truediv__") or len(_args(r)) != 2 or len(_args(m)) != 2:
        return ""
    theirs, ours = _args(r)[1], _args(m)[1]
    if NUMBER.match(theirs) and NUMBER.match(ours) and 0 < float(ours) < float(theirs) and \
            float(ours).is_integer() and float(theirs).is_integer():
        return " (a count over the rank's own rows, where the reference counts the whole batch)"
    return ""


def _said(block: Tuple[str, int, int, int, int], ref: Sequence[Any], mine: Sequence[Any], world: int) -> Tuple[str, str]:
    """(words, line) for one place that differs: the calls, then the line's code; the line is rank 0's
    (the reference's where rank 0 makes no such call)."""
    tag, i1, i2, j1, j2 = block
    if tag == "replace" and i2 - i1 == j2 - j1 and all(_name(a) == _name(b) for a, b in zip(ref[i1:i2], mine[j1:j2])):
        r, m = next((a, b) for a, b in zip(ref[i1:i2], mine[j1:j2]) if not _same_but_layout(a, b, world))
        theirs, ours = _pair(r, m)
        return f"rank 0 computes {ours}, the reference {theirs}{_count(r, m)}{_code(m)}", m.line
    if tag == "delete":
        r = next((op for op in ref[i1:i2] if not _layout_only([op], world, False)), ref[i1])
        return f"rank 0 skips {r.shown}, which the reference computes{_code(r)}", f"{r.line} in the reference"
    m = next((op for op in mine[j1:j2] if not _layout_only([op], world, False)), mine[j1])
    if tag == "insert":
        return f"rank 0 computes {m.shown}, which the reference does not{_code(m)}", m.line
    r = next((op for op in ref[i1:i2] if not _layout_only([op], world, False)), ref[i1])
    return f"rank 0 computes {m.shown}, the reference {r.shown}{_code(m)}", m.line


def _signature(block: Tuple[str, int, int, int, int], ref: Sequence[Any], mine: Sequence[Any]) -> Tuple[Any, ...]:
    """A place by what differs there and where: the same difference made again by a loop (each output of deep
    supervision, each micro-batch's loss) is one place."""
    tag, i1, i2, j1, j2 = block
    return tag, tuple((o.key, o.line) for o in ref[i1:i2]), tuple((o.key, o.line) for o in mine[j1:j2])


def _alike(matcher: difflib.SequenceMatcher, ref: Sequence[Any], mine: Sequence[Any], world: int) -> float:
    """difflib's ratio over the calls that compute (a layout's gathering and slicing left out)."""
    def computing(ops: Sequence[Any]) -> int:
        return sum(not _layout_only([op], world) for op in ops)

    same = sum(computing(ref[b.a:b.a + b.size]) for b in matcher.get_matching_blocks())
    total = computing(ref) + computing(mine)
    return 2 * same / total if total else 0.0


def _first_ops(probes: Sequence[Any]) -> List[Any]:
    return next((list(p.ops) for p in probes if getattr(p, "ops", None)), [])


def difference(f: UserFacts, step: int = 0) -> Optional[Tuple[str, str]]:
    """(words, line) of the first call that makes ``step``'s loss otherwise on rank 0 than in the reference;
    None where both made the same calls (as their layouts differ), where either was not seen, or where
    they differ in more than ``MOST`` places."""
    if step == 0:
        ref = _first_ops(f.ref_probes)
        mine = _first_ops(f.rank_probes[0]) if f.rank_probes else []
    else:
        mine, ref = f.later_ops[step] if step < len(f.later_ops) else ([], [])
    if not ref or not mine:
        return None
    matcher = difflib.SequenceMatcher(None, [o.key for o in ref], [o.key for o in mine], autojunk=False)
    if _alike(matcher, ref, mine, f.world_size) < ALIKE:
        return None  # the two losses are not made by the same calls (a surrogate backward, another formula)
    places = list({_signature(b, ref, mine): b for b in reversed(matcher.get_opcodes())
                   if b[0] != "equal" and _meaningful(b, ref, mine, f.world_size)}.values())[::-1]
    if not places or len(places) > MOST:
        return None
    first = next((b for b in places if _meaningful(b, ref, mine, f.world_size, scales=True)), places[0])
    words, line = _said(first, ref, mine, f.world_size)
    more = f"; {len(places) - 1} more place{'s' if len(places) > 2 else ''} differ{'' if len(places) > 2 else 's'}" \
        if len(places) > 1 else ""
    return words + more, line


def sharpened(outs: List[Finding], f: UserFacts) -> List[Finding]:
    """``outs`` (the output phase's findings) with the first call that differs, where step 0's loss differs on
    the same outputs: said before a finding that names no cause of its own (the formula, per-row weights),
    else given to that finding as its line, and said after its fix (a mask, a count, an offset)."""
    i = next((i for i, x in enumerate(outs) if x.step == 0 and x.signal in ON_SAME_OUTPUTS), None)
    found = difference(f) if i is not None else None
    if i is None or found is None:
        return outs
    words, line = found
    x = outs[i]
    at = f"{line} (the loss)" if line else ""
    if x.signal in GENERIC:
        return outs[:i] + [Finding(0, "loss", "certain rows", "loss-ops", f"at step 0, {words}", line=at)] + outs[i:]
    detail = " ".join(p for p in (x.detail, f"The first call that differs: {words}.") if p)
    return outs[:i] + [replace(x, detail=detail, line=at or x.line)] + outs[i + 1:]
