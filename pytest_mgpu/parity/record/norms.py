"""How many rows a side's BatchNorm layers in training mode normalise over: the most rows any one call
of such a layer took. A reference that runs its BatchNorm layers on blocks of a rank's size (shuffled
or ghost BatchNorm, as MoCo's key encoder) normalises as data-parallel ranks without SyncBatchNorm do,
so their statistics are no cause there (``evidence/conditions.py``)."""
from __future__ import annotations

import contextlib
from typing import Iterator


class BatchNormRows:
    """``most``: the largest first dimension any training-mode, non-synchronised BatchNorm call took."""

    def __init__(self) -> None:
        self.most = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator["BatchNormRows"]:
        import torch
        from torch.nn.modules import module as M
        from torch.nn.modules.batchnorm import _BatchNorm

        def pre(module, args):
            if isinstance(module, _BatchNorm) and module.training and not isinstance(module, torch.nn.SyncBatchNorm) \
                    and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 1 \
                    and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active():
                self.most = max(self.most, int(args[0].shape[0]))

        handle = M.register_module_forward_pre_hook(pre)
        try:
            yield self
        finally:
            handle.remove()
