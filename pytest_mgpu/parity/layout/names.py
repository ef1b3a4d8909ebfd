"""The ranks' tensor names in the reference's, whatever wraps the model.

In the ranks (``holders``): the modules that hold every parameter of a model, found by identity
from the outside in (DDP's ``module``, Lightning Fabric's ``_forward_module`` and
``_original_module``, accelerate's and peft's wrappers, a user's own): the name prefixes a
wrapper may add. No list of wrapper names is kept: a module is a holder when its parameters are
all of the model's.

In the test process (``name_map``): the ranks' names against the reference's, in this order:
1. the same names (the common case: no note);
2. one holder prefix dropped on one side and another's added, as recorded by each side (or a
   leading prefix that every name of a side shares);
3. a unique suffix (``a.b.weight`` <-> ``b.weight``);
4. the rest by position and shape, where both sides list the same number of tensors of the same
   shapes (or shards of them) in the same order (the module tree's structure).
Each step beyond the first is named in a note. What maps to nothing is returned, never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

Shape = Tuple[int, ...]


def holders(model, clean: Callable[[str], str], limit: int = 64) -> List[str]:
    """Name prefixes (cleaned, each ending in ".") of the modules below ``model`` that hold all of
    its parameters, by identity, outermost first (in the ranks, once per side). Walked in
    ``named_modules`` order, so each module is named by the path ``named_parameters`` names its
    parameters through; only children of a holder are looked into."""
    ids = {id(p) for p in model.parameters()}
    if not ids:
        return []
    chain = {""}
    out: List[str] = []
    for path, module in model.named_modules():
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        if not path or parent not in chain or {id(p) for p in module.parameters()} != ids:
            continue
        chain.add(path)
        prefix = clean(path)
        if prefix and prefix + "." not in out:
            out.append(prefix + ".")
        if len(out) >= limit:
            break
    return out


@dataclass
class NameMap:
    """rank name -> reference name for the names that map; what did not; how (notes)."""

    to_ref: Dict[str, str] = field(default_factory=dict)
    unmapped: List[str] = field(default_factory=list)  # the ranks' names with no counterpart
    notes: List[str] = field(default_factory=list)
    drop: str = ""  # the prefix mapping found, applied to names outside ``to_ref`` too (``convert``)
    add: str = ""

    def convert(self, name: str) -> str:
        """``name`` in the reference's terms: its mapping, else the prefix mapping, else itself."""
        if name in self.to_ref:
            return self.to_ref[name]
        if (self.drop or self.add) and name.startswith(self.drop):
            return self.add + name[len(self.drop):]
        return name


def name_map(mine: Dict[str, Shape], ref: Dict[str, Shape], my_holders: Sequence[str] = (),
             ref_holders: Sequence[str] = (), partial: bool = False) -> NameMap:
    """Map the ranks' names (``mine``: name -> shape, in their order) onto the reference's.
    ``partial``: the ranks hold parts of the model (pipeline stages, experts), so the reference's
    names no rank holds are not evidence that a rank's name is wrong (no positional mapping)."""
    out = NameMap()
    rest = [n for n in mine if n not in ref]
    out.to_ref = {n: n for n in mine if n in ref}
    if not rest:
        return out
    free = [n for n in ref if n not in out.to_ref.values()]
    found, how, out.drop, out.add = _by_prefix(rest, free, my_holders, ref_holders)
    if found:
        out.to_ref.update(found)
        out.notes.append(how)
        rest = [n for n in rest if n not in found]
        free = [n for n in free if n not in found.values()]
    found = _by_suffix(rest, free)
    if found:
        out.to_ref.update(found)
        out.notes.append("names mapped by their unique ending: " + _examples(found))
        rest = [n for n in rest if n not in found]
        free = [n for n in free if n not in found.values()]
    if rest and not partial and len(rest) == len(free) and all(fits(mine[a], ref[b]) for a, b in zip(rest, free)):
        found = dict(zip(rest, free))
        out.to_ref.update(found)
        out.notes.append(f"{len(found)} name(s) mapped by position and shape in the module tree (the names differ): "
                         + _examples(found))
        rest = []
    out.unmapped = rest
    return out


def fits(mine: Shape, ref: Shape) -> bool:
    """The same shape, or a shard of it: one dimension divides the reference's."""
    if mine == ref:
        return True
    diff = [d for d in range(len(ref)) if len(mine) == len(ref) and mine[d] != ref[d]]
    return len(diff) == 1 and mine[diff[0]] > 0 and ref[diff[0]] % mine[diff[0]] == 0


def _by_prefix(rest: List[str], free: List[str], mine: Sequence[str], theirs: Sequence[str]
               ) -> Tuple[Dict[str, str], str, str, str]:
    """The (drop, add) pair of prefixes that maps the most of ``rest`` onto ``free``."""
    wanted = set(free)
    best: Dict[str, str] = {}
    said = best_drop = best_add = ""
    for drop in [""] + list(dict.fromkeys(list(mine) + _shared_prefixes(rest))):
        for add in [""] + list(dict.fromkeys(list(theirs) + _shared_prefixes(free))):
            if drop == add:
                continue
            got = {n: add + n[len(drop):] for n in rest if n.startswith(drop) and add + n[len(drop):] in wanted}
            if len(got) > len(best):
                best, best_drop, best_add = got, drop, add
                said = " and ".join(w for w in (f"the ranks' '{drop}' dropped" if drop else "",
                                                 f"'{add}' added" if add else "") if w)
    how = (f"names mapped through the modules that hold the model: {said} "
           f"({len(best)} tensor(s), e.g. {_examples(best, 1)})" if best else "")
    return best, how, best_drop, best_add


def _shared_prefixes(names: List[str], depth: int = 3) -> List[str]:
    """The leading components (up to ``depth``) that every name of ``names`` shares."""
    if not names:
        return []
    parts = [n.split(".")[:-1] for n in names]
    out = []
    for k in range(1, depth + 1):
        head = parts[0][:k]
        if len(head) < k or any(p[:k] != head for p in parts):
            break
        out.append(".".join(head) + ".")
    return out


def _by_suffix(rest: List[str], free: List[str]) -> Dict[str, str]:
    """Names where one ends with ``"." + the other``, where that pairing is unique both ways."""
    pairs: Dict[str, List[str]] = {}
    for a in rest:
        pairs[a] = [b for b in free if b.endswith("." + a) or a.endswith("." + b)]
    chosen = {a: bs[0] for a, bs in pairs.items() if len(bs) == 1}
    counts: Dict[str, int] = {}
    for b in chosen.values():
        counts[b] = counts.get(b, 0) + 1
    return {a: b for a, b in chosen.items() if counts[b] == 1}


def _examples(found: Dict[str, str], limit: int = 2) -> str:
    items = list(found.items())
    text = ", ".join(f"{a} -> {b}" for a, b in items[:limit])
    return text + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def rename(tensors: Dict[str, Any], to_ref: Dict[str, str], keep: Optional[Callable[[str], bool]] = None
           ) -> Dict[str, Any]:
    """``tensors`` under the reference's names; names that map to nothing are left out."""
    return {to_ref[n]: t for n, t in tensors.items() if n in to_ref and (keep is None or keep(n))}
