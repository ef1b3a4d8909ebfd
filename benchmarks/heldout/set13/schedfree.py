"""Schedule-free AdamW (the reference implementation, written in the file) under DDP. The optimizer keeps
z (the SGD-like sequence), x (the weighted average, the weights to evaluate) and y (the interpolation the
gradient is taken at); ``optimizer.train()`` puts y into the parameters, ``optimizer.eval()`` puts x.
Warm-up is inside the optimizer (``lr * (k + 1) / warmup_steps``), with Adam's bias correction folded
into the lr and the average weighted by ``lr_max ** 2``. Every ``EVAL_EVERY`` steps the loop evaluates:
``optimizer.eval()``, ``model.eval()``, the validation loss under ``no_grad`` (summed and all-reduced),
then ``model.train()`` and ``optimizer.train()``. Loss: MSE, mean over the rank's rows (DDP's average is
the global mean). Each rank keeps its block of every global batch.

The one-device reference: the same loop on the global batch.

Follows facebookresearch/schedule_free ``schedulefree/adamw_schedulefree_reference.py``
(``AdamWScheduleFreeReference``: ``eval()`` copies ``state['x']`` into ``p``, ``train()`` copies
``state['y']``; ``step``: ``sched = (k + 1) / warmup_steps`` while ``k < warmup_steps``, ``lr = lr * sched *
math.sqrt(1 - beta2 ** (k + 1))``, ``lr_max = max(lr, lr_max)``, ``weight = lr_max ** weight_lr_power``,
``ckp1 = weight / weight_sum``; ``z.addcdiv_(grad, denom, value=-lr)``; ``x.lerp_(z, ckp1)``;
``y = x * beta1 + z * (1 - beta1)``) and its README (call ``optimizer.train()`` / ``optimizer.eval()`` with
``model.train()`` / ``model.eval()``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

DIN, DOUT, GB, SEED = 6, 2, 8, 71
LR, WARMUP, EVAL_EVERY = 0.1, 3, 2
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "train_not_restored": "after the evaluation optimizer.train() is not called: the next gradient is taken at x instead of y",
    "warmup_off_by_one": "the warm-up factor is k / warmup_steps (k from 0): the first step has lr 0 and the warm-up runs one step late",
    "no_bias_correction": "the lr is not multiplied by sqrt(1 - beta2 ** (k + 1)) (Adam's bias correction dropped)",
    "y_interp_flipped": "y is built as z * beta1 + x * (1 - beta1): the interpolation weights swapped",
    "uniform_average": "x is averaged with ckp1 = 1 / (k + 1), ignoring the lr_max ** 2 weights of the warm-up steps",
    "lr_world_scaled": "the optimizer's lr is multiplied by the world size (linear scaling on an already global batch)",
}


class AdamWScheduleFreeReference(torch.optim.Optimizer):
    """The reference schedule-free AdamW (decay at y)."""

    def __init__(self, params, lr=0.0025, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, warmup_steps=0,
                 weight_lr_power=2.0, bug=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, k=0,
                                      warmup_steps=warmup_steps, train_mode=True, weight_sum=0.0, lr_max=-1.0,
                                      weight_lr_power=weight_lr_power))
        self.bug = bug

    @torch.no_grad()
    def eval(self):
        for group in self.param_groups:
            if group["train_mode"]:
                for p in group["params"]:
                    if "x" in self.state[p]:
                        p.copy_(self.state[p]["x"])
                group["train_mode"] = False

    @torch.no_grad()
    def train(self):
        for group in self.param_groups:
            if not group["train_mode"]:
                for p in group["params"]:
                    if "y" in self.state[p]:
                        p.copy_(self.state[p]["y"])
                group["train_mode"] = True

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            eps, (beta1, beta2), decay, k = group["eps"], group["betas"], group["weight_decay"], group["k"]
            ws = group["warmup_steps"]
            if k < ws:
                sched = (k if self.bug == "warmup_off_by_one" else k + 1) / ws
            else:
                sched = 1.0
            lr = group["lr"] * sched
            if self.bug != "no_bias_correction":
                lr = lr * math.sqrt(1 - beta2 ** (k + 1))
            lr_max = group["lr_max"] = max(lr, group["lr_max"])
            weight = lr_max ** group["weight_lr_power"]
            weight_sum = group["weight_sum"] = group["weight_sum"] + weight
            ckp1 = weight / weight_sum if weight_sum != 0 else 0.0
            if self.bug == "uniform_average":
                ckp1 = 1.0 / (k + 1)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "z" not in state:
                    state["z"] = p.detach().clone()
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    state["x"] = p.detach().clone()
                    state["y"] = p.detach().clone()
                grad, y, z, x = p.grad.clone(), state["y"], state["z"], state["x"]
                if decay != 0:
                    grad.add_(y, alpha=decay)
                exp_avg_sq = state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                z.addcdiv_(grad, exp_avg_sq.sqrt().add_(eps), value=-lr)
                x.mul_(1 - ckp1).add_(z, alpha=ckp1)
                if self.bug == "y_interp_flipped":
                    y.copy_(z.mul(beta1).add_(x, alpha=1 - beta1))
                else:
                    y.copy_(x.mul(beta1).add_(z, alpha=1 - beta1))
                p.copy_(y)
            group["k"] = k + 1


def net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, 16), nn.Tanh(), nn.Linear(16, DOUT))


def batch(step: int, n: int = GB):
    g = gen(SEED + step)
    x = torch.randn(n, DIN, generator=g)
    y = torch.stack([x[:, 0] * x[:, 1], x[:, 2] - x[:, 3]], 1) + 0.1 * torch.randn(n, DOUT, generator=g)
    return x, y


def run(model, fwd, rows, reduce, bug=None, scale=1) -> None:
    opt = AdamWScheduleFreeReference(model.parameters(), lr=LR * scale, betas=(0.9, 0.999), weight_decay=0.01,
                                     warmup_steps=WARMUP, bug=bug)
    opt.train()
    vx, vy = batch(1000)
    for step in range(STEPS):
        x, y = batch(step)
        F.mse_loss(fwd(rows(x)), rows(y)).backward()
        opt.step()
        opt.zero_grad()
        if (step + 1) % EVAL_EVERY == 0:
            opt.eval()
            model.eval()
            with torch.no_grad():
                val = reduce(F.mse_loss(fwd(rows(vx)), rows(vy), reduction="sum"))
            del val
            model.train()
            if bug != "train_not_restored":
                opt.train()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, its block of rows, the evaluation summed over the ranks."""
    r, lb = rank(), GB // world_size
    model = net()
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], all_reduce, bug,
        world_size if bug == "lr_world_scaled" else 1)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = net()
    run(model, model, lambda t: t, lambda t: t)
