"""Which rows of the reference's starting tensor a rank's hand-sharded piece holds, where its piece is
no block of it (test process): read from the values, so a layout shapes cannot tell is named.

- ``fused``: the rank's part of each of ``c`` equal chunks (a fused qkv weight sliced per part, as
  Megatron's ``linear_qkv`` or nanoGPT's ``c_attn`` sharded by hand): a layout, stated with ``shards=``.
- ``strided`` (every ``k``-th row) or ``other`` (rows in another order or place): a slice taken
  otherwise than the rank's block, a bug unless the layout is meant.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Literal, Optional, Tuple

Kind = Literal["fused", "strided", "other"]
FUSED_PARTS = 4  # at most: q, k, v (3), gate and up (2), or 4


@dataclass(frozen=True)
class RowsHeld:
    """The reference's rows (along ``dim``) one rank's piece holds, and how they lie."""

    rank: int
    dim: int
    rows: Tuple[int, ...]
    kind: Kind
    chunks: int = 1  # fused: the equal chunks the rank holds a part of

    def words(self, name: str, block: Tuple[int, int]) -> str:
        """``rank 1 holds rows 1, 3, 5, ... of fc1.weight (every 2nd row along dim 0), not its block 4-7``."""
        how = {"fused": f"its part of each of {self.chunks} equal chunks, as a fused weight holds them",
               "strided": f"every {_nth(self.rows[1] - self.rows[0])} along dim {self.dim}",
               "other": f"along dim {self.dim}"}[self.kind]
        return (f"rank {self.rank} holds rows {spans(self.rows)} of {name} ({how}), not its block "
                f"{block[0]}-{block[1] - 1}")


def _nth(n: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(n, f"{n}th") + " row"


def spans(rows: Tuple[int, ...], limit: int = 3) -> str:
    """``0-3, 16-19, 32-35`` (runs of consecutive rows), or ``1, 3, 5, ...`` past ``limit`` runs."""
    runs: List[List[int]] = []
    for r in rows:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    said = [f"{a}-{b}" if b > a else f"{a}" for a, b in runs]
    return ", ".join(said[:limit]) + (", ..." if len(said) > limit else "")


def rows_held(piece: Any, whole: Any, dim: int, rank: int, k: int, rel: float = 1e-5) -> Optional[RowsHeld]:
    """The rows of ``whole`` along ``dim`` that ``piece`` holds, each found by its values; None where a
    row of the piece is no row of ``whole`` (another init) or rows repeat."""
    import torch

    mine = piece.detach().double().movedim(dim, 0).reshape(piece.shape[dim], -1)
    full = whole.detach().double().movedim(dim, 0).reshape(whole.shape[dim], -1)
    if mine.shape[1] != full.shape[1] or not mine.shape[0]:
        return None
    dist = torch.cdist(mine, full)
    best = dist.argmin(dim=1)
    scale = full.norm(dim=1).clamp_min(1e-30)
    if bool((dist.gather(1, best[:, None])[:, 0] > rel * scale[best]).any()):
        return None
    rows = tuple(int(i) for i in best)
    if len(set(rows)) < len(rows):
        return None
    return RowsHeld(rank, dim, rows, *_kind(rows, whole.shape[dim], rank, k))


def _kind(rows: Tuple[int, ...], size: int, rank: int, k: int) -> Tuple[Kind, int]:
    n = len(rows)
    for c in range(2, min(FUSED_PARTS, n // 2) + 1):  # a part of one row each is a stride, not a fusion
        if n % c or size % c or (size // c) % k:
            continue
        part, chunk = n // c, size // c
        if rows == tuple(j * chunk + rank * part + i for j in range(c) for i in range(part)):
            return "fused", c
    steps = {b - a for a, b in zip(rows, rows[1:])}
    if len(steps) == 1 and steps.pop() > 1:
        return "strided", 1
    return "other", 1


def read_misread(group: List[int], pieces: List[Any], whole: Any, dim: int) -> List[RowsHeld]:
    """For the ranks of one group (``pieces`` in its order), how each piece that is not its block lies
    in ``whole`` (where its rows are ``whole``'s): its slice index is its place in the group."""
    k, out = len(group), []
    for i, (r, piece) in enumerate(zip(group, pieces)):
        got = rows_held(piece, whole, dim, i, k) if piece is not None else None
        if got is not None and got.rows != tuple(range(i * len(got.rows), (i + 1) * len(got.rows))):
            out.append(RowsHeld(r, got.dim, got.rows, got.kind, got.chunks))
    return out
