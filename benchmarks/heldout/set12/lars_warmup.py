"""Large-batch training with LARS under DDP: Barlow Twins' LARS (per-parameter trust ratio ``eta *
||p|| / ||g + wd * p||``, weight decay and adaptation both skipped for biases and norm weights, i.e.
every 1-D parameter), two parameter groups (weights and biases) with their own lr multipliers, the
learning rate set by hand every iteration: linear warmup over ``WARMUP_EPOCHS`` epochs of iterations,
then cosine to ``0.001 * base``, ``base = LR * global_batch / 256``. A tiny MLP with LayerNorm;
cross entropy (mean over the rank's rows); each rank reads its block of the global batches (a
DistributedSampler's loader: ``len(loader)`` iterations per epoch).

The one-device reference: the same schedule on the global batches.

Follows facebookresearch/barlowtwins ``main.py`` (``LARS(optim.Optimizer)`` with
``weight_decay_filter`` / ``lars_adaptation_filter = exclude_bias_and_norm`` (``p.ndim == 1``),
``adjust_learning_rate(args, optimizer, loader, step)``: ``warmup_steps = 10 * len(loader)``,
``base_lr = args.batch_size / 256``, cosine after warmup, ``param_groups[0]['lr'] = lr *
args.learning_rate_weights``, ``[1] ... learning_rate_biases``; ``per_device_batch_size =
args.batch_size // args.world_size``; ``step`` counted over ``enumerate(loader, start=epoch *
len(loader))``) and NVIDIA/apex ``apex/parallel/LARC.py`` (trust ratio per parameter).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

DIN, C, GB, SEED = 8, 4, 16, 53
EPOCHS, WARMUP_EPOCHS, N = 4, 1, 64
LR, LR_W, LR_B, WD, ETA = 64.0, 0.2, 0.0048, 1e-2, 0.02
STEPS = EPOCHS * N // GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "lr_local_batch": "the base lr is scaled by the per-device batch size instead of the global batch size",
    "warmup_in_epochs": "adjust_learning_rate is given the epoch instead of the iteration: warmup and cosine are counted in epochs",
    "bias_adapted": "no lars_adaptation_filter: biases and norm weights get the trust ratio too",
    "bias_decayed": "no weight_decay_filter: biases and norm weights are weight-decayed",
    "trust_global_norm": "the trust ratio is computed once from the norms over all parameters instead of per parameter",
    "lr_after_step": "adjust_learning_rate is called after optimizer.step(): every step uses the previous iteration's lr",
    "loader_len_global": "the schedule's steps per epoch come from the undistributed dataset (N / per-device batch), stretching warmup and cosine",
}


def exclude_bias_and_norm(p: torch.Tensor) -> bool:
    return p.ndim == 1


class LARS(optim.Optimizer):
    """Barlow Twins' LARS; ``global_trust`` (a bug) uses one trust ratio from the norms over all adapted tensors."""

    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001, weight_decay_filter=None,
                 lars_adaptation_filter=None, global_trust=False):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta,
                                      weight_decay_filter=weight_decay_filter,
                                      lars_adaptation_filter=lars_adaptation_filter))
        self.global_trust = global_trust

    def _global_q(self):
        ps = [p for g in self.param_groups for p in g["params"] if p.grad is not None and p.ndim > 1]
        pn = torch.norm(torch.stack([p.norm() for p in ps]))
        un = torch.norm(torch.stack([p.grad.norm() for p in ps]))
        return ps[0].new_tensor(self.param_groups[0]["eta"]) * pn / un

    @torch.no_grad()
    def step(self):
        gq = self._global_q() if self.global_trust else None
        for g in self.param_groups:
            for p in g["params"]:
                dp = p.grad
                if dp is None:
                    continue
                if g["weight_decay_filter"] is None or not g["weight_decay_filter"](p):
                    dp = dp.add(p, alpha=g["weight_decay"])
                if g["lars_adaptation_filter"] is None or not g["lars_adaptation_filter"](p):
                    param_norm, update_norm = torch.norm(p), torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0., torch.where(update_norm > 0, (g["eta"] * param_norm / update_norm),
                                                                 one), one)
                    dp = dp.mul(gq if gq is not None else q)
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(g["momentum"]).add_(dp)
                p.add_(mu, alpha=-g["lr"])


def adjust_learning_rate(optimizer, loader_len: int, step: int, batch_size: int) -> None:
    max_steps = EPOCHS * loader_len
    warmup_steps = WARMUP_EPOCHS * loader_len
    base_lr = LR * batch_size / 256
    if step < warmup_steps:
        lr = base_lr * (step + 1) / warmup_steps
    else:
        step -= warmup_steps
        max_steps -= warmup_steps
        q = 0.5 * (1 + math.cos(math.pi * step / max_steps))
        lr = base_lr * q + base_lr * 0.001 * (1 - q)
    optimizer.param_groups[0]["lr"] = lr * LR_W
    optimizer.param_groups[1]["lr"] = lr * LR_B


def net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, C))


def data():
    g = gen(SEED)
    x = torch.randn(N, DIN, generator=g)
    y = (x[:, :C] - x[:, C:2 * C] + 0.5 * torch.randn(N, C, generator=g)).argmax(1)
    return x, y


def run(model, fwd, rows, per_device: int, bug=None) -> None:
    """The training loop; ``rows`` keeps this process's block of a global batch of ``GB`` rows."""
    weights = [p for p in model.parameters() if p.ndim > 1]
    biases = [p for p in model.parameters() if p.ndim == 1]
    filt = {"weight_decay_filter": None if bug == "bias_decayed" else exclude_bias_and_norm,
            "lars_adaptation_filter": None if bug == "bias_adapted" else exclude_bias_and_norm}
    opt = LARS([{"params": weights}, {"params": biases}], lr=0, weight_decay=WD, eta=ETA,
               global_trust=bug == "trust_global_norm", **filt)
    xs, ys = data()
    loader_len = N // GB
    sched_len = N // per_device if bug == "loader_len_global" else loader_len
    bs = per_device if bug == "lr_local_batch" else GB
    for epoch in range(EPOCHS):
        for step in range(epoch * loader_len, (epoch + 1) * loader_len):
            i = (step % loader_len) * GB
            if bug != "lr_after_step":
                adjust_learning_rate(opt, sched_len, epoch if bug == "warmup_in_epochs" else step, bs)
            elif step == 0:
                adjust_learning_rate(opt, sched_len, 0, bs)
            loss = F.cross_entropy(fwd(rows(xs[i:i + GB])), rows(ys[i:i + GB]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if bug == "lr_after_step":
                adjust_learning_rate(opt, sched_len, step, bs)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, its block of each global batch; lr scaled by the global batch."""
    r, lb = rank(), GB // world_size
    model = net()
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], lb, bug)


def reference(world_size: int) -> None:
    """One device: the same schedule on the global batches."""
    model = net()
    run(model, model, lambda t: t, GB)
