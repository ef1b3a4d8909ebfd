"""A DETR-style set-prediction head under DDP with ``find_unused_parameters=True``: a class loss on
every query and a box loss on the foreground queries only, normalised by ``num_boxes`` all-reduced
across ranks; the box head runs only when the local batch holds foreground.

Follows facebookresearch/detr ``models/detr.py`` (``SetCriterion.forward``: ``num_boxes =
sum(len(t["labels"]) for t in targets)``, ``torch.distributed.all_reduce(num_boxes)``, ``num_boxes =
torch.clamp(num_boxes / get_world_size(), min=1).item()``, here clamped before the division:
DETR's order changes the loss whenever a step holds fewer boxes than ranks; ``loss_boxes``: ``F.l1_loss(...,
reduction='none').sum() / num_boxes``; the ``bbox_embed`` MLP with ``.sigmoid()``), ``main.py``
(``DistributedDataParallel(model, device_ids=[args.gpu])``, ``DistributedSampler(dataset_train)``,
``sampler_train.set_epoch(epoch)``, AdamW replaced by SGD here) and ``engine.py``
(``train_one_epoch``: ``optimizer.zero_grad(); losses.backward(); if max_norm > 0:
clip_grad_norm_(model.parameters(), max_norm); optimizer.step()``), with the conditional head of
torchvision ``references/detection`` models (a head skipped when there is nothing to supervise),
which needs ``find_unused_parameters=True``. The class loss is an unweighted mean (DETR's
``eos_coef`` weights would make a per-rank weighted mean differ from the global one). Two epochs of
three steps; one query per row, matched to its own target (no Hungarian matching).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

from .common import gen, rank

DIM, HID, CLASSES, ROWS, GLOBAL_BATCH, EPOCHS = 10, 32, 3, 24, 8, 2
LR, MOMENTUM, MAX_NORM, BOX_COEF = 0.1, 0.9, 0.5, 5.0
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "numboxes_local": "num_boxes counted on the local batch only (no all_reduce, no division by world size)",
    "numboxes_no_world_div": "num_boxes all-reduced but not divided by get_world_size() before the box loss",
    "no_set_epoch": "sampler_train.set_epoch(epoch) left out: the second epoch repeats the first's order",
    "no_dist_sampler": "a plain RandomSampler with a fixed generator: every rank reads the same rows",
    "lr_scaled_world": "lr multiplied by the world size (linear scaling rule) though the global batch is fixed",
    "clip_rank0_only": "clip_grad_norm_ called only on rank 0, inside the block that logs the grad norm",
    "zero_grad_interval": "optimizer.zero_grad() only every second step, next to the logging",
}


class Detr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(DIM, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU())
        self.class_embed = nn.Linear(HID, CLASSES + 1)
        self.bbox_embed = nn.Sequential(nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, 4))

    def forward(self, x: torch.Tensor, fg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.backbone(x)
        logits = self.class_embed(h)
        boxes = self.bbox_embed(h[fg]).sigmoid() if bool(fg.any()) else None
        return logits, boxes


def dataset() -> TensorDataset:
    g = gen(21)  # a seed where some rank holds no box at some step at 2 ranks
    x = torch.randn(ROWS, DIM, generator=g)
    labels = torch.randint(0, CLASSES, (ROWS,), generator=g)
    labels[torch.rand(ROWS, generator=g) < 0.55] = CLASSES  # "no object"
    boxes = torch.rand(ROWS, 4, generator=g)
    return TensorDataset(x, labels, boxes)


def criterion(logits, boxes, labels, tgt_boxes, num_boxes: float) -> torch.Tensor:
    loss = F.cross_entropy(logits, labels)
    if boxes is not None:
        loss = loss + BOX_COEF * F.l1_loss(boxes, tgt_boxes[labels != CLASSES], reduction="none").sum() / num_boxes
    return loss


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP(find_unused_parameters=True), DistributedSampler, DETR's num_boxes."""
    model = DDP(Detr(), find_unused_parameters=True)
    lr = LR * world_size if bug == "lr_scaled_world" else LR
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    data = dataset()
    local = GLOBAL_BATCH // world_size
    if bug == "no_dist_sampler":
        sampler = RandomSampler(data, generator=gen(0))
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=local, sampler=sampler, drop_last=True)
    it = 0
    for epoch in range(EPOCHS):
        if bug == "no_dist_sampler":
            sampler.generator.manual_seed(epoch)
        elif bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        for x, labels, tgt_boxes in loader:
            fg = labels != CLASSES
            num = torch.tensor(float(fg.sum()))
            if bug != "numboxes_local":
                tdist.all_reduce(num)
            num = torch.clamp(num, min=1)
            if bug not in ("numboxes_local", "numboxes_no_world_div"):
                num = num / world_size
            num_boxes = num.item()
            if bug != "zero_grad_interval" or it % 2 == 0:
                opt.zero_grad()
            logits, boxes = model(x, fg)
            loss = criterion(logits, boxes, labels, tgt_boxes, num_boxes)
            loss.backward()
            if bug == "clip_rank0_only":
                if rank() == 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            it += 1


def reference(world_size: int) -> None:
    """One device: the ranks' rows of each step together, num_boxes over all of them."""
    model = Detr()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    data = dataset()
    local = GLOBAL_BATCH // world_size
    for epoch in range(EPOCHS):
        per_rank = []
        for r in range(world_size):
            s = DistributedSampler(data, num_replicas=world_size, rank=r, shuffle=True, seed=0)
            s.set_epoch(epoch)
            per_rank.append(list(s))
        for i in range(len(per_rank[0]) // local):
            idx = [j for r in range(world_size) for j in per_rank[r][i * local:(i + 1) * local]]
            x, labels, tgt_boxes = data[idx]
            fg = labels != CLASSES
            num_boxes = max(float(fg.sum()), 1.0)
            opt.zero_grad()
            logits, boxes = model(x, fg)
            criterion(logits, boxes, labels, tgt_boxes, num_boxes).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
