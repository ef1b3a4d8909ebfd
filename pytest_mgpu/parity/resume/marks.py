"""Which state of the uninterrupted run a resumed run starts from, told from the parameters.

The test process sends the ranks a mark of every state the uninterrupted run passed through (before
step 1, after step 1, ... after step N): per tensor, its sum, its norm and its dot product with a
fixed pseudo-random vector, in float64. A resumed rank marks its parameters at its first step and
takes the closest state; from it, the steps left to reach N. A correct resume loads the checkpoint's
tensors exactly (a reshard too: the same numbers, cut differently), so the right state is closer by
orders of magnitude than its neighbours, which differ by a whole optimizer step.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Mapping, Sequence, Tuple

Mark = Dict[str, Tuple[float, float, float]]
SAME = 1e-6  # relative distance under which a mark is the state itself (float32 roundoff of a sum is ~1e-7)


@functools.lru_cache(maxsize=64)
def _probe(n: int):
    import torch

    g = torch.Generator().manual_seed(1234567)
    return torch.rand(n, generator=g, dtype=torch.float64) - 0.5


def mark(params: Mapping[str, object]) -> Mark:
    """The mark of one state (full tensors; None entries are skipped)."""
    import torch

    out: Mark = {}
    for name, t in params.items():
        if t is None:
            continue
        x = t.detach().reshape(-1).to("cpu", dtype=torch.float64)  # type: ignore[attr-defined]
        out[name] = (float(x.sum()), float(x.norm()), float(x @ _probe(x.numel())))
    return out


def distance(a: Mark, b: Mark) -> float:
    """The largest relative difference between two marks over their tensors (inf where the names or
    the number of tensors differ)."""
    if not a or set(a) != set(b):
        return math.inf
    worst = 0.0
    for name, xs in a.items():
        ys = b[name]
        if not all(map(math.isfinite, xs + ys)):  # inf or NaN: no distance can be told
            return math.inf
        scale = max(abs(ys[1]), 1e-12)
        worst = max(worst, max(abs(x - y) for x, y in zip(xs, ys)) / scale)
    return worst


def finite(state: Mark) -> bool:
    return all(math.isfinite(x) for xs in state.values() for x in xs)


def closest(state: Mark, states: Sequence[Mark]) -> Tuple[int, float]:
    """(index, distance) of the state nearest ``state``; (0, inf) where none compares."""
    best, at = math.inf, 0
    for i, other in enumerate(states):
        d = distance(state, other)
        if d < best:
            best, at = d, i
    return at, best


def tensor_distances(a: Mapping[str, object], b: Mapping[str, object]) -> List[Tuple[str, float]]:
    """Per tensor, ||a - b|| / ||b|| (full tensors, test process), largest first."""
    out = []
    for name, t in a.items():
        other = b.get(name)
        if t is None or other is None or t.shape != other.shape:  # type: ignore[attr-defined]
            out.append((name, math.inf))
            continue
        ref = other.double()  # type: ignore[attr-defined]
        out.append((name, float((t.double() - ref).norm()) / max(float(ref.norm()), 1e-12)))  # type: ignore[attr-defined]
    return sorted(out, key=lambda x: -x[1])
