"""Patches that observe the loop's calls into torch beside the watch's hooks (``watch.Watch.installed``
puts them in place and back): FSDP1's own ``clip_grad_norm_`` method, and ``scheduler.step()`` of every
torch scheduler, each noting what the step under way did and where."""
from __future__ import annotations

import sys
from typing import Any, List, Tuple


def fsdp1_clip(watch: Any) -> List[Tuple[Any, str, Any]]:
    """The patch that observes FSDP1's own ``clip_grad_norm_`` method (it reduces the norm over its
    shards), where FSDP1 is imported; none otherwise."""
    fsdp1 = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp1 is None:
        return []
    method = fsdp1.FullyShardedDataParallel.clip_grad_norm_

    def observed_fsdp1_clip(module, max_norm, *args, **kwargs):
        before = len(watch.clips_seen())
        total = method(module, max_norm, *args, **kwargs)
        if len(watch.clips_seen()) == before:  # NO_SHARD calls torch.nn.utils.clip_grad_norm_ itself
            watch.saw_clip(total, max_norm)
        return total
    return [(fsdp1.FullyShardedDataParallel, "clip_grad_norm_", observed_fsdp1_clip)]


def scheduler_steps(watch: Any) -> List[Tuple[Any, str, Any]]:
    """The patches that note where ``scheduler.step()`` is called: ``LRScheduler.step`` and every
    scheduler class of torch's that defines its own (``ReduceLROnPlateau``, ``SequentialLR``, ...).
    The call a constructor makes (its initial step) is not the loop's."""
    import inspect

    from torch.optim import lr_scheduler

    def observing(method):
        def observed_step(scheduler, *args, **kwargs):
            if sys._getframe(1).f_code.co_name not in ("_initial_step", "__init__"):
                plateau = isinstance(scheduler, lr_scheduler.ReduceLROnPlateau)  # others' argument is an epoch
                watch.saw_schedule((args[0] if args else kwargs.get("metrics")) if plateau else None,
                                   settings(scheduler) if plateau else "")
            return method(scheduler, *args, **kwargs)
        return observed_step

    classes = [c for c in vars(lr_scheduler).values() if inspect.isclass(c) and issubclass(c, lr_scheduler.LRScheduler)
               and "step" in vars(c)]
    return [(c, "step", observing(vars(c)["step"])) for c in classes]


def settings(plateau: Any) -> str:
    """A ReduceLROnPlateau's settings as words ("mode='min', factor=0.5, ..."; the evidence compares them)."""
    names = ("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown")
    return ", ".join(f"{n}={getattr(plateau, n, None)!r}" for n in names)
