"""The global batch of ``dist.benchmark``, where it looks per-rank.

``global_batch`` (older name ``batch_size``) is the samples one step processes over all ranks
together: throughput is it over the step's median, and the report's speed-up compares throughputs.
A per-rank batch given under that name undercounts throughput by the number of ranks, so a row that
scales well reads as a slowdown (0.47x where the true speed-up was 0.82x). One value at every world
size of a group is what that mistake looks like, and also what strong scaling (the same global batch
split over more ranks) looks like: given as ``batch_size``, the report asks which it is; given as
``global_batch``, the test has said.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple


def per_rank_suspects(rows: Sequence) -> List[str]:
    """One line per group whose rows gave the same ``batch_size`` at two or more world sizes."""
    groups: Dict[Tuple[str, str], list] = {}
    for r in rows:
        if r.lane == "history" and r.batch_size:
            groups.setdefault((r.group, r.device_type), []).append(r)
    lines = []
    for (group, _), members in sorted(groups.items()):
        sizes = sorted({r.world_size for r in members})
        batches = {r.batch_size for r in members}
        if len(sizes) < 2 or len(batches) != 1 or any(r.batch_keyword != "batch_size" for r in members):
            continue
        b = batches.pop()
        lines.append(
            f"batch_size={b} at every world size of group {group} ({', '.join(map(str, sizes))}): it is the GLOBAL "
            "batch (all ranks' samples per step), which the speed-up and efficiency columns count. If each rank "
            f"processes {b}, pass global_batch={b} * dist.world_size; if the ranks split {b} between them, pass "
            f"global_batch={b} to say so")
    return lines
