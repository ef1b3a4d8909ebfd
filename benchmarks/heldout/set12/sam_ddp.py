"""SAM (sharpness-aware minimization) under DDP: per step two forward/backward passes on the same batch.
The first pass's gradient (all-reduced by DDP) gives the ascent ``e_w = rho * g / ||g||_2`` (one norm
over all parameters), the weights move to ``w + e_w`` (the old weights kept), the second pass's gradient
at ``w + e_w`` (all-reduced as well) is taken, the weights are restored to ``w``, and the base optimizer
(SGD, momentum, weight decay) steps with the second gradient. Loss: label-smoothed cross entropy, mean
over the rank's rows (DDP's average is the global mean). A tiny MLP with LayerNorm; each rank keeps its
block of every global batch.

The one-device reference: the same SAM on the global batch.

Follows davda54/sam ``sam.py`` (``SAM(torch.optim.Optimizer)`` around a base optimizer class,
``first_step``: ``scale = rho / (grad_norm + 1e-12)``, ``self.state[p]["old_p"] = p.data.clone()``,
``p.add_(e_w)``; ``second_step``: ``p.data = self.state[p]["old_p"]`` then ``base_optimizer.step()``;
``_grad_norm`` over all parameters) and its ``example/train.py`` (first pass, ``first_step(zero_grad=
True)``, second pass on the same batch, ``second_step(zero_grad=True)``; ``smooth_crossentropy``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

DIN, C, GB, SEED = 6, 4, 8, 43
RHO, LR, SMOOTH = 0.3, 0.1, 0.1
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "ascent_local_grad": "the first (ascent) pass runs under ddp.no_sync(): e_w comes from the rank's own gradient, not the all-reduced one",
    "descent_local_grad": "the second pass runs under ddp.no_sync(): the base optimizer steps with the rank's own gradient at w + e_w",
    "restore_forgotten": "second_step does not restore the old weights: the base step is taken from w + e_w",
    "step_before_restore": "second_step calls base_optimizer.step() before restoring old_p, so the update is overwritten by the restore",
    "norm_per_param": "the ascent is scaled by each parameter's own gradient norm instead of the norm over all parameters",
    "no_zero_between": "first_step(zero_grad=False): the second pass's gradient is added onto the first pass's",
    "second_loss_unsmoothed": "the second pass uses plain cross entropy while the first uses the label-smoothed loss",
}


class SAM(torch.optim.Optimizer):
    """davda54's SAM: ``first_step`` climbs to ``w + e_w``, ``second_step`` restores ``w`` and steps the base."""

    def __init__(self, params, base_optimizer, rho=0.05, bug=None, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.bug = bug
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                norm = p.grad.norm(2) if self.bug == "norm_per_param" else grad_norm
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * (group["rho"] / (norm + 1e-12)))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        if self.bug == "step_before_restore":
            self.base_optimizer.step()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.bug == "restore_forgotten":
                    continue
                p.data = self.state[p]["old_p"]
        if self.bug != "step_before_restore":
            self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    def _grad_norm(self):
        return torch.norm(torch.stack([p.grad.norm(p=2) for g in self.param_groups for p in g["params"]
                                       if p.grad is not None]), p=2)


def net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 16), nn.GELU(),
                         nn.Linear(16, C))


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, DIN, generator=g)
    y = (x[:, :C] + 0.5 * torch.randn(GB, C, generator=g)).argmax(1)
    return x, y


def smooth_ce(out, y, smoothing=SMOOTH):
    return F.cross_entropy(out, y, label_smoothing=smoothing)


def run(model, fwd, rows, first_ctx, second_ctx, bug=None) -> None:
    """davda54's example loop; ``fwd`` is the (possibly DDP-wrapped) model, ``*_ctx`` each pass's context."""
    opt = SAM(model.parameters(), torch.optim.SGD, rho=RHO, bug=bug, lr=LR, momentum=0.9, weight_decay=5e-4)
    for step in range(STEPS):
        x, y = batch(step)
        x, y = rows(x), rows(y)
        with first_ctx():
            smooth_ce(fwd(x), y).backward()
        opt.first_step(zero_grad=bug != "no_zero_between")
        with second_ctx():
            smooth_ce(fwd(x), y, 0.0 if bug == "second_loss_unsmoothed" else SMOOTH).backward()
        opt.second_step(zero_grad=True)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, both passes synchronised, its block of each global batch."""
    r, lb = rank(), GB // world_size
    model = net()
    ddp = DDP(model)
    plain = torch.enable_grad
    run(model, ddp, lambda t: t[r * lb:(r + 1) * lb],
        ddp.no_sync if bug == "ascent_local_grad" else plain,
        ddp.no_sync if bug == "descent_local_grad" else plain, bug)


def reference(world_size: int) -> None:
    """One device: SAM on the global batch."""
    model = net()
    run(model, model, lambda t: t, torch.enable_grad, torch.enable_grad)
