"""Face-recognition style training with a class-parallel classifier (insightface's Partial FC at
sample rate 1, i.e. the model-parallel FC): a backbone MLP under DDP produces embeddings; the classifier's
class centres are split over the ranks (rank r holds rows ``[r C/W, (r+1) C/W)`` of the full init, a
plain parameter outside DDP); the embeddings are all-gathered with an autograd function whose backward
sums every rank's gradient for this rank's rows (``reduce``) and multiplies it by W (DDP divides it
again); the labels are all-gathered, those of other ranks' classes set to -1 and the rest offset by
``class_start``; cosine logits of the normalised embeddings and centres, ArcFace's additive angular
margin on the owner rank's target logit (the arccos / cos done without autograd, as in
``CombinedMarginLoss``), scale S, and the distributed softmax cross entropy (the max and the sum of
exponentials all-reduced, the target probability all-reduced, mean over the global batch), as an
``autograd.Function``. SGD momentum, insightface's ``PolyScheduler`` (linear warm-up then polynomial
decay, power 2) stepped per update. Every random draw is made for the global batch by a generator seeded
per step; each rank keeps its rows.

The one-device reference: the backbone on the global batch, the full class-centre matrix, the same
margin, plain cross entropy.

Follows deepinsight/insightface ``recognition/arcface_torch/partial_fc_v2.py`` (``PartialFC_V2``,
``AllGatherFunc`` with ``grad_out *= len(grad_list)``, ``DistCrossEntropyFunc``), ``losses.py``
(``CombinedMarginLoss``, ``ArcFace``), ``lr_scheduler.py`` (``PolyScheduler``) and ``train_v2.py``
(backbone in DDP, the FC module outside it, one SGD over both).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather_plain, gen, rank

DI, H, E, C, GB, SEED = 12, 32, 16, 16, 16, 1804
LR, MOMENTUM, S, M, WARMUP = 0.2, 0.9, 16.0, 0.3, 2
STEPS = 7
CORRECT = {"default": (2, 4)}
BUGS = {
    "allgather_grad_not_times_world": "the embeddings' all-gather backward omits grad_out *= world_size: after DDP's averaging the backbone gradient is W times too small",
    "allgather_grad_not_reduced": "the all-gather backward returns the rank's own slice of its local gradient without reducing over the ranks: the backbone only sees the gradient from this rank's class shard",
    "max_not_all_reduced": "the distributed softmax subtracts each rank's local max instead of the all-reduced (global) max before the exponentials are summed over ranks",
    "labels_not_offset": "the gathered labels are not shifted by class_start: on ranks > 0 the target logit (and its margin) is at the wrong local column",
    "centers_not_normalized": "the class centres are not L2-normalised: the logits are not cosines (and the margin is applied to unbounded values)",
    "fc_shard_inside_ddp": "the sharded classifier module is wrapped in DDP like the backbone: DDP broadcasts rank 0's shard to every rank at construction and averages the different shards' gradients",
    "ce_mean_over_local_batch": "the distributed cross entropy divides by the local batch size instead of the gathered (global) batch size",
}


def make_backbone():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, H), nn.PReLU(), nn.Linear(H, E))


def full_centers():
    return torch.normal(0, 0.5, (C, E), generator=gen(SEED + 1))


def batch(step: int):
    g = gen(SEED + 100 + step)
    y = torch.randint(0, C, (GB,), generator=g)
    proto = torch.randn(C, DI, generator=gen(SEED + 2))
    return proto[y] + 0.7 * torch.randn(GB, DI, generator=g), y


def arc_margin(cos, labels):
    """ArcFace on the rows whose label is not -1: cos(theta + M) at the target, no autograd through the
    arccos / cos (insightface does it in place under no_grad); times S."""
    idx = torch.where(labels != -1)[0]
    with torch.no_grad():
        new = cos.clone()
        t = new[idx, labels[idx]].clamp(-1 + 1e-6, 1 - 1e-6).arccos()
        new[idx, labels[idx]] = torch.cos(t + M)
    return (cos + (new - cos).detach()) * S


class AllGatherFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bug):
        ctx.bug = bug
        return all_gather_plain(x)

    @staticmethod
    def backward(ctx, g):
        w, r = tdist.get_world_size(), tdist.get_rank()
        g = g.contiguous().clone()
        if ctx.bug != "allgather_grad_not_reduced":
            tdist.all_reduce(g)
        out = g.chunk(w)[r].clone()
        if ctx.bug != "allgather_grad_not_times_world":
            out *= w
        return out, None


class DistCrossEntropyFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, denom, bug):
        n = logits.size(0)
        mx = logits.max(dim=1, keepdim=True)[0]
        if bug != "max_not_all_reduced":
            tdist.all_reduce(mx, tdist.ReduceOp.MAX)
        p = (logits - mx).exp()
        sm = p.sum(dim=1, keepdim=True)
        tdist.all_reduce(sm)
        p = p / sm
        idx = torch.where(labels != -1)[0]
        tp = torch.zeros(n, 1)
        tp[idx] = p[idx].gather(1, labels[idx, None])
        tdist.all_reduce(tp)
        ctx.save_for_backward(idx, p, labels)
        ctx.denom = denom
        return -tp.clamp_min(1e-30).log().sum() / denom

    @staticmethod
    def backward(ctx, gl):
        idx, p, labels = ctx.saved_tensors
        g = p.clone()
        g[idx, labels[idx]] -= 1
        return g / ctx.denom * gl, None, None, None


def poly(step: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    return (1 - (step - WARMUP) / (STEPS - WARMUP)) ** 2


class PartialFC(nn.Module):
    """The class-parallel classifier: this rank's class centres, the label remapping, margin and loss."""

    def __init__(self, start: int, num_local: int, bug=None):
        super().__init__()
        self.start, self.num_local, self.bug = start, num_local, bug
        self.weight = nn.Parameter(full_centers()[start:start + num_local].clone())

    def forward(self, emb, y, local_batch):
        bug = self.bug
        emb = AllGatherFunc.apply(emb, bug)
        labels = all_gather_plain(y)
        own = (labels >= self.start) & (labels < self.start + self.num_local)
        if bug == "labels_not_offset":
            own = own & (labels < self.num_local)
        else:
            labels = labels - self.start
        labels = torch.where(own, labels, torch.full_like(labels, -1))
        wgt = self.weight if bug == "centers_not_normalized" else F.normalize(self.weight)
        cos = F.linear(F.normalize(emb), wgt).clamp(-1, 1)
        logits = arc_margin(cos, labels)
        denom = local_batch if bug == "ce_mean_over_local_batch" else labels.numel()
        return DistCrossEntropyFunc.apply(logits, labels, denom, bug)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    backbone = make_backbone()
    cl = C // w
    pfc = PartialFC(r * cl, cl, bug)
    model = DDP(backbone)
    head = DDP(pfc) if bug == "fc_shard_inside_ddp" else pfc
    opt = torch.optim.SGD(list(backbone.parameters()) + list(pfc.parameters()), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, poly)
    lb = GB // w
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb]
        loss = head(model(x), y, lb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


class FullFC(nn.Module):
    """The one-device classifier: all class centres, the margin, plain cross entropy."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(full_centers())

    def forward(self, emb, y):
        cos = F.linear(F.normalize(emb), F.normalize(self.weight)).clamp(-1, 1)
        return F.cross_entropy(arc_margin(cos, y), y)


def reference(world_size: int) -> None:
    backbone, fc = make_backbone(), FullFC()
    opt = torch.optim.SGD(list(backbone.parameters()) + list(fc.parameters()), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, poly)
    for step in range(STEPS):
        x, y = batch(step)
        loss = fc(backbone(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
