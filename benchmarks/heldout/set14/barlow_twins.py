"""Barlow Twins under DDP with a synchronised batch norm in the projector: two augmented views of every
row go through a backbone and a projector (Linear, SyncBatchNorm, ReLU, Linear); the projector outputs are
normalised by a batch norm without affine parameters (synchronised too), the cross-correlation
``c = bn(z1).T @ bn(z2)`` is divided by the global batch and summed over the ranks, and the loss is
``sum((1 - diag(c))**2) + lambd * sum(offdiag(c)**2)``. The sum over the ranks is an autograd all-reduce
(``torch.distributed.nn.functional.all_reduce``): every rank's loss is the same global loss, the backward
sums its gradient over the ranks and DDP's average brings it back to the one-device gradient. The view
noise is drawn for the global batch by a generator seeded per step; each rank keeps its block of rows.
SGD with momentum.

The one-device reference: the same loop on the global batch (the batch norms over the whole batch).

Follows facebookresearch/barlowtwins ``main.py`` (``BarlowTwins.forward``: ``c = self.bn(z1).T @
self.bn(z2)``, ``c.div_(self.args.batch_size)``, ``torch.distributed.all_reduce(c)``, ``off_diagonal``,
``loss = on_diag + self.args.lambd * off_diag``; ``nn.SyncBatchNorm.convert_sync_batchnorm(model)``) and
facebookresearch/vicreg ``main_vicreg.py`` (``FullGatherLayer``: a gather whose backward all-reduces the
gradients). ``nn.SyncBatchNorm`` refuses CPU tensors, so the projector uses ``common.SyncBatchNorm1d``.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import SyncBatchNorm1d, all_reduce_grad, gen, rank, world

DIN, H, P, GB, SEED, LAMBD = 6, 12, 8, 8, 142, 0.05
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "c_not_all_reduced": "the cross-correlation matrix is divided by the global batch but never summed over the ranks",
    "c_div_local_batch": "the cross-correlation is divided by the rank's local batch size before the all-reduce (c is world-size times too large)",
    "offdiag_scaled_twice": "the off-diagonal term is multiplied by lambd twice (lambd ** 2)",
    "plain_batchnorm": "the projector and the loss use plain BatchNorm1d instead of SyncBatchNorm: per-rank batch statistics",
    "c_reduce_without_grad": "c is summed with an in-place torch.distributed.all_reduce that autograd does not see: the gradient is 1/world of the global one",
    "aug_noise_same_per_rank": "every rank draws the view noise for its rows from the same per-step seed (rank 0's block of noise on every rank)",
}


def off_diagonal(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


class BarlowTwins(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        torch.manual_seed(SEED)
        bn = (lambda n, affine=True: nn.BatchNorm1d(n, affine=affine)) if bug == "plain_batchnorm" else SyncBatchNorm1d
        self.backbone = nn.Sequential(nn.Linear(DIN, H), nn.ReLU())
        self.projector = nn.Sequential(nn.Linear(H, P, bias=False), bn(P), nn.ReLU(), nn.Linear(P, P))
        self.bn = bn(P, affine=False)
        self.bug = bug

    def forward(self, y1, y2):
        z1, z2 = self.projector(self.backbone(y1)), self.projector(self.backbone(y2))
        c = self.bn(z1).T @ self.bn(z2)
        c = c / (y1.shape[0] if self.bug == "c_div_local_batch" else GB)
        if self.bug == "c_reduce_without_grad":
            if world() > 1:
                tdist.all_reduce(c)
        elif self.bug != "c_not_all_reduced":
            c = all_reduce_grad(c)
        on_diag = (torch.diagonal(c) - 1).pow(2).sum()
        lam = LAMBD * LAMBD if self.bug == "offdiag_scaled_twice" else LAMBD
        return on_diag + lam * off_diagonal(c).pow(2).sum()


def views(step: int, rows, bug=None):
    g = gen(SEED + step)
    x = torch.randn(GB, DIN, generator=g)
    n1, n2 = torch.randn(GB, DIN, generator=g), torch.randn(GB, DIN, generator=g)
    x = rows(x)
    if bug == "aug_noise_same_per_rank":
        n1, n2 = n1[:x.shape[0]], n2[:x.shape[0]]
    else:
        n1, n2 = rows(n1), rows(n2)
    return x + 0.3 * n1, 1.2 * x + 0.3 * n2


def run(model, fwd, rows, bug=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    for step in range(STEPS):
        loss = fwd(*views(step, rows, bug))
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, its block of rows, c summed over the ranks."""
    r, lb = rank(), GB // world_size
    model = BarlowTwins(bug)
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = BarlowTwins()
    run(model, model, lambda t: t)
