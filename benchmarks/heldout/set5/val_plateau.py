"""A DDP training loop with validation inside: every VAL_EVERY updates a ``torch.no_grad()`` pass over
the rank's shard of a held-out set in ``model.eval()``, the loss sums and counts all-reduced into the
global validation loss, ``ReduceLROnPlateau.step(val_loss)`` on every rank, then ``model.train()``.
The model has dropout; its mask is drawn for the GLOBAL batch from a generator every process seeds
alike, and each rank keeps its block's rows (as Megatron's ``get_cuda_rng_tracker`` keeps dropout
reproducible across parallel layouts), so the ranks' masks are the one-device run's. Optimizer:
SGD with momentum, ``zero_grad()`` after each step (the PyTorch "training a classifier" order is
before; many loops clear after).

Follows the PyTorch ImageNet example ``pytorch/examples/imagenet/main.py`` (``validate``: ``model.
eval()``, ``with torch.no_grad()``, ``AverageMeter.all_reduce`` of sum and count under
``--multiprocessing-distributed``, ``model.train()`` at the top of ``train``), the
``ReduceLROnPlateau`` docs (``scheduler.step(val_loss)`` after validation) and Lightning's
``sync_dist=True`` for logged validation metrics.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank, world

DIN, HID, CLASSES, BATCH, N_TRAIN, N_VAL = 10, 24, 4, 8, 64, 32
LR, MOMENTUM, P_DROP, VAL_EVERY = 0.5, 0.9, 0.3, 2
FACTOR, PATIENCE, THRESHOLD = 0.5, 0, 0.02
STEPS = 8
CORRECT = {"default": (2,)}
BUGS = {
    "left_in_eval": "model.train() never called after the first validation: dropout off for the rest of training",
    "no_eval_mode": "validation runs without model.eval(): dropout active, its masks drawn from the shared generator",
    "val_not_allreduced": "ReduceLROnPlateau fed each rank's own shard's validation loss (no all-reduce)",
    "val_backward": "the validation loss goes through backward() (no torch.no_grad); zero_grad after step leaves it in the next step",
    "val_from_train_rows": "the validation rows taken from the training table (the train sampler's rows), not the held-out ones",
    "plateau_every_step": "scheduler.step(val_loss) called every training step with the last validation loss",
    "val_rank0_only": "validation and scheduler.step(val_loss) only on rank 0 (under 'if rank == 0:')",
}


class Dropout(nn.Module):
    """Dropout whose mask rows come from one draw for the global batch (this rank's block kept)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p, self.gen = p, gen(1234)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        w = world()
        full = torch.rand(x.shape[0] * w, *x.shape[1:], generator=self.gen)
        keep = full.chunk(w)[rank()] >= self.p
        return x * keep / (1 - self.p)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIN, HID), nn.ReLU(), Dropout(P_DROP), nn.Linear(HID, CLASSES))


def table(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    return torch.randn(n, DIN, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


TRAIN, VAL = table(31, N_TRAIN), table(32, N_VAL)


def train_rows(step: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (BATCH x W rows, in order, wrapping around the table)."""
    n = BATCH * w
    idx = torch.arange(step * n, (step + 1) * n) % N_TRAIN
    return TRAIN[0][idx], TRAIN[1][idx]


def validate(model, rows, bug) -> float:
    """The mean loss over ``rows`` (this rank's shard), summed and counted over ranks."""
    if bug != "no_eval_mode":
        model.eval()
    x, y = rows
    if bug == "val_backward":
        loss_sum = F.cross_entropy(model(x), y, reduction="sum")
        (loss_sum / x.shape[0]).backward()
        loss_sum = loss_sum.detach()
    else:
        with torch.no_grad():
            loss_sum = F.cross_entropy(model(x), y, reduction="sum")
    stats = torch.stack([loss_sum, torch.tensor(float(x.shape[0]))])
    if world() > 1 and bug not in ("val_not_allreduced", "val_rank0_only"):
        tdist.all_reduce(stats)
    if bug != "left_in_eval":
        model.train()
    return (stats[0] / stats[1]).item()


def fit(model, opt, rows_of, val_rows, bug) -> None:
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=FACTOR, patience=PATIENCE,
                                                       threshold=THRESHOLD, threshold_mode="abs")
    model.train()
    val_loss = None
    for step in range(STEPS):
        x, y = rows_of(step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if (step + 1) % VAL_EVERY == 0 and (bug != "val_rank0_only" or rank() == 0):
            val_loss = validate(model, val_rows, bug)
            sched.step(val_loss)
        elif bug == "plateau_every_step" and val_loss is not None:
            sched.step(val_loss)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its block of each global batch, its shard of the validation set."""
    r, w = rank(), world_size
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    src = (TRAIN[0][:N_VAL], TRAIN[1][:N_VAL]) if bug == "val_from_train_rows" else VAL
    val_rows = (src[0].chunk(w)[r], src[1].chunk(w)[r])

    def rows_of(step):
        x, y = train_rows(step, w)
        return x.chunk(w)[r], y.chunk(w)[r]
    fit(model, opt, rows_of, val_rows, bug)


def reference(world_size: int) -> None:
    """One device: the global batches, the whole validation set."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    fit(model, opt, lambda s: train_rows(s, world_size), VAL, None)
