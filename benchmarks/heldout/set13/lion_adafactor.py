"""Two optimizers written in the training file, under DDP: Adafactor (factored second moments for the
square trunk matrices, an unfactored one for vectors, update-RMS clipping, no first moment, relative step
off, scale_parameter off) on the trunk, Lion (sign of the beta1 interpolation, decoupled weight decay,
momentum updated with beta2 afterwards) on the head. The lr of both is set per iteration: a linear
warm-up ``base * (it + 1) / WARM`` then constant. Loss: cross entropy, mean over the rank's rows (DDP's
average is the global mean). Each rank keeps its block of every global batch.

The one-device reference: the same two optimizers on the global batch.

Follows lucidrains/lion-pytorch ``lion_pytorch/lion_pytorch.py`` (``update_fn``: ``p.data.mul_(1 - lr *
wd)``; ``update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()``; ``p.add_(update,
alpha=-lr)``; ``exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)``) and huggingface/transformers
``src/transformers/optimization.py`` ``Adafactor.step`` (``beta2t = 1 - step ** decay_rate``;
``exp_avg_sq_row`` from ``update.mean(dim=-1)``, ``exp_avg_sq_col`` from ``update.mean(dim=-2)``;
``_approx_sq_grad``; ``update.div_((_rms(update) / clip_threshold).clamp_(min=1.0))``; weight decay
``p.add_(p, alpha=-wd * lr)`` before ``p.add_(-update)``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

D, C, GB, SEED = 8, 4, 8, 61
AF_LR, LION_LR, WARM, ITERS = 0.05, 0.01, 3, 5
STEPS = 2 * ITERS
CORRECT = {"default": (2, 4)}
BUGS = {
    "af_row_col_swapped": "Adafactor's factored statistics swapped: the row statistic from the column means (dim=-2) and the column one from the row means",
    "warmup_from_zero": "the warm-up factor is it / WARM (counted from 0), so the first step has lr 0 and every warm-up lr is one step late",
    "lion_wrong_interp": "Lion's update is the sign of the beta2 interpolation (the momentum updated before the update is taken) instead of beta1's",
    "lion_lr_world": "Lion's lr is multiplied by the world size (linear scaling on an already global batch)",
    "af_no_rms_clip": "Adafactor's update is not divided by max(1, RMS(update) / clip_threshold): the update clipping dropped",
    "head_no_zero_grad": "only the Adafactor optimizer's zero_grad is called: the head's gradients accumulate across iterations",
}


class Adafactor(torch.optim.Optimizer):
    """HF Adafactor with relative_step=False, scale_parameter=False, beta1=None."""

    def __init__(self, params, lr, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, weight_decay=0.0, bug=None):
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate,
                                      weight_decay=weight_decay))
        self.bug = bug

    @staticmethod
    def _rms(t):
        return t.norm(2) / (t.numel() ** 0.5)

    @staticmethod
    def _approx_sq_grad(row, col):
        r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        c_factor = col.unsqueeze(-2).rsqrt()
        return torch.mul(r_factor, c_factor)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                factored = grad.dim() >= 2
                if not state:
                    state["step"] = 0
                    if factored:
                        state["row"] = torch.zeros(grad.shape[:-1])
                        state["col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:])
                    else:
                        state["sq"] = torch.zeros_like(grad)
                state["step"] += 1
                lr = group["lr"]
                beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
                update = grad ** 2 + group["eps"][0]
                if factored:
                    rdim, cdim = (-2, -1) if self.bug == "af_row_col_swapped" else (-1, -2)
                    state["row"].mul_(beta2t).add_(update.mean(dim=rdim), alpha=1.0 - beta2t)
                    state["col"].mul_(beta2t).add_(update.mean(dim=cdim), alpha=1.0 - beta2t)
                    update = self._approx_sq_grad(state["row"], state["col"]).mul_(grad)
                else:
                    state["sq"].mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                    update = state["sq"].rsqrt().mul_(grad)
                if self.bug != "af_no_rms_clip":
                    update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))
                update.mul_(lr)
                if group["weight_decay"] != 0:
                    p.add_(p, alpha=-group["weight_decay"] * lr)
                p.add_(-update)


class Lion(torch.optim.Optimizer):
    """lucidrains' Lion."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, bug=None):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self.bug = bug

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, (b1, b2) = group["lr"], group["weight_decay"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.data.mul_(1 - lr * wd)
                if self.bug == "lion_wrong_interp":
                    exp_avg.mul_(b2).add_(grad, alpha=1 - b2)
                    p.add_(exp_avg.sign(), alpha=-lr)
                    continue
                update = exp_avg.clone().mul_(b1).add(grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(b2).add_(grad, alpha=1 - b2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.trunk = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, D), nn.GELU())
        self.head = nn.Linear(D, C)

    def forward(self, x):
        return self.head(self.trunk(x))


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, D, generator=g)
    y = (x[:, :C] + 0.5 * torch.randn(GB, C, generator=g)).argmax(1)
    return x, y


def run(trunk_params, head_params, fwd, rows, bug=None, lion_scale=1) -> None:
    af = Adafactor(trunk_params, lr=AF_LR, weight_decay=0.01, bug=bug)
    lion = Lion(head_params, lr=LION_LR * lion_scale, betas=(0.9, 0.99), weight_decay=0.1, bug=bug)
    for it in range(ITERS):
        warm = min(1.0, (it if bug == "warmup_from_zero" else it + 1) / WARM)
        for opt, base in ((af, AF_LR), (lion, LION_LR * lion_scale)):
            for g in opt.param_groups:
                g["lr"] = base * warm
        x, y = batch(it)
        x, y = rows(x), rows(y)
        F.cross_entropy(fwd(x), y).backward()
        af.step()
        lion.step()
        af.zero_grad()
        if bug != "head_no_zero_grad":
            lion.zero_grad()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, its block of rows."""
    r, lb = rank(), GB // world_size
    model = Net()
    run(model.trunk.parameters(), model.head.parameters(), DDP(model), lambda t: t[r * lb:(r + 1) * lb], bug,
        world_size if bug == "lion_lr_world" else 1)


def reference(world_size: int) -> None:
    """One device: both optimizers on the global batch."""
    model = Net()
    run(model.trunk.parameters(), model.head.parameters(), model, lambda t: t)
