"""What a rank holds on its device mesh (inside ranks): the ranks that share its batch.

Data-parallel replicas (DDP, FSDP's shard dimension, HSDP, the dp dimension of a 2-D mesh) each
train on their own rows and hold their own loss; tensor- and sequence-parallel peers (the other
dimensions of a DTensor parameter's mesh) split one batch's computation between them. Which
dimensions are FSDP's is read from FSDP2's parameter groups: FSDP2 lays its dimensions first in
the placements of a parameter it shards over a tensor-parallel one.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Set


def tp_peers(models: Iterable[Any]) -> List[int]:
    """The global ranks (this one included) that share this rank's batch along the tensor/sequence
    parallel dimensions of its DTensor parameters; [] where it has none (a data-parallel replica)."""
    fsdp = _fsdp_dims(models)
    peers: Set[int] = set()
    for model in models:
        for p in model.parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is None or not hasattr(p, "placements"):
                continue
            tp = [d for d in range(mesh.ndim) if d >= fsdp.get(id(p), 0)]
            if tp:
                peers |= _along(mesh, tp)
    return sorted(peers)


def _along(mesh, dims: List[int]) -> Set[int]:
    """The ranks of ``mesh`` that share this rank's coordinates on every dimension not in ``dims``."""
    coord = mesh.get_coordinate()
    if coord is None:
        return set()
    index = tuple(slice(None) if d in dims else c for d, c in enumerate(coord))
    return {int(r) for r in mesh.mesh[index].flatten().tolist()}


def _fsdp_dims(models: Iterable[Any]) -> Dict[int, int]:
    """id(parameter) -> how many leading mesh dimensions FSDP2 shards or replicates it over."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return {}
    out: Dict[int, int] = {}
    for model in models:
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
            for fp in getattr(group, "fsdp_params", ()):
                info = getattr(fp, "mesh_info", None)
                ndim = info.mesh.ndim if info is not None else fp.sharded_param.device_mesh.ndim
                out[id(fp.sharded_param)] = ndim
    return out
