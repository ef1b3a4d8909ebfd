"""A CLIP-style two-tower model under DDP with a contrastive loss over features all-gathered across
ranks (``torch.distributed.nn.functional.all_gather``, which carries gradients back to their rank).

Follows mlfoundations/open_clip ``src/open_clip/loss.py`` (``gather_features``: with
``gather_with_grad`` ``torch.cat(torch.distributed.nn.all_gather(image_features), dim=0)``, else
``dist.all_gather`` into ``gathered_image_features`` with the local slice put back
(``gathered_image_features[rank] = image_features``) unless ``local_loss``; ``ClipLoss``:
``logits_per_image = logit_scale * image_features @ all_text_features.T`` when ``local_loss``,
``labels = torch.arange(num_logits) + num_logits * self.rank``, ``(F.cross_entropy(logits_per_image,
labels) + F.cross_entropy(logits_per_text, labels)) / 2``), ``src/open_clip/model.py`` (features
``F.normalize``-d, ``logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))``, used as
``logit_scale.exp()``), ``src/training/main.py`` (no weight decay for ``p.ndim < 2 or "bn" in n or
"ln" in n or "bias" in n or "logit_scale" in n``; ``total_steps = (data["train"].dataloader.num_batches
// args.accum_freq) * args.epochs``) and ``src/training/scheduler.py`` (``cosine_lr`` with warm-up,
``assign_learning_rate`` per step). SGD with momentum stands for AdamW so that a gradient's scale
shows in the update. Variants: ``local_loss=True`` (default) and ``local_loss=False`` (every rank the
whole N x N loss), both with ``gather_with_grad=True``.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as tdist
import torch.distributed.nn.functional as dnnf
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import block, gen, rank

IMG, TXT, HID, EMB, GLOBAL_BATCH, EPOCHS = 12, 10, 24, 8, 16, 1
LR, MOMENTUM, WD, WARMUP = 0.5, 0.9, 0.05, 2
STEPS = 5
CORRECT = {"default": (2, 4), "global_loss": (2,)}
BUGS = {
    "gather_no_grad": "features gathered with dist.all_gather under no_grad (MoCo's concat_all_gather), local slice not put back",
    "nograd_global_loss": "open_clip's default gather_with_grad=False, local_loss=False: only the local slice carries gradient",
    "labels_no_offset": "local_loss labels torch.arange(n) without the + n * rank offset",
    "no_gather": "the contrastive loss over the local batch only (no all_gather of the features)",
    "logit_scale_not_optimized": "the optimizer's param groups built from the two towers only: logit_scale never stepped",
    "loss_div_world": "the local loss divided by the world size before backward ('each rank holds 1/W of the rows')",
    "total_steps_per_rank_batch": "total_steps for the cosine schedule counted with the per-rank batch over the whole data set",
}


class Clip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(IMG, HID), nn.GELU(), nn.Linear(HID, EMB))
        self.text = nn.Sequential(nn.Linear(TXT, HID), nn.GELU(), nn.Linear(HID, EMB))
        self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))

    def forward(self, image, text):
        return (F.normalize(self.visual(image), dim=-1), F.normalize(self.text(text), dim=-1),
                self.logit_scale.exp())


def pairs(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A global batch of paired rows: the text is a noisy linear view of the image."""
    g = gen(100 + step)
    img = torch.randn(GLOBAL_BATCH, IMG, generator=g)
    mix = torch.randn(IMG, TXT, generator=gen(7)) / math.sqrt(IMG)
    return img, img @ mix + 0.3 * torch.randn(GLOBAL_BATCH, TXT, generator=g)


def param_groups(model: nn.Module) -> list[dict]:
    exclude = lambda n, p: p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n  # noqa: E731
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if exclude(n, p)], "weight_decay": 0.0},
            {"params": [p for n, p in named if not exclude(n, p)], "weight_decay": WD}]


def cosine_lr(step: int, total_steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    e, es = step - WARMUP, total_steps - WARMUP
    return 0.5 * (1 + math.cos(math.pi * e / es)) * LR


def clip_loss(img_f, txt_f, all_img, all_txt, scale, labels) -> torch.Tensor:
    logits_per_image = scale * img_f @ all_txt.T
    logits_per_text = scale * txt_f @ all_img.T
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP over the two towers, features gathered, open_clip's ClipLoss."""
    model = DDP(Clip())
    if bug == "logit_scale_not_optimized":
        towers = nn.ModuleDict({"visual": model.module.visual, "text": model.module.text})
        opt = torch.optim.SGD(param_groups(towers), lr=LR, momentum=MOMENTUM)
    else:
        opt = torch.optim.SGD(param_groups(model), lr=LR, momentum=MOMENTUM)
    r = rank()
    local = GLOBAL_BATCH // world_size
    num_batches = STEPS if bug != "total_steps_per_rank_batch" else STEPS * GLOBAL_BATCH // local
    total_steps = num_batches * EPOCHS
    local_loss = variant != "global_loss" and bug != "nograd_global_loss"
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, total_steps)
        img, txt = (block(t, r, world_size) for t in pairs(step))
        img_f, txt_f, scale = model(img, txt)
        if bug == "no_gather":
            all_img, all_txt = img_f, txt_f
        elif bug in ("gather_no_grad", "nograd_global_loss"):
            gi = [torch.zeros_like(img_f) for _ in range(world_size)]
            gt = [torch.zeros_like(txt_f) for _ in range(world_size)]
            tdist.all_gather(gi, img_f.detach())
            tdist.all_gather(gt, txt_f.detach())
            if bug == "nograd_global_loss":
                gi[r], gt[r] = img_f, txt_f
            all_img, all_txt = torch.cat(gi), torch.cat(gt)
        else:
            gi, gt = list(dnnf.all_gather(img_f)), list(dnnf.all_gather(txt_f))
            all_img, all_txt = torch.cat(gi), torch.cat(gt)
        if bug == "no_gather":
            labels = torch.arange(local)
            loss = clip_loss(img_f, txt_f, all_img, all_txt, scale, labels)
        elif local_loss:
            labels = torch.arange(local) if bug == "labels_no_offset" else torch.arange(local) + local * r
            loss = clip_loss(img_f, txt_f, all_img, all_txt, scale, labels)
        else:
            loss = clip_loss(all_img, all_txt, all_img, all_txt, scale, torch.arange(GLOBAL_BATCH))
        if bug == "loss_div_world":
            loss = loss / world_size
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the whole global batch's N x N contrastive loss."""
    model = Clip()
    opt = torch.optim.SGD(param_groups(model), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, STEPS * EPOCHS)
        img, txt = pairs(step)
        img_f, txt_f, scale = model(img, txt)
        loss = clip_loss(img_f, txt_f, img_f, txt_f, scale, torch.arange(GLOBAL_BATCH))
        opt.zero_grad()
        loss.backward()
        opt.step()
