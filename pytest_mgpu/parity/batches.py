"""Batches inside the ranks: moving, indexing, sharding and splitting the ``(inputs, targets)``
trees that ``batch_fn(step)`` returns, and the order in which a strategy adds up a global batch.

Shared by the runners (how each strategy splits the batch), the reference's companions (which
split it the same way in one process) and the user-module comparison. torch is imported lazily:
the test process imports this module without training anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Literal


def tree_to(tree, device):
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.to(device), tree)


def tree_index(tree, index):
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t[index], tree)


def to_float64(tree):
    """Floating tensors of a batch in float64; labels and other integers unchanged."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.double() if t.is_floating_point() else t, tree)


def batch_len(tree) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    raise ValueError("batch_fn(step) must return (inputs, targets) with tensors batched along dim 0")


def call_model(model, inputs):
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def shard_indices(batch: int, world_size: int, rank: int) -> List[int]:
    """This rank's samples of a global batch, exactly as DistributedSampler(shuffle=False) picks
    them: interleaved, padded by repeating the first samples when the batch is not divisible."""
    from torch.utils.data.distributed import DistributedSampler

    return list(DistributedSampler(range(batch), num_replicas=world_size, rank=rank, shuffle=False))


def split_micro(tree, n: int) -> list:
    """``n`` consecutive chunks along dim 0, sized as torch.tensor_split sizes them (the way
    torch.distributed.pipelining splits micro-batches)."""
    import torch

    if n <= 1:
        return [tree]
    parts = torch.arange(batch_len(tree)).tensor_split(n)
    return [tree_index(tree, slice(int(p[0]), int(p[-1]) + 1)) for p in parts if len(p)]


# "shards": DistributedSampler shards (DDP, FSDP); "concat": outputs of chunks concatenated, one loss
# (the seed's pipeline, DataParallel); "microbatches": one loss per micro-batch (pipelining schedules)
SumKind = Literal["shards", "concat", "microbatches"]


@dataclass(frozen=True)
class SumOrder:
    """How a strategy splits the global batch, so that a float32 twin of the reference can add the
    same partial sums in the same order in one process (see ``parity.shadow.Twin``).

    "shards": ``parts`` DistributedSampler shards, each in ``accumulate`` micro-batches, every loss
    divided by parts x accumulate before backward (DDP, FSDP); "concat": forward in chunks of
    ``chunk`` samples, outputs concatenated, one loss (the seed's pipeline, DataParallel);
    "microbatches": ``parts`` micro-batches, each loss divided by parts (pipelining schedules)."""

    kind: SumKind
    parts: int = 1
    accumulate: int = 1
    chunk: int = 0
