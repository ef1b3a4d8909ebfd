"""Model parallel sharded by hand (Megatron-style): each rank holds a slice of a tensor as a plain
tensor, and the reference holds it whole (test process).

Found by shape: a tensor whose shape on every rank is the reference's with one dimension divided
by ``k`` (``k`` dividing the world size) is a shard of a group of ``k`` ranks. The groups are
consecutive ranks (``0-1, 2-3``: Megatron's order) or strided ones (``0, 2`` and ``1, 3``): the
ones whose pieces, put together at the first step, are nearest the reference's starting weights.
Pieces are concatenated in rank order. Where detection cannot see a layout (a fused qkv weight whose
q, k, v slices interleave), the user states it with ``shards={"pattern": dim or callable}``: the
callable gets the pieces of one group in rank order and returns the whole tensor.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

Shape = Tuple[int, ...]
ShardSpec = Union[int, Callable[[List[Any]], Any]]
Shards = Mapping[str, ShardSpec]


@dataclass
class Rule:
    """How one tensor is put together: along ``dim`` or by ``join``, from each group's pieces."""

    dim: Optional[int]
    join: Optional[Callable[[List[Any]], Any]]
    k: int  # ranks per group
    stated: bool  # the user's shards= said so (else detected)


@dataclass
class Sharding:
    rules: Dict[str, Rule] = field(default_factory=dict)  # reference name -> rule
    groups: Dict[int, List[List[int]]] = field(default_factory=dict)  # k -> its groups, in rank order
    notes: List[str] = field(default_factory=list)
    mismatched: Dict[str, str] = field(default_factory=dict)  # name -> "shape a on rank r, b in the reference"
    misplaced: Dict[str, str] = field(default_factory=dict)  # name -> which rows a rank holds instead of its block

    def group_of(self, k: int, rank: int) -> List[int]:
        return next(g for g in self.groups[k] if rank in g)

    @property
    def peers(self) -> List[List[int]]:
        """The ranks that share sharded tensors (each a tensor-parallel group), widest groups first."""
        return self.groups[max(self.groups)] if self.groups else []


def validate(shards: Optional[Shards]) -> Dict[str, ShardSpec]:
    """``shards=`` as given, checked: name patterns to a dimension or a callable."""
    if shards is None:
        return {}
    if not isinstance(shards, Mapping):
        raise TypeError(f"shards must be a dict of name pattern -> dimension (int) or callable(pieces) -> tensor, "
                        f"got {type(shards).__name__}")
    for pattern, how in shards.items():
        if not isinstance(pattern, str) or not (callable(how) or (isinstance(how, int) and not isinstance(how, bool))):
            raise TypeError(f"shards={{{pattern!r}: {how!r}}}: each key is a name pattern (fnmatch, e.g. "
                            "'blocks.*.attn.qkv.weight') and each value a dimension (int) or a callable that takes "
                            "the ranks' pieces in rank order and returns the whole tensor")
    return dict(shards)


def find(ranks: List[Dict[str, Any]], ref: Dict[str, Any], spec: Dict[str, ShardSpec]) -> Sharding:
    """The sharding of every tensor whose shape on the ranks differs from the reference's (each
    rank's step-0 parameters, under the reference's names)."""
    out = Sharding()
    world = len(ranks)
    for name, want in ref.items():
        pieces: List[Any] = [r.get(name) for r in ranks]
        if want is None or any(p is None for p in pieces) or all(tuple(p.shape) == tuple(want.shape) for p in pieces):
            continue
        said = next((how for pattern, how in spec.items() if fnmatch.fnmatchcase(name, pattern)), None)
        rule = _rule(pieces, tuple(want.shape), said, world)
        if rule is None:
            out.mismatched[name] = (f"shape {tuple(pieces[0].shape)} on rank 0, {tuple(want.shape)} in the reference")
        else:
            out.rules[name] = rule
    for k in sorted({r.k for r in out.rules.values()}):
        out.groups[k] = _groups(k, world, {n: r for n, r in out.rules.items() if r.k == k}, ranks, ref)
    return out


def _rule(pieces: List[Any], want: Shape, stated: Optional[ShardSpec], world: int) -> Optional[Rule]:
    shapes = {tuple(p.shape) for p in pieces}
    if len(shapes) != 1:
        return None  # uneven pieces: not a layout this module puts together
    got = shapes.pop()
    if callable(stated):
        k = _ratio(got, want) or world
        return Rule(None, stated, k, True) if world % k == 0 else None
    dims = [d for d in range(len(want)) if len(got) == len(want) and got[d] != want[d]]
    if isinstance(stated, int):
        dims = [stated % len(want)] if len(got) == len(want) else []
    if len(dims) != 1 or any(got[d] != want[d] for d in range(len(want)) if d != dims[0]):
        return None
    d = dims[0]
    if got[d] == 0 or want[d] % got[d]:
        return None
    k = want[d] // got[d]
    return Rule(d, None, k, stated is not None) if k > 1 and world % k == 0 else None


def _ratio(got: Shape, want: Shape) -> int:
    a, b = math.prod(got), math.prod(want)
    return b // a if a and b % a == 0 else 0


