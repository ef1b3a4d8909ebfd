"""What a collective is called, and how many bytes it makes this rank send.

Names: the ``torch.distributed`` function a user knows (``all_gather_into_tensor``), for the raw c10d
op FSDP2 issues (``c10d._allgather_base_``) and the functional op DTensor issues
(``_c10d_functional.all_gather_into_tensor``) alike, so a plan reads the same whichever layer sent it.
The ops are those ``CommDebugMode`` counts, plus point-to-point and barriers.

Bytes: what this rank puts on the wire under the bandwidth-optimal ring algorithm, the convention of
nccl-tests' "bus bandwidth" (NCCL runs rings for large messages): an all-gather of an ``s``-byte shard
in a group of ``n`` sends ``(n-1) s``; a reduce-scatter or all-to-all of an ``S``-byte input
``(n-1)/n S``; an all-reduce ``2 (n-1)/n S``; broadcast, reduce and send the whole buffer; receive
and barrier nothing. The figures depend only on shapes and group sizes, so a simulated rank's are
exact, though the fake process group moves nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional, Sequence, Tuple

Kind = Literal["gather", "scatter", "all_reduce", "whole", "none"]


@dataclass(frozen=True)
class Wire:
    """One collective op: its public name, how it sends, and where its arguments are."""

    name: str
    kind: Kind
    tensors_at: int  # the argument holding this rank's input tensor(s)
    group_at: int  # the process group (c10d ops) or its name (functional ops)
    size_at: Optional[int] = None  # an explicit group size (functional gather and scatter)


# (namespace, op) -> Wire. Ops a torch build lacks are skipped.
_C10D = {
    "_allgather_base_": Wire("all_gather_into_tensor", "gather", 1, 2),
    "allgather_": Wire("all_gather", "gather", 1, 2),
    "allgather_coalesced_": Wire("all_gather_coalesced", "gather", 1, 2),
    "allgather_into_tensor_coalesced_": Wire("all_gather_into_tensor_coalesced", "gather", 1, 2),
    "_reduce_scatter_base_": Wire("reduce_scatter_tensor", "scatter", 1, 2),
    "reduce_scatter_": Wire("reduce_scatter", "scatter", 1, 2),
    "reduce_scatter_tensor_coalesced_": Wire("reduce_scatter_tensor_coalesced", "scatter", 1, 2),
    "allreduce_": Wire("all_reduce", "all_reduce", 0, 1),
    "allreduce_coalesced_": Wire("all_reduce_coalesced", "all_reduce", 0, 1),
    "alltoall_base_": Wire("all_to_all_single", "scatter", 1, 2),
    "alltoall_": Wire("all_to_all", "scatter", 1, 2),
    "broadcast_": Wire("broadcast", "whole", 0, 1),
    "reduce_": Wire("reduce", "whole", 0, 1),
    "gather_": Wire("gather", "whole", 1, 2),
    "scatter_": Wire("scatter", "scatter", 1, 2),
    "send": Wire("send", "whole", 0, 1),
    "recv_": Wire("recv", "none", 0, 1),
    "recv_any_source_": Wire("recv", "none", 0, 1),
    "barrier": Wire("barrier", "none", 0, 1),
    "monitored_barrier_": Wire("monitored_barrier", "none", 0, 1),
}
_FUNCTIONAL = {
    "all_gather_into_tensor": Wire("all_gather_into_tensor", "gather", 0, 2, size_at=1),
    "all_gather_into_tensor_coalesced": Wire("all_gather_into_tensor_coalesced", "gather", 0, 2, size_at=1),
    "reduce_scatter_tensor": Wire("reduce_scatter_tensor", "scatter", 0, 3, size_at=2),
    "reduce_scatter_tensor_coalesced": Wire("reduce_scatter_tensor_coalesced", "scatter", 0, 3, size_at=2),
    "all_reduce": Wire("all_reduce", "all_reduce", 0, 2),
    "all_reduce_coalesced": Wire("all_reduce_coalesced", "all_reduce", 0, 2),
    "all_to_all_single": Wire("all_to_all_single", "scatter", 0, 3),
    "broadcast": Wire("broadcast", "whole", 0, 2),
}
_TABLE: Tuple[Tuple[str, Dict[str, Wire]], ...] = (
    ("c10d", _C10D),
    ("_c10d_functional", _FUNCTIONAL),  # native functional collectives (DTensor, tensor parallel)
    ("c10d_functional", _FUNCTIONAL),  # their legacy Python names
    ("_dtensor", {"shard_dim_alltoall": Wire("all_to_all_single", "scatter", 0, 3)}),
)
_BY_PACKET: Optional[Dict[Any, Wire]] = None


def collective_ops() -> Dict[Any, Wire]:
    """``{op overload packet: Wire}`` for the collectives this torch has (built once)."""
    global _BY_PACKET
    if _BY_PACKET is None:
        import torch

        found = {}
        for namespace, ops in _TABLE:
            for op, wire in ops.items():
                try:
                    found[getattr(getattr(torch.ops, namespace), op)] = wire
                except (AttributeError, RuntimeError):
                    pass
        _BY_PACKET = found
    return _BY_PACKET


def public_name(op_name: str) -> str:
    """The public name of a collective op given as text (``c10d._allgather_base_``, or a
    ``CommDebugMode`` key such as ``c10d_functional.all_reduce``); the text itself if unknown."""
    namespace, _, op = str(op_name).rpartition(".")
    for ns, ops in _TABLE:
        if ns == namespace and op in ops:
            return ops[op].name
    return str(op_name)


def _tensors(obj) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _group_size(group) -> int:
    """The size of a process group, given as the group (boxed, in c10d ops) or its name (functional
    ops); the world size where it cannot be read."""
    import torch
    import torch.distributed as tdist

    if isinstance(group, torch.ScriptObject):  # a raw c10d op carries its group boxed
        try:
            group = tdist.ProcessGroup.unbox(group)
        except Exception:  # noqa: BLE001 - not a process group (a ReduceOp, a Work): the fallback below
            pass
    size = getattr(group, "size", None)
    if callable(size):
        return int(size())
    try:  # a group name: the registry is private to torch.distributed, hence the fallback
        from torch.distributed.distributed_c10d import _resolve_process_group

        return int(_resolve_process_group(group).size())
    except Exception:
        return tdist.get_world_size()


def sent_bytes(wire: Wire, args: Sequence[Any]) -> int:
    """The bytes this rank sends for one call of ``wire`` with ``args`` (ring convention, above)."""
    if wire.kind == "none":
        return 0
    tensors = _tensors(args[wire.tensors_at]) if len(args) > wire.tensors_at else []
    size = sum(t.numel() * t.element_size() for t in tensors)
    if wire.size_at is not None and len(args) > wire.size_at:
        n = int(args[wire.size_at])
    else:
        n = _group_size(args[wire.group_at]) if len(args) > wire.group_at else 1
    if n <= 1:  # a group of one sends nothing, whatever the op
        return 0
    if wire.kind == "whole":
        return size
    if wire.kind == "gather":
        return (n - 1) * size
    if wire.kind == "scatter":
        return (n - 1) * size // n
    return 2 * (n - 1) * size // n
