"""A bfloat16 model trained with fp32 main gradients and fp32 master weights, by hand, in the manner of
Megatron-LM: every parameter carries a ``main_grad`` fp32 buffer that a post-accumulate-grad hook adds
each micro-batch's bfloat16 gradient into (the ``.grad`` is then dropped); the loss of each of ``MICRO``
micro-batches is divided by ``MICRO``; after the last micro-batch the ``main_grad`` buffers are divided
by W and all-reduced (Megatron's own DDP wrapper); the mixed-precision optimizer, a
``torch.optim.Optimizer`` over the model's bfloat16 parameters, hands ``main_grad`` to its fp32 master
copies, clips them by their global norm, takes an SGD-with-momentum step on the masters and copies
the masters back into the bfloat16 parameters; ``zero_grad`` zeroes the ``main_grad`` buffers.

The one-device reference runs each rank's micro-batches through the same bfloat16 model (same shapes),
keeps each rank's accumulated fp32 gradient apart, and averages the ranks' sums in rank order.

Follows NVIDIA/Megatron-LM ``megatron/core/optimizer/optimizer.py`` (``Float16OptimizerWithFloat16Params``:
``fp32_from_float16_groups``, ``_copy_model_grads_to_main_grads`` from ``param.main_grad``,
``clip_grad_norm``, ``_copy_main_params_to_model_params``; ``MixedPrecisionOptimizer.step``),
``megatron/core/distributed/distributed_data_parallel.py`` and ``param_and_grad_buffer.py``
(``_make_backward_post_hook``: ``param.main_grad.add_(param.grad.data)``, ``param.grad = None``;
``gradient_scaling_factor = 1 / data_parallel_size``; ``zero_grad_buffer``) and ``pipeline_parallel/
schedules.py`` (``output_tensor /= num_microbatches``).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank, world

DIN, HID, C, MB, MICRO, SEED = 8, 16, 4, 2, 2, 29
LR, MOMENTUM, CLIP = 0.1, 0.9, 1.0
STEPS = 6
CORRECT = {"default": (2,)}
BUGS = {
    "main_grad_not_zeroed": "zero_grad clears param.grad but not the fp32 main_grad buffers (gradients accumulate across steps)",
    "params_not_copied_back": "the fp32 masters are stepped but never copied back into the bfloat16 model parameters",
    "no_microbatch_scale": "the micro-batch losses are not divided by the number of micro-batches",
    "grad_allreduce_missing": "the main_grad buffers are not all-reduced over the data-parallel ranks",
    "clip_before_allreduce": "the gradients are clipped by the rank's local norm before the data-parallel all-reduce",
    "main_grad_overwritten": "the grad hook copies each micro-batch's gradient into main_grad instead of adding it",
}


def add_main_grad_hooks(model: nn.Module, bug=None) -> None:
    """``param.main_grad`` (fp32) and the hook that accumulates each backward's gradient into it."""
    def hook(p):
        if bug == "main_grad_overwritten":
            p.main_grad.copy_(p.grad.float())
        else:
            p.main_grad.add_(p.grad.float())
        p.grad = None

    for p in model.parameters():
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
        p.register_post_accumulate_grad_hook(hook)


def clip_(grads, max_norm: float) -> None:
    norm = torch.sqrt(sum((g * g).sum() for g in grads))
    coef = min(1.0, max_norm / (norm.item() + 1e-6))
    for g in grads:
        g.mul_(coef)


class MixedPrecisionSGD(torch.optim.Optimizer):
    """fp32 masters of the bfloat16 ``params``, stepped from their ``main_grad`` and copied back."""

    def __init__(self, params, bug=None) -> None:
        super().__init__(list(params), {"lr": LR})
        self.bug = bug
        self.model_params = self.param_groups[0]["params"]
        self.masters = [p.detach().float().clone() for p in self.model_params]
        self.moms = [torch.zeros_like(m) for m in self.masters]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params:
            p.grad = None
            if self.bug != "main_grad_not_zeroed":
                p.main_grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.main_grad.clone() for p in self.model_params]
        if self.bug != "clip_before_allreduce":
            clip_(grads, CLIP)
        for m, g, v, p in zip(self.masters, grads, self.moms, self.model_params):
            v.mul_(MOMENTUM).add_(g)
            m.sub_(LR * v)
            if self.bug != "params_not_copied_back":
                p.copy_(m.to(p.dtype))
        return None


def build(bug=None):
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(DIN, HID), nn.Tanh(), nn.Linear(HID, C)).to(torch.bfloat16)
    add_main_grad_hooks(model, bug)
    return model, MixedPrecisionSGD(model.parameters(), bug)


def batch(step: int, w: int):
    """The global batch of ``step``: W ranks x MICRO micro-batches x MB rows, rank-major."""
    g = gen(SEED + step)
    x = torch.randn(w, MICRO, MB, DIN, generator=g) * 2
    y = (x[..., :C] + torch.randn(w, MICRO, MB, C, generator=g)).argmax(-1)
    return x.to(torch.bfloat16), y


def micro_loss(model, x, y, bug=None) -> torch.Tensor:
    loss = F.cross_entropy(model(x).float(), y)
    return loss if bug == "no_microbatch_scale" else loss / MICRO


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: MICRO micro-batches into main_grad, the data-parallel average, the master step."""
    r, w = rank(), world_size
    model, opt = build(bug)
    for step in range(STEPS):
        x, y = batch(step, w)
        opt.zero_grad()
        for m in range(MICRO):
            micro_loss(model, x[r, m], y[r, m], bug).backward()
        if bug == "clip_before_allreduce":
            clip_([p.main_grad for p in model.parameters()], CLIP)
        for p in model.parameters():
            p.main_grad.div_(w)
            if bug != "grad_allreduce_missing" and world() > 1:
                tdist.all_reduce(p.main_grad)
        opt.step()


def reference(world_size: int) -> None:
    """One device: each rank's micro-batches accumulated apart, the ranks' sums averaged in rank order."""
    w = world_size
    model, opt = build()
    params = list(model.parameters())
    for step in range(STEPS):
        x, y = batch(step, w)
        sums = []
        for r in range(w):
            opt.zero_grad()
            for m in range(MICRO):
                micro_loss(model, x[r, m], y[r, m]).backward()
            sums.append([p.main_grad / w for p in params])
        for i, p in enumerate(params):
            total = sums[0][i]
            for r in range(1, w):
                total = total + sums[r][i]
            p.main_grad.copy_(total)
        opt.step()
