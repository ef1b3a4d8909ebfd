"""FSDP1 at its defaults (``use_orig_params=False``): the optimizer steps flat parameters, one per
wrapped unit, each rank holding a shard; torch cannot unshard their gradients
(``summon_full_params(with_grads=True)`` is "not supported yet" there). Read each flat parameter and
its gradient as torch lays them out instead: the rank's shard all-gathered over the unit's group
(none under NO_SHARD), the padding cut off, split into the original tensors by the unit's own record
of their names, shapes and sizes. Every rank takes this path at the same step, in the optimizer's
order, so the gathers match; where a flat parameter does not carry that record, nothing is expanded
and the caller reads it as it is.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

def is_flat(p: Any) -> bool:
    """An FSDP1 flat parameter (an ``nn.Parameter`` that torch marks as one) with its layout record."""
    return bool(getattr(p, "_is_flat_param", False)) and all(hasattr(p, a) for a in ("_fqns", "_shapes", "_numels"))


def units(roots: List[Any]) -> Dict[int, Tuple[str, Any]]:
    """id(flat parameter) -> (the unit's module path, the FSDP unit), for the FSDP1 units of ``roots``."""
    out: Dict[int, Tuple[str, Any]] = {}
    for root in roots:
        for path, m in root.named_modules():
            flat = getattr(getattr(m, "_handle", None), "flat_param", None)
            if flat is not None and type(m).__name__ == "FullyShardedDataParallel":
                out[id(flat)] = (path, m)
    return out


def _full(t, unit) -> Any:
    """The whole flat tensor from this rank's shard (a CPU copy)."""
    import torch
    import torch.distributed as tdist

    t = t.detach()
    group = getattr(unit, "process_group", None)
    world = tdist.get_world_size(group) if tdist.is_initialized() else 1
    strategy = str(getattr(unit, "sharding_strategy", ""))
    if world == 1 or strategy.endswith("NO_SHARD"):
        return t.to("cpu", copy=True)
    out = torch.empty(t.numel() * world, dtype=t.dtype, device=t.device)
    tdist.all_gather_into_tensor(out, t.contiguous(), group=group)
    return out.to("cpu")


def expand(flat: Any, unit_path: str, unit: Any, clean) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(params, grads) of one flat parameter, under the original tensors' names (``clean`` strips
    the wrappers' path parts). A gradient the rank does not hold is None."""
    whole = _full(flat, unit)
    grad = _full(flat.grad, unit) if flat.grad is not None else None
    params: Dict[str, Any] = {}
    grads: Dict[str, Any] = {}
    offset = 0
    for fqn, shape, n in zip(flat._fqns, flat._shapes, flat._numels):
        key = clean(f"{unit_path}.{fqn}" if unit_path else fqn)
        params[key] = whole[offset:offset + n].view(shape).clone()
        grads[key] = grad[offset:offset + n].view(shape).clone() if grad is not None else None
        offset += n
    return params, grads
