"""Fingerprints of the input rows a step saw (inside ranks): one float64 per row, the row's dot product
with a fixed vector, so that the test process can tell from numbers alone whether the ranks' rows
together are the reference's batch (``watch.py`` says why)."""
from __future__ import annotations

import functools
from typing import Dict, List


def fingerprint(x) -> List[float]:
    """One number per row of ``x`` (its first dimension): the row's dot product with a fixed vector
    whose entries are all different, so that two rows collide only if they are equal in practice."""
    import torch

    if x.dim() == 0 or x.shape[0] == 0:
        return []
    flat = x.detach().reshape(x.shape[0], -1).to("cpu", torch.float64)
    return (flat @ weights(flat.shape[1])).tolist()


SPLITS = (2, 4, 8)  # the sequence splits a row's parts are fingerprinted for (context-parallel ranks)


def chunk_prints(x) -> Dict[int, List[float]]:
    """k -> the fingerprints of each row's k equal contiguous parts, row by row (row 0's parts first):
    a rank fed part r of every row (the sequence split of context parallelism) feeds rows whose
    fingerprints are the reference's parts, since a fingerprint's vector depends on the length alone."""
    import torch

    if x.dim() < 2 or x.shape[0] == 0:
        return {}
    flat = x.detach().reshape(x.shape[0], -1).to("cpu", torch.float64)
    n = flat.shape[1]
    return {k: (flat.reshape(-1, n // k) @ weights(n // k)).tolist() for k in SPLITS if n % k == 0 and n >= k}


@functools.lru_cache(maxsize=64)
def weights(n: int):
    """A fixed float64 vector of ``n`` distinct entries: a fingerprint is a dot product with it."""
    import torch

    return torch.cos(torch.arange(n, dtype=torch.float64) * 0.7071 + 0.3) + 1.5
