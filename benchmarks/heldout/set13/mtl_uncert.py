"""Multi-task learning with learned uncertainty weights under DDP: a shared trunk, a regression head and a
classification head; the task weights are ``log_vars`` (one per task, an ``nn.Parameter`` of the wrapper
module, so DDP all-reduces their gradient), the total loss ``sum_i exp(-s_i) * L_i + s_i``. Two parameter
groups in SGD with momentum: the network (lr 0.05, weight decay 1e-3) and the log-variances (lr 0.02, no
weight decay). Each task loss is a mean over the rank's rows (DDP's average is the global mean). Each
rank keeps its block of every global batch.

The one-device reference: the same loop on the global batch.

Follows yaringal/multi-task-learning-example ``multi-task-learning-example.ipynb`` (``CustomMultiLossLayer``:
``precision = K.exp(-log_var[0]); loss += K.sum(precision * (y_true - y_pred)**2. + log_var[0], -1)``),
Mikoshi's PyTorch port ``MultiTaskLossWrapper`` (``self.log_vars = nn.Parameter(torch.zeros(task_num))``,
``precision = torch.exp(-self.log_vars[i]); loss += precision * loss_i + self.log_vars[i]``) and PyTorch's
optimizer docs on per-parameter options (a second param group).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

DIN, H, C, GB, SEED = 6, 16, 3, 8, 101
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "log_vars_grad_reduced_twice": "after backward the log_vars gradient is all-reduced (summed) again by hand, on top of DDP's average",
    "log_vars_in_model_group": "log_vars are put in the network's param group: they get its lr and its weight decay",
    "regulariser_dropped": "the + log_var regulariser is left out of the weighted sum: only exp(-s) * L remains",
    "precision_sign": "the precision is exp(+s) instead of exp(-s)",
    "cls_loss_sum": "the classification loss uses reduction='sum' instead of the mean: DDP averages the ranks' sums",
    "weights_detached": "exp(-log_var) is detached in the weighted sum: log_vars get gradient only from the regulariser",
}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(DIN, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU())
        self.reg = nn.Linear(H, 1)
        self.cls = nn.Linear(H, C)

    def forward(self, x):
        h = self.trunk(x)
        return self.reg(h).squeeze(-1), self.cls(h)


class Weights(nn.Module):
    def __init__(self, n=2):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n))

    def forward(self, losses, bug=None):
        s = self.log_vars
        prec = torch.exp(s) if bug == "precision_sign" else torch.exp(-s)
        if bug == "weights_detached":
            prec = prec.detach()
        total = 0.0
        for i, loss in enumerate(losses):
            total = total + prec[i] * loss + (0.0 if bug == "regulariser_dropped" else s[i])
        return total


class MTL(nn.Module):
    """The network and the task weights in one module (the one DDP wraps)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.net = Net()
        self.weights = Weights()

    def forward(self, x, y_reg, y_cls, bug=None):
        reg, cls = self.net(x)
        l_cls = F.cross_entropy(cls, y_cls, reduction="sum" if bug == "cls_loss_sum" else "mean")
        return self.weights([F.mse_loss(reg, y_reg), l_cls], bug)


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, DIN, generator=g)
    y_reg = x[:, 0] - 2 * x[:, 1] + 0.5 * torch.randn(GB, generator=g)
    y_cls = (x[:, 2:2 + C] + 0.3 * torch.randn(GB, C, generator=g)).argmax(1)
    return x, y_reg, y_cls


def optimizer(model: MTL, bug=None):
    if bug == "log_vars_in_model_group":
        return torch.optim.SGD([{"params": model.parameters(), "lr": 0.05, "weight_decay": 1e-3}], momentum=0.9)
    return torch.optim.SGD([{"params": model.net.parameters(), "lr": 0.05, "weight_decay": 1e-3},
                            {"params": model.weights.parameters(), "lr": 0.02, "weight_decay": 0.0}], momentum=0.9)


def run(model, loss_of, rows, bug=None) -> None:
    opt = optimizer(model, bug)
    for step in range(STEPS):
        x, y_reg, y_cls = (rows(t) for t in batch(step))
        loss = loss_of(x, y_reg, y_cls)
        opt.zero_grad()
        loss.backward()
        if bug == "log_vars_grad_reduced_twice":
            tdist.all_reduce(model.weights.log_vars.grad)
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the wrapper under DDP, its block of rows."""
    r, lb = rank(), GB // world_size
    model = MTL()
    ddp = DDP(model)
    run(model, lambda x, y_reg, y_cls: ddp(x, y_reg, y_cls, bug), lambda t: t[r * lb:(r + 1) * lb], bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = MTL()
    run(model, model, lambda t: t)
