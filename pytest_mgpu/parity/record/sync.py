"""Whether a backward pass reduces its gradients across ranks (inside a rank): DDP's ``no_sync()``
(``require_backward_grad_sync`` off when the wrapper ran forward) or FSDP2's
``set_requires_gradient_sync(False)`` (as the loop left it when it called backward). The last backward
of a step that ran with synchronisation off leaves its gradients unreduced on every rank."""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Tuple

UNSYNCED_LAST = "last backward with gradient sync off"  # a where-kind: the step's last backward, unsynced


def fsdp2_sync(note: Callable[[bool], None]) -> List[Tuple[Any, str, Any]]:
    """The patch that notes each ``FSDPModule.set_requires_gradient_sync(requires)`` call (``note``
    gets ``requires``), where this torch has FSDP2 (imported here: a loop imports it inside itself)."""
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:
        return []
    owner = getattr(fsdp, "FSDPModule", None)
    method = getattr(owner, "set_requires_gradient_sync", None)
    if method is None:
        return []

    def observed_sync(module, requires_gradient_sync, *args, **kwargs):
        note(bool(requires_gradient_sync))
        return method(module, requires_gradient_sync, *args, **kwargs)

    return [(owner, "set_requires_gradient_sync", observed_sync)]


def ddp_sync_off(module: Any) -> bool:
    """A DistributedDataParallel run forward inside ``no_sync()``: its next backward will not reduce
    (DDP decides at the forward: ``with model.no_sync(): loss = model(x)`` then ``loss.backward()``
    outside it reduces nothing)."""
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    cls = getattr(ddp, "DistributedDataParallel", None)
    return cls is not None and isinstance(module, cls) and not module.require_backward_grad_sync
