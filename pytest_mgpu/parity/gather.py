"""``full_tensor(t)``: a DTensor's whole value on every rank, as ``DTensor.full_tensor()``; on gloo ranks
sharing a GPU (``--mgpu-fallback=share``) gathered through host memory instead.

Why: on a real H200 with gloo carrying CUDA tensors, FSDP2 trained (its own all-gathers and
reduce-scatters are plain c10d calls), but ``full_tensor()`` of its gradients, which waits on a
functional collective, killed both ranks with SIGSEGV. Gathering the local shards as objects over gloo
moves them through CPU memory, which gloo always carries. Only 1-D meshes sharded on one dimension are
gathered that way (FSDP2's placement); other layouts keep ``full_tensor()``.
"""
from __future__ import annotations

from typing import Any


def full_tensor(t: Any) -> Any:
    """The whole tensor of DTensor ``t`` (collective over its mesh); any other value as it is."""
    if not hasattr(t, "full_tensor"):
        return t
    if not _gloo_on_cuda(t):
        return t.full_tensor()
    import torch
    import torch.distributed as tdist

    placements = tuple(t.placements)
    if all(p.is_replicate() for p in placements):
        return t.to_local()
    if len(placements) != 1 or not placements[0].is_shard():
        return t.full_tensor()
    group = t.device_mesh.get_group()
    parts: list = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(parts, t.to_local().detach().cpu(), group=group)
    return torch.cat(parts, dim=placements[0].dim).to(t.device)


def _gloo_on_cuda(t: Any) -> bool:
    import torch.distributed as tdist

    if t.device.type != "cuda":
        return False
    try:
        return tdist.get_backend(t.device_mesh.get_group()) == "gloo"
    except (RuntimeError, ValueError):
        return False
