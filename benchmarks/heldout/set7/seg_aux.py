"""torchvision's segmentation reference, tiny: an FCN-like net (a two-conv backbone, an ``FCNHead``
classifier on the stride-2 features, an aux classifier on the stride-1 features, both upsampled
bilinearly to the image) returning ``{"out", "aux"}``; ``criterion = CE(out) + 0.5 * CE(aux)`` with
``ignore_index=255``; the BatchNorms converted to synchronised BatchNorm under DDP; SGD with the aux
classifier in its own group at 10x the lr; a poly schedule ``LambdaLR(lambda x: (1 - x / (len(
data_loader) * epochs)) ** 0.9)`` stepped per iteration; ``DistributedSampler`` with ``set_epoch``;
an evaluation after each epoch (``model.eval()``, a confusion matrix summed over the ranks) and
``model.train()`` again.

``nn.SyncBatchNorm`` runs only on GPUs, so the conversion writes a synchronised BatchNorm by hand,
as apex and torch's ``_functions.py`` do: the per-channel sums, sums of squares and counts are
all-reduced (an autograd all-reduce whose backward all-reduces the gradients too), mean and biased
variance from the global sums. The FCNHead's dropout is left out (its masks would differ per rank).

Follows pytorch/vision ``references/segmentation/train.py`` (``criterion``: ``losses["out"] + 0.5 *
losses["aux"]``; ``params_to_optimize`` with the aux classifier at ``lr * 10``; the ``LambdaLR`` poly
schedule with ``iters_per_epoch = len(data_loader)``; ``train_sampler.set_epoch(epoch)``; ``evaluate``
then ``model.train()`` in ``train_one_epoch``), ``torchvision/models/segmentation/fcn.py``
(``FCNHead``), ``_utils.py`` (``_SimpleSegmentationModel``: ``F.interpolate(..., mode="bilinear",
align_corners=False)``) and ``torch/nn/modules/_functions.py`` (``SyncBatchNorm``). DDP averages the
ranks' losses, each a mean over the rank's labelled pixels; the one-device reference therefore runs the
global batch at once (BatchNorm over all of it) and averages the per-rank blocks' losses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..set5.common import reduce_from
from .common import all_reduce, gen, rank

C, CH, HW, N, BATCH, EPOCHS, IGNORE = 4, 8, 16, 8, 2, 2, 255
LR, MOMENTUM, WD, SEED = 0.05, 0.9, 1e-4, 31
STEPS = 4  # EPOCHS * N / (2 ranks * BATCH)
CORRECT = {"default": (2,)}
BUGS = {
    "plain_bn": "BatchNorm not converted to synchronised BatchNorm: each rank normalises with its own batch statistics",
    "syncbn_avg_var": "hand SyncBN: the variance is the average of the ranks' local variances (global mean right)",
    "syncbn_no_bwd_reduce": "hand SyncBN: the statistics' all-reduce has no backward all-reduce (other ranks' gradients lost)",
    "poly_total_dataset": "poly schedule total from len(dataset) // batch_size * epochs, not len(data_loader) * epochs",
    "ignore_as_background": "targets 255 mapped to class 0 before the loss (ignore_index never hit)",
    "no_set_epoch": "train_sampler.set_epoch(epoch) not called: the second epoch repeats the first's order",
    "no_train_after_eval": "model.train() not called after the evaluation: the next epoch runs BatchNorm in eval mode",
}


class SyncBN(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are taken over every rank's batch."""

    bug: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        n = torch.tensor([float(x.numel() // x.shape[1])])
        s, ss = x.sum((0, 2, 3)), (x * x).sum((0, 2, 3))
        tot = reduce_from(torch.cat([s, ss, n]), reduce_bwd=self.bug != "syncbn_no_bwd_reduce")
        s, ss, count = tot[:CH], tot[CH:2 * CH], tot[-1]
        mean = s / count
        var = ss / count - mean * mean
        if self.bug == "syncbn_avg_var":
            var = reduce_from(x.var((0, 2, 3), unbiased=False), reduce_bwd=True) / (count / n)
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
            self.running_var.mul_(1 - self.momentum).add_(self.momentum * var * count / (count - 1))
        xh = (x - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + self.eps)
        return xh * self.weight[None, :, None, None] + self.bias[None, :, None, None]


def convert_sync(module: nn.Module, bug=None) -> nn.Module:
    """Every BatchNorm2d replaced by a :class:`SyncBN` holding the same parameters and buffers."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            new = SyncBN(child.num_features)
            new.load_state_dict(child.state_dict())
            new.bug = bug
            setattr(module, name, new)
        else:
            convert_sync(child, bug)
    return module


def block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class FCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.down = block(3, CH), block(CH, CH, 2)
        self.classifier = nn.Sequential(block(CH, CH), nn.Conv2d(CH, C, 1))
        self.aux_classifier = nn.Sequential(block(CH, CH), nn.Conv2d(CH, C, 1))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f1 = self.stem(x)
        f2 = self.down(f1)
        up = lambda t: F.interpolate(t, size=x.shape[-2:], mode="bilinear", align_corners=False)  # noqa: E731
        return {"out": up(self.classifier(f2)), "aux": up(self.aux_classifier(f1))}


def criterion(out: dict, target: torch.Tensor) -> torch.Tensor:
    losses = {k: F.cross_entropy(v, target, ignore_index=IGNORE) for k, v in out.items()}
    return losses["out"] + 0.5 * losses["aux"]


def dataset(seed: int) -> TensorDataset:
    """Images whose class follows the sign pattern of two channels; a random box of 255 per image."""
    g = gen(seed)
    img = torch.randn(N, 3, HW, HW, generator=g)
    lab = ((img[:, 0] > 0).long() * 2 + (img[:, 1] > 0.3).long())
    for i in range(N):
        y0, x0, h, w = (int(v) for v in torch.randint(0, 9, (4,), generator=g))
        lab[i, y0:y0 + h, x0:x0 + w] = IGNORE
    return TensorDataset(img, lab)


def build(sync: bool = False, bug=None):
    """The model (its BatchNorms converted first where ``sync``), then the optimizer over its parameters."""
    torch.manual_seed(SEED)
    model = FCN()
    if sync:
        convert_sync(model, bug)
    groups = [{"params": [p for n, p in model.named_parameters() if not n.startswith("aux")]},
              {"params": list(model.aux_classifier.parameters()), "lr": LR * 10}]
    opt = torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM, weight_decay=WD)
    return model, opt


def poly(opt, total: int):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda x: (1 - x / total) ** 0.9)


def evaluate(model, w: int, bug=None) -> None:
    """Confusion matrix over the rank's validation images, summed over the ranks."""
    model.eval()
    x, y = dataset(99)[rank()::w]
    with torch.no_grad():
        pred = model(x)["out"].argmax(1)
    keep = y != IGNORE
    all_reduce(torch.bincount(y[keep] * C + pred[keep], minlength=C * C))
    if bug != "no_train_after_eval":
        model.train()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP over the (synchronised) FCN, its sampler's batches, poly lr per iteration."""
    r, w = rank(), world_size
    model, opt = build(bug != "plain_bn", bug)
    ddp = DDP(model)
    ds = dataset(7)
    sampler = DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, drop_last=True)
    total = (len(ds) // BATCH if bug == "poly_total_dataset" else len(loader)) * EPOCHS
    sched = poly(opt, total)
    for epoch in range(EPOCHS):
        if bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        for x, y in loader:
            if bug == "ignore_as_background":
                y = torch.where(y == IGNORE, 0, y)
            loss = criterion(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        evaluate(ddp, w, bug)


def reference(world_size: int) -> None:
    """One device: per iteration the ranks' batches stacked in rank order, BatchNorm over all of them,
    the loss the mean of the ranks' blocks' losses."""
    w = world_size
    model, opt = build()
    ds = dataset(7)
    samplers = [DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=0) for r in range(w)]
    iters = len(samplers[0]) // BATCH
    sched = poly(opt, iters * EPOCHS)
    for epoch in range(EPOCHS):
        order = []
        for s in samplers:
            s.set_epoch(epoch)
            order.append(list(s))
        for i in range(iters):
            idx = [j for r in range(w) for j in order[r][i * BATCH:(i + 1) * BATCH]]
            x, y = ds[idx]
            out = model(x)
            loss = sum(criterion({k: v[r * BATCH:(r + 1) * BATCH] for k, v in out.items()},
                                 y[r * BATCH:(r + 1) * BATCH]) for r in range(w)) / w
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        model.train()
