"""``full_tensor(t)``: a DTensor's whole value on every rank, as ``DTensor.full_tensor()``; on gloo ranks
sharing a GPU (``--mgpu-fallback=share``) gathered through host memory instead.

Why: on a real H200 with gloo carrying CUDA tensors, FSDP2 trained (its own all-gathers and
reduce-scatters are plain c10d calls), but ``full_tensor()`` of its gradients, which waits on a
functional collective, killed both ranks with SIGSEGV. Gathering the local shards as objects over gloo
moves them through CPU memory, which gloo always carries. Only 1-D meshes sharded on one dimension are
gathered that way (FSDP2's placement); other layouts keep ``full_tensor()``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple


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


def full_tensors(ts: List[Any]) -> List[Any]:
    """``[full_tensor(t) for t in ts]`` with the DTensors sharded on one dimension of a 1-D mesh
    (FSDP2's parameters, tensor parallel's Colwise/Rowwise) gathered together: one all_gather of
    their sizes and one of their shards per mesh group and dtype, instead of one ``full_tensor()``
    each. Measured on a tensor-parallel block, 20 steps: its 8 gathers a step were 36% of a rank's
    recorded loop. The same values to the bit (the shards concatenated in rank order, as
    ``full_tensor()`` does); which tensors go together is decided from what every rank knows alike
    (placements, mesh, dtype), so that every rank calls the same collectives."""
    out = list(ts)
    groups: Dict[Tuple[Any, ...], List[int]] = {}
    for i, t in enumerate(ts):
        key = _batch_key(t)
        if key is None:
            out[i] = full_tensor(t)
        else:
            groups.setdefault(key, []).append(i)
    for idx in groups.values():
        if len(idx) == 1:  # alone: one collective is fewer than two
            out[idx[0]] = full_tensor(ts[idx[0]])
            continue
        for i, whole in zip(idx, _gathered([ts[i] for i in idx])):
            out[i] = whole
    return out


def _batch_key(t: Any) -> Optional[Tuple[Any, ...]]:
    """(mesh group, dtype, device) of a DTensor gathered with others; None: gathered alone."""
    if not hasattr(t, "full_tensor") or _gloo_on_cuda(t):
        return None
    from torch.distributed.tensor import Shard

    mesh = t.device_mesh
    if mesh.ndim != 1 or len(t.placements) != 1 or type(t.placements[0]) is not Shard:
        return None
    return (id(mesh.get_group()), t.dtype, t.device.type)


def _gathered(ts: List[Any]) -> List[Any]:
    """The whole tensors of DTensors sharded on one dimension of one 1-D mesh, in two collectives."""
    import torch
    import torch.distributed as tdist

    group = ts[0].device_mesh.get_group()
    world = tdist.get_world_size(group)
    local = [t.to_local().detach().reshape(-1) for t in ts]
    sizes = torch.tensor([x.numel() for x in local], dtype=torch.int64, device=local[0].device)
    all_sizes = torch.empty(world * len(ts), dtype=torch.int64, device=sizes.device)
    tdist.all_gather_into_tensor(all_sizes, sizes, group=group)
    per_rank = all_sizes.view(world, len(ts)).tolist()
    width = max(sum(row) for row in per_rank)
    flat = torch.zeros(width, dtype=local[0].dtype, device=local[0].device)
    mine = torch.cat(local)
    flat[:mine.numel()] = mine
    everything = torch.empty(world * width, dtype=flat.dtype, device=flat.device)
    tdist.all_gather_into_tensor(everything, flat, group=group)
    rows = everything.view(world, width)
    out = []
    for i, t in enumerate(ts):
        dim = t.placements[0].dim
        rest = t.shape[:dim] + t.shape[dim + 1:]
        inner = 1
        for d in rest:
            inner *= d
        pieces = []
        for r in range(world):
            start = sum(per_rank[r][:i])
            n = per_rank[r][i]
            shape = list(t.shape)
            shape[dim] = n // inner if inner else 0
            pieces.append(rows[r, start:start + n].view(shape))
        out.append(torch.cat(pieces, dim=dim))
    return out


def _gloo_on_cuda(t: Any) -> bool:
    import torch.distributed as tdist

    if t.device.type != "cuda":
        return False
    try:
        return tdist.get_backend(t.device_mesh.get_group()) == "gloo"
    except (RuntimeError, ValueError):
        return False
