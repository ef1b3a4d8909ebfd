"""Phase 2, the rows each rank fed, against the reference's batch: every data-parallel rank the
same rows (no DistributedSampler), tensor-parallel peers with different rows (rank-dependent
inputs), rows of the reference's batch on no rank (another sampler or order), batches of another
size, unequal shards, and a shuffle order that repeats on one side only (``set_epoch`` never
called, or a data iterator restarted). Rows are compared as fingerprints (``record.watch``)."""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional

from .facts import REFERENCE, UserFacts
from .finding import Finding
from .near import near_rows


def _uneven_passes(f: UserFacts) -> Optional[Finding]:
    """Rank 0 accumulates (most of its steps take k > 1 backward passes) but some step before its last took
    another number, where the reference takes one number at every step: the boundary of the accumulation
    is counted otherwise (a step after the first micro-batch alone, ``i % k == 0`` with ``i`` from 0)."""
    mine = [per[0] for per in f.rank_step_backwards if per]
    ref = f.ref_step_backwards
    if len(mine) < 3 or len(set(ref)) != 1:
        return None
    usual = Counter(mine).most_common(1)[0][0]
    odd = [s for s, m in enumerate(mine[:-1]) if m != usual]  # the last step may be a shorter one
    if usual < 2 or not odd:
        return None
    s = odd[0]
    return Finding(s, "inputs", "a value", "passes-uneven", f"at step {s} rank 0 stepped after {mine[s]} backward "
                   f"pass(es), at its other steps after {usual}; the reference after {ref[0]} at every step",
                   value=mine[s])


def _key(rows: List[float]) -> Counter:
    return Counter(float(f"{v:.12g}") for v in rows)


def own_rows(f: UserFacts, step: int = 0) -> bool:
    """At ``step`` every rank fed rows of its own, which together are rows of the reference's batch (each
    its own tokens, as data and expert parallelism feed them; tensor-parallel peers share one batch)."""
    ranks = f.rank_rows[step] if step < len(f.rank_rows) else []
    ref = f.ref_rows[step] if step < len(f.ref_rows) else []
    keys = [_key(r) for r in ranks]
    return len(keys) > 1 and all(keys) and bool(ref) and all(a != b for i, a in enumerate(keys) for b in keys[i + 1:]) \
        and not (sum(keys, Counter()) - _key(ref))


def findings(f: UserFacts) -> List[Finding]:
    out = [_uneven_passes(f), _epochs(f), _rows(f), _same_losses(f)]  # a repeated order explains the rows it misses
    return [x for x in out if x is not None]


def _group_rows(f: UserFacts, ranks: List[List[float]]) -> List[List[float]]:
    """One list of rows per data group: tensor-parallel peers train one batch (each the same rows,
    or its own shard of them under sequence parallelism)."""
    groups = f.data_groups or [[r] for r in range(len(ranks))]
    out = []
    for g in groups:
        peers = [ranks[r] for r in g if r < len(ranks)]
        same = all(_key(p) == _key(peers[0]) for p in peers[1:])
        out.append(list(peers[0]) if same else [v for p in peers for v in p])
    return out


def batch_differs(f: UserFacts, step: int) -> bool:
    """Both sides' rows were recorded at ``step`` and the data groups' rows together are not the
    reference's batch (what ``findings`` says how); False under a sequence split or where not recorded."""
    ref = f.ref_rows[step] if step < len(f.ref_rows) else []
    ranks = f.rank_rows[step] if step < len(f.rank_rows) else []
    if f.sequence_split or not ref or not ranks or not all(ranks):
        return False
    return sum((_key(g) for g in _group_rows(f, ranks)), Counter()) != _key(ref)


def sequence_split(ref_chunks: List[Dict[int, List[float]]], rank_rows: List[List[List[float]]]) -> int:
    """W where, at every step with rows, rank r of W fed part r of each of the reference's rows (its rows'
    W equal contiguous parts: the sequence split of context parallelism); 0 where not (or at no step)."""
    seen = 0
    for chunks, ranks in zip(ref_chunks, rank_rows):
        world = len(ranks)
        parts = chunks.get(world, []) if world > 1 else []
        if not parts or not all(ranks):
            continue
        if any(_key(rows) != _key(parts[r::world]) for r, rows in enumerate(ranks)):
            return 0
        seen += 1
    return len(rank_rows[0]) if seen else 0


def _rows(f: UserFacts) -> Optional[Finding]:
    if f.sequence_split:
        return None  # each rank fed its part of every row: the batch is the reference's
    for step, (ref, ranks) in enumerate(zip(f.ref_rows, f.rank_rows)):
        if not ref or not all(ranks):
            continue
        said = _tp_rows(f, step, ref, ranks) if f.tensor_parallel else None
        said = said or _dp_rows(step, ref, _group_rows(f, ranks), len(ranks))
        if said and said.signal == "rows-missing" and step == 0:
            near = near_rows(f)
            if near is not None:
                return Finding(0, "inputs", "certain rows", "rows-transformed",
                               f"{said.evidence.replace(' were fed', ' fed')}, {near.words()}",
                               value=said.value)
        if said:
            return said
    return None


def tp_rows_differ(f: UserFacts) -> bool:
    """Tensor-parallel peers fed rows that are not one batch at some step."""
    for i, (ref, rows) in enumerate(zip(f.ref_rows, f.rank_rows)):
        found = _tp_rows(f, i, ref, rows) if ref and all(rows) else None
        if found is not None and found.signal == "rows-tp-differ":
            return True
    return False


