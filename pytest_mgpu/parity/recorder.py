"""The ``log(model, loss)`` that the user's own training loops call once per step (inside ranks).

It records the loss, every gradient and every parameter under the model's own names: wrappers
are looked through (DDP and DataParallel's ``module``, torch.compile's ``_orig_mod``, FSDP1's
``_fsdp_wrapped_module``, activation checkpointing's ``_checkpoint_wrapped_module``) and sharded
tensors (DTensor, FSDP) are gathered to full ones, so that a DDP replica, an FSDP shard and a plain
one-device model all report ``fc1.weight``. Gathering is a collective: every rank logs the same
steps anyway, so they meet there.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

# Path components that only wrappers add: dropped from every name.
WRAPPER_PARTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module"})


@dataclass
class StepLog:
    """One ``log(model, loss)`` call: CPU copies, after backward and before the optimizer step."""

    loss: float
    grads: Dict[str, object]  # name -> tensor, or None where the parameter got no gradient
    params: Dict[str, object]


@dataclass
class SideLog:
    """Everything one side (one rank, or the reference) logged, and what its model contains."""

    steps: List[StepLog] = field(default_factory=list)
    batchnorm: List[str] = field(default_factory=list)  # BatchNorm modules in training mode (not Sync)
    dropout: List[str] = field(default_factory=list)  # active dropout modules


def clean_name(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in WRAPPER_PARTS)


def unwrap(model):
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _full(t):
    """A CPU copy of the whole tensor: DTensors (FSDP2, tensor parallel) are gathered first."""
    if t is None:
        return None
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().to("cpu", copy=True)


def _fsdp1_full_params(model):
    """FSDP1 keeps flat shards: unshard them (with gradients) while we read. Looked up only if the
    user imported FSDP, so that plain loops do not pay for importing it."""
    if "torch.distributed.fsdp" not in sys.modules:
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not any(isinstance(m, FSDP) for m in model.modules()):
        return contextlib.nullcontext()
    return FSDP.summon_full_params(model, with_grads=True, writeback=False)


class Recorder:
    """The ``log`` callable: ``log(model, loss)`` once per step."""

    def __init__(self):
        self.side = SideLog()

    def __call__(self, model, loss) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"log(model, loss): model must be an nn.Module, got {type(model).__name__}")
        loss_t = torch.as_tensor(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if loss_t.numel() != 1:
            raise ValueError(f"log(model, loss): loss must be a scalar, got shape {tuple(loss_t.shape)}")
        with _fsdp1_full_params(model):
            named = [(clean_name(n), p) for n, p in unwrap(model).named_parameters()]
            grads = {n: _full(p.grad) for n, p in named}
            params = {n: _full(p) for n, p in named}
        if not self.side.steps:
            self._describe(unwrap(model))
        self.side.steps.append(StepLog(float(loss_t.reshape(()).double().item()), grads, params))

    def _describe(self, model) -> None:
        import torch
        from torch.nn.modules.batchnorm import _BatchNorm
        from torch.nn.modules.dropout import _DropoutNd

        for name, m in model.named_modules():
            if isinstance(m, _BatchNorm) and m.training and not isinstance(m, torch.nn.SyncBatchNorm):
                self.side.batchnorm.append(clean_name(name))
            if isinstance(m, _DropoutNd) and m.training and m.p > 0:
                self.side.dropout.append(clean_name(name))


def record(fn, args: tuple, kwargs: dict, steps: int) -> SideLog:
    """Run ``fn(log, *args, steps=steps, **kwargs)`` and return what it logged."""
    log = Recorder()
    fn(log, *args, steps=steps, **kwargs)
    return log.side


def _float32_draws():
    """A dispatch mode under which every random op draws as it would in float32, then widens.

    A float64 tensor draws other numbers than a float32 one from the same seed (``uniform_`` takes
    53 random bits instead of 24: measured, ``nn.Linear(20, 32)`` built under both dtypes after
    ``manual_seed(0)`` differs by 0.42 in its weights), so a loop re-run in float64 would build
    another network on other data, and its distance to the float32 run would be O(1), not roundoff.
    Under this mode the float64 run starts from the float32 run's weights and data, exactly."""
    import torch
    from torch.utils._pytree import tree_leaves, tree_map
    from torch.utils._python_dispatch import TorchDispatchMode

    def narrow(t):
        return t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t

    def widen(t):
        return t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

    class Float32Draws(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = tree_leaves((args, kwargs))
            tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
            wide = any(t.dtype == torch.float64 for t in tensors)
            factory = not tensors and "dtype" not in kwargs  # the default dtype (float64 here) applies
            if torch.Tag.nondeterministic_seeded not in func.tags or not (wide or factory):
                return func(*args, **kwargs)
            n_args, n_kwargs = tree_map(narrow, (args, kwargs))
            saved = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32)
            try:
                out = func(*n_args, **n_kwargs)
            finally:
                torch.set_default_dtype(saved)
            if func._schema.name.endswith("_"):  # in place (uniform_, normal_, bernoulli_): write back
                return args[0].copy_(n_args[0])
            return tree_map(widen, out)

    return Float32Draws()


def record_shadow(fn, args: tuple, kwargs: dict, steps: int, seed: int) -> Optional[SideLog]:
    """The same loop again in float64 (default dtype), from the same seed and the same random draws
    (``_float32_draws``): the model's own float32 roundoff is the distance between the two. None
    where the loop cannot run in float64 (data created with an explicit float32 dtype, a
    float32-only op)."""
    import torch

    from ..launch.rank import seed_everything

    saved = torch.get_default_dtype()
    seed_everything(seed)
    torch.set_default_dtype(torch.float64)
    try:
        with _float32_draws():
            side = record(fn, args, kwargs, steps)
    except Exception:
        return None
    finally:
        torch.set_default_dtype(saved)
    wide = all(t.dtype == torch.float64 for s in side.steps[:1] for t in s.params.values())
    return side if wide and side.steps else None