def _groups(k: int, world: int, rules: Dict[str, Rule], ranks: List[Dict[str, Any]], ref: Dict[str, Any]
            ) -> List[List[int]]:
    """Consecutive or strided groups of ``k`` ranks: those whose pieces make the reference's
    starting weights most nearly."""
    consecutive = [list(range(i, i + k)) for i in range(0, world, k)]
    strided = [list(range(j, world, world // k)) for j in range(world // k)]
    if consecutive == strided:
        return consecutive

    def distance(groups: List[List[int]]) -> float:
        total = 0.0
        for name, rule in rules.items():
            whole = join([ranks[r][name] for r in groups[0]], rule)
            if whole is not None and tuple(whole.shape) == tuple(ref[name].shape):
                total += float((whole.double() - ref[name].double()).norm())
            else:
                total += math.inf
        return total

    return min((consecutive, strided), key=distance)


def join(pieces: Sequence[Any], rule: Rule):
    """The whole tensor from one group's pieces (None where a piece is missing)."""
    import torch

    if any(p is None for p in pieces):
        return None
    if rule.join is not None:
        return rule.join(list(pieces))
    return torch.cat(list(pieces), dim=rule.dim if rule.dim is not None else 0)


def gather(ranks: List[Dict[str, Any]], sharding: Sharding) -> List[Dict[str, Any]]:
    """Each rank's tensors with its group's pieces put together (every rank of a group then holds
    the same whole tensor); other tensors as they are."""
    out = [dict(r) for r in ranks]
    for name, rule in sharding.rules.items():
        for group in sharding.groups[rule.k]:
            whole = join([ranks[r].get(name) for r in group], rule)
            for r in group:
                out[r][name] = whole
    return out


def describe(sharding: Sharding) -> List[str]:
    """Notes: which tensors were put together, along what, from which ranks (the issue's wording:
    "fc1.weight: gathered along dim 0 from ranks 0-1")."""
    notes = []
    for k, groups in sharding.groups.items():
        how: Dict[str, List[str]] = {}
        for n, r in sharding.rules.items():
            if r.k == k:
                key = "put together by shards=" if r.join is not None else \
                    f"gathered along dim {r.dim}{' (shards=)' if r.stated else ''}"
                how.setdefault(key, []).append(n)
        parts = [f"{', '.join(names[:4])}{f' (+{len(names) - 4} more)' if len(names) > 4 else ''}: {key}"
                 for key, names in how.items()]
        notes.append(f"model parallel by hand: {'; '.join(parts)}; from ranks {'; '.join(_span(g) for g in groups)} "
                     "in rank order")
    return notes


def _span(group: List[int]) -> str:
    return f"{group[0]}-{group[-1]}" if group == list(range(group[0], group[-1] + 1)) and len(group) > 2 or \
        (len(group) == 2 and group[1] == group[0] + 1) else ", ".join(map(str, group))


def _near(got, want, rel: float) -> bool:
    """``got`` is ``want`` to ``rel`` norm-wise (the same shape)."""
    want = want.double()
    return tuple(got.shape) == tuple(want.shape) and \
        float((got.double() - want).norm()) <= rel * max(float(want.norm()), 1e-30)


def slice_held(piece, whole, dim: int, k: int, rel: float = 1e-5) -> Optional[int]:
    """Which of the ``k`` slices of ``whole`` along ``dim`` ``piece`` is (None: none of them)."""
    size = piece.shape[dim]
    return next((i for i in range(k) if _near(piece, whole.narrow(dim, i * size, size), rel)), None)


def pieces_off(ranks: List[Dict[str, Any]], ref: Dict[str, Any], sharding: Sharding, rel: float = 1e-5
               ) -> Dict[str, List[int]]:
    """Per tensor put together: the ranks whose piece of the starting weights is not their slice of
    the reference's (a callable's group as a whole) (evidence of a wrong slice; ``rel``: norm-wise, far above the
    roundoff of an init computed in another order)."""
    out: Dict[str, List[int]] = {}
    for name, rule in sharding.rules.items():
        if ref.get(name) is None:
            continue
        if rule.dim is None:  # put together by the user's callable: which piece is off cannot be told
            for group in sharding.groups[rule.k]:
                whole = join([ranks[r].get(name) for r in group], rule)
                if whole is not None and not _near(whole, ref[name], rel):
                    out.setdefault(name, []).extend(group)
            continue
        for group in sharding.groups[rule.k]:
            for i, r in enumerate(group):
                piece = ranks[r].get(name)
                if piece is not None and not _near(piece, ref[name].narrow(rule.dim, i * piece.shape[rule.dim],
                                                                           piece.shape[rule.dim]), rel):
                    out.setdefault(name, []).append(r)
    return out


def stated(params: Dict[str, Any], spec: Dict[str, ShardSpec], world: int) -> Sharding:
    """The sharding ``shards=`` states for ``params``' names, over all ``world`` ranks in one group."""
    out = Sharding()
    for name in params:
        how = next((h for pattern, h in spec.items() if fnmatch.fnmatchcase(name, pattern)), None)
        if how is not None and world > 1:
            out.rules[name] = Rule(None, how, world, True) if callable(how) else Rule(how, None, world, True)
    if out.rules:
        out.groups[world] = [list(range(world))]
    return out


def not_for_parity() -> None:
    """``assert_parity(shards=...)``: refused, saying where the keyword belongs."""
    raise TypeError("assert_parity(shards=...): assert_parity builds every side's model itself in whole tensors (its "
                    "strategies gather FSDP's and DTensors' shards in the ranks), so there is nothing sharded by hand to "
                    "put together. shards= is for your own loop: dist.assert_same_training(fn, reference_fn, shards=...) "
                    "or dist.assert_resumes(..., shards=...)")