def _tp_rows(f: UserFacts, step: int, ref: List[float], ranks: List[List[float]]) -> Optional[Finding]:
    """Peers of a tensor-parallel group must train one batch: the same rows, or shards of it."""
    for g in f.data_groups:
        peers = [r for r in g if r < len(ranks)]
        differs = [r for r in peers[1:] if _key(ranks[r]) != _key(ranks[peers[0]])]
        if not differs:
            mine = ranks[peers[0]]
            if len(f.data_groups) == 1 and len(peers) > 1 and len(ref) == len(peers) * len(mine) \
                    and not (_key(mine) - _key(ref)):
                return Finding(step, "inputs", "certain rows", "rows-tp-same",
                               f"at step {step} ranks {', '.join(map(str, peers))} each fed the same {len(mine)} rows, "
                               f"while the reference trained {len(ref)} = {len(peers)} x {len(mine)}")
            continue
        together = sum((_key(ranks[r]) for r in peers), Counter())
        if not (together - _key(ref)):
            continue  # each peer a shard of the reference's rows: sequence-sharded input, by design
        return Finding(step, "inputs", "certain rows", "rows-tp-differ",
                       f"at step {step} tensor-parallel peer(s) {', '.join(map(str, differs))} fed other rows than "
                       f"rank {peers[0]}, though ranks {', '.join(map(str, peers))} share their parameters as DTensors",
                       names=tuple(map(str, differs)))
    return None


def _dp_rows(step: int, ref: List[float], groups: List[List[float]], world: int) -> Optional[Finding]:
    first = _key(groups[0])
    if len(groups) > 1 and all(_key(g) == first for g in groups[1:]):
        if len(ref) <= len(groups[0]) and (first & _key(ref) or len(ref) != len(groups[0]) or step > 0):
            return _missing(step, ref, groups)  # one batch for all by design; another batch on one side
        if len(ref) <= len(groups[0]):
            return Finding(step, "inputs", "certain rows", "rows-same",
                           f"at step {step} every one of the {len(groups)} data-parallel ranks fed the same "
                           f"{len(groups[0])} rows, none of them the reference's")
        return Finding(step, "inputs", "certain rows", "rows-same",
                       f"at step {step} every one of the {len(groups)} data-parallel ranks fed the same "
                       f"{len(groups[0])} rows while the reference trained on {len(ref)}")
    sizes = [len(g) for g in groups]
    if sum(sizes) != len(ref):
        who = "ranks" if len(groups) == world else "data-parallel groups"
        parts = " + ".join(map(str, sizes)) + " = " if len(sizes) > 1 else ""
        return Finding(step, "inputs", "certain rows", "rows-size",
                       f"at step {step} the {who} fed {parts}{sum(sizes)} rows, the reference {len(ref)}",
                       value=sum(sizes) / max(1, len(ref)),
                       detail=f"Give the one-device loop batch_size x {len(groups)} ({sizes[0]} x {len(groups)} = "
                       f"{sizes[0] * len(groups)}), or each rank batch_size // {len(groups)}.")
    said = _missing(step, ref, groups)
    if said:
        return said
    if len(set(sizes)) > 1:
        return Finding(step, "inputs", "certain rows", "rows-unequal",
                       f"at step {step} the data-parallel ranks fed {'/'.join(map(str, sizes))} rows "
                       f"({sum(sizes)} in all, the reference's batch)")
    return None


def _missing(step: int, ref: List[float], groups: List[List[float]]) -> Optional[Finding]:
    """Rows of the reference's batch that no data-parallel group trained on."""
    same = len(groups) > 1 and all(_key(g) == _key(groups[0]) for g in groups[1:])
    together = _key(groups[0]) if same else sum((_key(g) for g in groups), Counter())
    missing = sum((_key(ref) - together).values())
    if not missing:
        return None
    return Finding(step, "inputs", "certain rows", "rows-missing",
                   f"at step {step} {missing} of the reference's {len(ref)} rows were fed on no rank", value=missing)


def _repeat(rows_per_step: List[List[float]]) -> int:
    """The first step > 0 that trained on exactly step 0's rows again (0: none did)."""
    if not rows_per_step or not rows_per_step[0]:
        return 0
    first = _key(rows_per_step[0])
    return next((s for s, rows in enumerate(rows_per_step) if s and rows and _key(rows) == first), 0)


def _epochs(f: UserFacts) -> Optional[Finding]:
    """One side's shuffle order repeats (a later step sees step 0's rows again), the other's not."""
    ref, ranks = _repeat(f.ref_rows), _repeat([per_rank[0] for per_rank in f.rank_rows])
    if bool(ref) == bool(ranks):
        return None
    who, step = (REFERENCE, ref) if ref else ("fn on rank 0", ranks)
    what = f"at step {step} {who} fed exactly the rows of step 0 again, while the other side went on to new rows"
    if f.set_epoch_calls.get(who) or not f.sampler_passes.get(who):
        return Finding(step, "inputs", "certain rows", "data-restart", what)
    return Finding(step, "inputs", "certain rows", "epoch-repeat", what + " (it never calls DistributedSampler.set_epoch)")


def _same_losses(f: UserFacts) -> Optional[Finding]:
    """Without rows recorded: ranks that logged the same loss at every step trained the same samples."""
    if f.world_size < 2 or not f.rank_losses or f.tensor_parallel or any(any(r) for r in f.rank_rows):
        return None
    if not all(len(set(losses)) == 1 for losses in f.rank_losses):
        return None
    first = f.rank_losses[0]
    return Finding(0, "inputs", "certain rows", "rows-same",
                   f"ranks 0-{len(first) - 1} logged the same loss at every step (step 0: {first[0]:.6g} on every rank)")
