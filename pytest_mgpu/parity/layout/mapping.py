"""The mapping step: what each rank recorded, in the reference's names and shapes, once, with the
groups it found (test process). judge/ and evidence/ read its result, never the raw records.

- Names through any wrapper (``names.py``): the same names, a wrapper's prefix found by identity,
  a unique ending, or position and shape; each way but the first is noted.
- Shards put together (``shards.py``): tensors sharded by hand (found by shape, or stated with
  ``shards=``) gathered in rank order; DTensors and FSDP were already gathered in the ranks.
- The groups (``groups.Layout``): replicas, tensor-parallel peers (those sharing a shard included),
  pipeline stages, expert-parallel ranks.
What maps to nothing is listed, never compared: a tensor without a counterpart is no evidence that
weights differ, and a run with one fails saying what could not be mapped instead of a cause.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..record.recorder import SideLog, StepLog
from .groups import Layout
from .names import NameMap, name_map, rename
from .rows import read_misread
from .shards import Shards, Sharding, describe, find, gather, pieces_off, slice_held, stated, validate


@dataclass
class Mapped:
    """The ranks' records in the reference's terms, and how they were mapped."""

    ranks: List[SideLog]
    layout: Layout
    notes: List[str] = field(default_factory=list)
    unmapped: List[str] = field(default_factory=list)  # the ranks' tensors with no counterpart ("rank r: name")
    missing: List[str] = field(default_factory=list)  # the reference's tensors no rank holds
    mismatched: Dict[str, str] = field(default_factory=dict)  # name -> how its shapes differ, not put together
    sharded: Dict[str, str] = field(default_factory=dict)  # tensors put together from hand shards -> how
    pieces_off: Dict[str, List[int]] = field(default_factory=dict)  # name -> ranks whose starting piece is not their slice
    misplaced: Dict[str, str] = field(default_factory=dict)  # name -> the reference's rows a rank holds, not its block
    untied: Dict[str, str] = field(default_factory=dict)  # "rank r: name" -> the one reference tensor of its shape

    @property
    def failed(self) -> bool:
        """Some tensor could not be compared: the verdict cannot rest on the rest."""
        return bool(self.unmapped or self.missing or self.mismatched)

    @property
    def fewer(self) -> bool:
        """Every tensor of every rank mapped, and the reference trains more: not a mapping that failed
        but a fact of the run (the ranks' optimizer steps fewer parameters)."""
        return bool(self.missing) and not (self.unmapped or self.mismatched or self.layout.pipeline
                                           or self.layout.expert_parallel)

    def failure(self) -> str:
        """What could not be mapped, and how to map it (the failure's first lines, no cause); or,
        where the ranks simply train fewer parameters, that cause."""
        if self.fewer:
            return (f"the ranks' optimizer steps fewer parameters than reference_fn's: {len(self.missing)} of the "
                    f"reference's trained tensor(s) are stepped on no rank (e.g. {', '.join(self.missing[:3])})\n"
                    f"likely cause: the ranks train fewer parameters than the reference ({len(self.missing)} it trains "
                    f"are stepped on no rank, e.g. ...{'.'.join(self.missing[0].split('.')[-4:])}). Fix: give the ranks' "
                    "optimizer the same parameters as the one-device loop's (a module frozen, left out of the "
                    "optimizer's groups, or a wrapper's trainable copy such as peft's modules_to_save missing)")
        parts = []
        if self.mismatched:
            name, how = next(iter(self.mismatched.items()))
            parts.append(f"{len(self.mismatched)} tensor(s) have another shape on the ranks than in the reference "
                         f"and are not a shard the plugin can put together (e.g. {name}: {how})")
        if self.unmapped:
            parts.append(f"{len(self.unmapped)} of the ranks' tensor(s) have no counterpart in the reference "
                         f"(e.g. {', '.join(self.unmapped[:3])})")
        if self.missing:
            parts.append(f"{len(self.missing)} of the reference's tensor(s) are held by no rank "
                         f"(e.g. {', '.join(self.missing[:3])})")
        fix = ("Fix: for a tensor sharded by hand, pass shards={'<name pattern>': <dim>} or a callable that puts the "
               "ranks' pieces together (a fused or interleaved layout); for names that differ, give both loops the "
               "same model class, or check that both optimizers step the same parameters")
        run = self.ranks[0].steps[0].where.get("forward", ()) if self.ranks and self.ranks[0].steps else ()
        at = f" (the ranks' model runs forward at {run[0]})" if run else ""
        head = "not compared (no counterpart in the reference): " + "; ".join(parts) + at + "."
        if self.untied and not self.mismatched:
            mine, theirs = next(iter(self.untied.items()))
            return (f"{head}\nlikely cause: a copy of a tied weight starts from other values than the tensor it "
                    f"copies ({mine} has the shape of the reference's {theirs}, which no other tensor of the "
                    f"reference has, and starts otherwise). Fix: start each copy of a tied weight equal to it (copy "
                    f"or all-reduce it from the rank that holds it before the first step), as the stage holding "
                    f"{theirs} starts")
        if self.misplaced:
            name, words = next(iter(self.misplaced.items()))
            return (f"{head}\nlikely cause: a rank holds another slice of a weight sharded by hand than its own "
                    f"({words}). Fix: slice each rank's block [rank * size:(rank + 1) * size] out of the full weight "
                    "along the sharded dimension; if this layout is meant, pass shards={'<name pattern>': "
                    "callable(pieces) -> the whole tensor}")
        return f"{head}\n{fix}"


def map_sides(ranks: List[SideLog], ref: SideLog, shards: Optional[Shards] = None) -> Mapped:
    """The ranks' records in the reference's names and shapes (``shards``: the user's statement of
    tensors sharded by hand, ``{"name pattern": dim or callable(pieces) -> tensor}``)."""
    spec = validate(shards)
    if not ref.steps or not ranks or not all(side.steps for side in ranks):
        return Mapped(ranks, Layout.of(ranks))
    want = {n: _shape(t) for n, t in ref.steps[0].params.items()}
    partial = len({tuple(sorted(side.steps[0].params)) for side in ranks}) > 1
    maps: Dict[Tuple[str, ...], NameMap] = {}
    notes: List[str] = []
    unmapped: List[str] = []
    named = []
    tied: set = set()  # the reference's tensors that ranks holding other parts each keep a copy of
    untied: Dict[str, str] = {}
    for r, side in enumerate(ranks):
        key = tuple(side.steps[0].params)
        if key not in maps:
            maps[key] = name_map({n: _shape(t) for n, t in side.steps[0].params.items()}, want, side.holders,
                                 ref.holders, partial)
            tied |= _tied(maps[key], ref.aliases, want)
            tied |= _tied_copies(maps[key], side.steps[0].params, ref.steps[0].params)
            notes += [n for n in maps[key].notes if n not in notes]
        unmapped += [f"rank {r}: {n}" if len(ranks) > 1 else n for n in maps[key].unmapped]
        untied.update({f"rank {r}: {n}" if len(ranks) > 1 else n: t for n, t in
                       _shaped_as(maps[key].unmapped, side.steps[0].params, ref.steps[0].params).items()})
        named.append(_renamed(side, maps[key]))
    starts = [side.steps[0].params for side in named]
    sharding = find(starts, ref.steps[0].params, spec)
    off = pieces_off(starts, ref.steps[0].params, sharding)
    _misread(sharding, off, starts, ref.steps[0].params)
    mapped = _gathered(named, sharding) if sharding.rules else named
    held = {n for side in mapped for n in side.steps[0].params}
    missing = [n for n in ref.steps[0].params if n not in held] if not unmapped else []
    return Mapped(mapped, Layout.of(mapped, frozenset(tied)), notes + describe(sharding), unmapped, missing, sharding.mismatched,
                  {n: "by shards=" if r.join else f"along dim {r.dim}" for n, r in sharding.rules.items()},
                  {n: r for n, r in off.items() if n in sharding.rules}, sharding.misplaced, untied)


def _tied(names: NameMap, aliases: Dict[str, str], want: Dict[str, Tuple[int, ...]]) -> set:
    """A rank's tensor named as one of the reference's tied weights' other names (a pipeline's last stage
    holding the output layer that the reference ties to the first stage's embedding) maps to the tensor
    the reference records it by: the ranks keep the copies equal, and each is judged against it."""
    held = set(names.to_ref.values())  # a tensor the rank holds under its own name is no copy's
    found = {n: aliases[names.convert(n)] for n in names.unmapped
             if aliases.get(names.convert(n)) in want and aliases[names.convert(n)] not in held}
    if not found:
        return set()
    names.to_ref.update(found)
    names.unmapped = [n for n in names.unmapped if n not in found]
    names.notes.append("tied weights: " + "; ".join(f"{n} is the reference's {r} (one tensor there)"
                                                   for n, r in list(found.items())[:2]))
    return set(found.values())


def _tied_copies(names: NameMap, mine: Dict[str, Any], ref: Dict[str, Any]) -> set:
    """A rank's tensor with no counterpart by name that starts as exactly one of the reference's tensors
    of its shape, values not all alike (a pipeline's last stage holding its own copy of the word
    embedding, started equal to the first stage's, where the reference uses the embedding itself): that
    tensor's copy, judged against it."""
    import torch

    held = set(names.to_ref.values())  # a tensor the rank holds under its own name is no copy's
    found = {}
    for n in names.unmapped:
        t = mine.get(n)
        if t is None or not _varied(t):
            continue
        same = [r for r, u in ref.items() if u is not None and u.shape == t.shape and u.dtype == t.dtype
                and r not in held and torch.equal(u, t)]
        if len(same) == 1:
            found[n] = same[0]
    if found:
        names.to_ref.update(found)
        names.unmapped = [n for n in names.unmapped if n not in found]
        names.notes.append("tied copies: " + "; ".join(f"{n} starts as the reference's {r} and is judged as a copy "
                                                       "of it" for n, r in list(found.items())[:2]))
    return set(found.values())


def _varied(t: Any) -> bool:
    """A floating tensor whose values are not all alike: its values say which tensor it is (a zeroed or
    constant one could be any of its shape)."""
    return t.numel() > 1 and t.is_floating_point() and not bool((t == t.reshape(-1)[0]).all())


def _shaped_as(unmapped: List[str], mine: Dict[str, Any], ref: Dict[str, Any]) -> Dict[str, str]:
    """The rank's unmapped tensors (values not all alike) of the shape and dtype of exactly one of the
    reference's tensors: a tied copy that did not start equal, where the loop means one."""
    out = {}
    for n in unmapped:
        t = mine.get(n)
        if t is None or not _varied(t):
            continue
        same = [r for r, u in ref.items() if u is not None and u.shape == t.shape and u.dtype == t.dtype]
        if len(same) == 1:
            out[n] = same[0]
    return out


def _misread(sharding: Sharding, off: Dict[str, List[int]], starts: List[Dict[str, Any]], ref: Dict[str, Any]
             ) -> None:
    """Tensors found by shape whose pieces, put together in rank order, are not the reference's
    starting weights on any rank, and whose rank-0 piece is no slice of it at all, while every whole
    tensor the ranks hold starts as the reference's: a layout shapes cannot tell (a fused qkv weight
    whose q, k, v slices interleave), so not a comparison that was made. They move to
    ``mismatched``, asking for ``shards=``; where a piece's rows are the reference's rows in another
    place than a fused layout puts them (every k-th row), in ``misplaced`` too: a slice taken otherwise."""
    import torch

    rank0 = starts[0]
    every = [n for n, r in sharding.rules.items() if not r.stated and r.dim is not None
             and set(off.get(n, ())) >= {g[0] for g in sharding.groups[r.k]}
             and slice_held(rank0[n], ref[n], r.dim, r.k) is None]
    if not every:
        return
    whole = [n for n in ref if n not in sharding.rules and rank0.get(n) is not None and ref[n] is not None]
    if any(not torch.allclose(rank0[n].double(), ref[n].double(), rtol=1e-5, atol=1e-7) for n in whole
           if rank0[n].shape == ref[n].shape):
        return  # the whole tensors start apart too: evidence of another start, judged as such
    for name in every:
        rule = sharding.rules.pop(name)
        group = sharding.groups[rule.k][0]
        held = read_misread(group, [starts[r].get(name) for r in group], ref[name], rule.dim or 0)
        odd = next((h for h in held if h.kind != "fused"), None)
        n = starts[0][name].shape[rule.dim]
        if odd is not None:
            i = group.index(odd.rank)
            sharding.misplaced[name] = odd.words(name, (i * n, (i + 1) * n))
            sharding.mismatched[name] = "its pieces are the reference's rows in other places than each rank's block"
            continue
        i = group.index(held[0].rank) if held else 0
        fused = f" ({held[0].words(name, (i * n, (i + 1) * n))}; {_fused_join(name, held[0].chunks, rule.dim or 0)} " \
            "puts them together)" if held and held[0].kind == "fused" else ""
        sharding.mismatched[name] = (f"its pieces put together along dim {rule.dim} in rank order are not the "
                                     "reference's starting weights, though every whole tensor starts as the "
                                     f"reference's: a fused or interleaved layout{fused}")


def _fused_join(name: str, chunks: int, dim: int) -> str:
    """The ``shards=`` entry that puts a fused layout's pieces together: each chunk's parts in rank order."""
    d = f", {dim}" if dim else ""
    return (f"shards={{'{name.rsplit('.', 1)[0]}.*': lambda pieces: torch.cat([torch.cat([p.chunk({chunks}{d})[j] "
            f"for p in pieces]{d}) for j in range({chunks})]{d})}}")


def _shape(t) -> Tuple[int, ...]:
    return tuple(t.shape) if t is not None else ()


def _renamed(side: SideLog, names: NameMap) -> SideLog:
    """``side`` under the reference's names (itself where every name is the reference's)."""
    if not names.notes and not names.unmapped:
        return side

    def step(s: StepLog) -> StepLog:
        return dataclasses.replace(s, grads=rename(s.grads, names.to_ref), params=rename(s.params, names.to_ref),
                                   untrained={names.convert(n): v for n, v in s.untrained.items()})

    return dataclasses.replace(side, steps=[step(s) for s in side.steps], final=rename(side.final, names.to_ref),
                               start={names.convert(n): v for n, v in side.start.items()})


def _gathered(sides: List[SideLog], sharding: Sharding) -> List[SideLog]:
    """Each rank's steps with its group's shards put together, and its group as its peers."""
    steps = [gather_step([side.steps[i] for side in sides], sharding) for i in range(len(sides[0].steps))]
    finals = gather([side.final for side in sides], sharding) if all(side.final for side in sides) else \
        [side.final for side in sides]
    out = []
    for r, side in enumerate(sides):
        peers = next((g for g in sharding.peers if r in g), [])
        out.append(dataclasses.replace(side, steps=[s[r] for s in steps], final=finals[r],
                                       tp_peers=sorted(set(side.tp_peers) | set(peers))))
    return out


def gather_step(steps: List[StepLog], sharding: Sharding) -> List[StepLog]:
    """One step of every rank, with the shards put together; a param group's size counts the whole
    tensors (where the step has one group; with several, which group holds a piece is not recorded,
    so the size is left out)."""
    grads = gather([s.grads for s in steps], sharding)
    params = gather([s.params for s in steps], sharding)
    out = []
    for s, g, p in zip(steps, grads, params):
        grown = sum(p[n].numel() - s.params[n].numel() for n in sharding.rules if p.get(n) is not None
                    and s.params.get(n) is not None)
        hyper = [dict(h) for h in s.hyper]
        for h in hyper:
            if "parameters" in h:
                if len(hyper) == 1:
                    h["parameters"] += grown
                else:
                    del h["parameters"]
        out.append(dataclasses.replace(s, grads=g, params=p, hyper=hyper))
    return out


def assemble(sides: List[SideLog], shards: Optional[Shards]) -> List[SideLog]:
    """Each side with the tensors ``shards`` names put together from all sides' pieces, in rank
    order (``assert_resumes``: no one-device reference gives the whole shapes, so only what the user
    stated is put together, over every rank)."""
    spec = validate(shards)
    if not spec or not sides or not all(side.steps for side in sides):
        return sides
    sharding = stated(sides[0].steps[0].params, spec, len(sides))
    return _gathered(sides, sharding) if sharding.rules else sides
