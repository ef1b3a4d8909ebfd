"""R-Drop (consistency regularisation between two dropout passes) under DDP with float16 autocast and a
``GradScaler``: an MLP classifier with two dropout layers; each step runs the DDP model twice on the same
rows with different dropout masks, ``loss = 0.5 * (CE(p1) + CE(p2)) + alpha * 0.5 * (KL(p1 || p2) +
KL(p2 || p1))`` (``F.kl_div(log_softmax, softmax, reduction="batchmean")`` both ways), ``scaler.scale(loss)
.backward()``, ``scaler.unscale_(optimizer)`` then ``clip_grad_norm_``, ``scaler.step`` / ``scaler.update``,
and a warm-up + cosine schedule (``SequentialLR(LinearLR, CosineAnnealingLR)``) stepped after the optimizer.
SGD with momentum. The inputs and both passes' keep-masks are drawn for the global batch by a generator
seeded per step; each rank keeps its rows. Float16 autocast runs on CPU with ``torch.amp.GradScaler("cpu")``
(init scale 2**10: no overflow in this run).

The one-device reference: the same step on the global batch, under the same autocast and scaler, with
each rank's block of rows run under its own autocast region and the loss the mean of the blocks' losses
(float16 weight gradients sum over the batch rows inside the matmul: one float16 sum over the global batch
differs from the ranks' float16 sums averaged in float32 by ~1e-4).

Follows dropreg/R-Drop (``huggingface_transformer_src``/``fairseq_src``: ``compute_kl_loss`` with
``F.kl_div(F.log_softmax(p), F.softmax(q))`` both ways averaged, ``ce_loss = 0.5 * (ce(logits1) +
ce(logits2))``, ``loss = ce_loss + alpha * kl_loss``), the PyTorch AMP examples ("Working with Unscaled
Gradients": ``scaler.unscale_`` before ``clip_grad_norm_``), ``torch/amp/grad_scaler.py`` and the
``torch.optim.lr_scheduler`` docs (``SequentialLR``, ``scheduler.step()`` after ``optimizer.step()``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import MaskDropout, gen, rank

DI, H, C, GB, SEED = 12, 32, 4, 16, 2004
LR, MOM, ALPHA, P, MAX_NORM, WARM = 0.1, 0.9, 2.0, 0.3, 1.0, 2
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "masks_seeded_per_rank": "the dropout masks are drawn from a generator seeded with seed + rank for the rank's rows instead of the rank's rows of the global per-step draw",
    "lr_scaled_by_world": "the learning rate is multiplied by the world size (linear scaling rule) although the global batch is the one the learning rate was set for",
    "loss_divided_by_world": "the loss is divided by the world size before backward, as if DDP summed the gradients: DDP already averages, so the gradients are W times too small",
    "clip_before_unscale": "clip_grad_norm_ is applied to the still-scaled gradients (scaler.unscale_ is not called first): the clip sees a norm multiplied by the loss scale and clips far too hard",
    "scheduler_before_optimizer": "the warm-up / cosine scheduler is stepped before scaler.step(optimizer): every update uses the next step's learning rate",
    "same_mask_both_passes": "both forward passes reuse the first pass's dropout mask: the two predictions are identical, so the KL consistency term is zero",
    "kl_reduction_mean": "F.kl_div is called with reduction='mean' instead of 'batchmean': the KL term is divided by the number of classes too",
}


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, H), nn.GELU(), MaskDropout(P), nn.Linear(H, H), nn.GELU(), MaskDropout(P),
                         nn.Linear(H, C))


def batch(step: int):
    g = gen(SEED + 100 * step)
    protos = torch.randn(C, DI, generator=gen(SEED - 1))
    y = torch.randint(0, C, (GB,), generator=g)
    x = protos[y] + 1.2 * torch.randn(GB, DI, generator=g)
    masks = [(torch.rand(GB, H, generator=g) > P).float() for _ in range(4)]   # pass 1: two layers, pass 2: two
    return x, y, masks


def make_opt(model, lr=LR):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOM)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=WARM)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - WARM, eta_min=0.1 * lr)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[WARM])
    return opt, sched, torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)


def kl(p, q, reduction="batchmean"):
    return F.kl_div(F.log_softmax(p.float(), -1), F.softmax(q.float(), -1), reduction=reduction)


def rdrop_loss(model, net, x, y, masks, bug=None):
    with torch.autocast("cpu", dtype=torch.float16):
        net[2].mask, net[5].mask = masks[0], masks[1]
        p1 = model(x)
        if bug != "same_mask_both_passes":
            net[2].mask, net[5].mask = masks[2], masks[3]
        p2 = model(x)
        net[2].mask = net[5].mask = None
    red = "mean" if bug == "kl_reduction_mean" else "batchmean"
    ce = 0.5 * (F.cross_entropy(p1.float(), y) + F.cross_entropy(p2.float(), y))
    return ce + ALPHA * 0.5 * (kl(p1, p2, red) + kl(p2, p1, red))


def update(model, opt, sched, scaler, loss, bug=None):
    opt.zero_grad()
    scaler.scale(loss).backward()
    if bug != "clip_before_unscale":
        scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    if bug == "scheduler_before_optimizer":
        sched.step()
    scaler.step(opt)
    scaler.update()
    if bug != "scheduler_before_optimizer":
        sched.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its rows and their masks, the R-Drop step under autocast + GradScaler."""
    r, w = rank(), world_size
    net = make_model()
    model = DDP(net)
    opt, sched, scaler = make_opt(net, LR * w if bug == "lr_scaled_by_world" else LR)
    lb = GB // w
    rows = slice(r * lb, (r + 1) * lb)
    for step in range(STEPS):
        x, y, masks = batch(step)
        masks = [m[rows] for m in masks]
        if bug == "masks_seeded_per_rank":
            g = gen(SEED + 7 * step + 1000 * (r + 1))
            masks = [(torch.rand(lb, H, generator=g) > P).float() for _ in range(4)]
        loss = rdrop_loss(model, net, x[rows], y[rows], masks, bug)
        if bug == "loss_divided_by_world":
            loss = loss / w
        update(model, opt, sched, scaler, loss, bug)


def reference(world_size: int) -> None:
    """One device: the global batch, each rank's block of rows under its own autocast region (the same
    float16 matmul shapes, so that the float16 weight-gradient sums run over the same rows), the loss the
    mean of the blocks' losses."""
    w = world_size
    model = make_model()
    opt, sched, scaler = make_opt(model)
    lb = GB // w
    for step in range(STEPS):
        x, y, masks = batch(step)
        loss = sum(rdrop_loss(model, model, x[b * lb:(b + 1) * lb], y[b * lb:(b + 1) * lb],
                              [m[b * lb:(b + 1) * lb] for m in masks]) for b in range(w)) / w
        update(model, opt, sched, scaler, loss)
