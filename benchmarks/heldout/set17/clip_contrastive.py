"""CLIP-style contrastive training: an image tower (a tiny MLP on 12-dim "image" features) and a text tower
(token embeddings, mean-pooled over the unpadded tokens, then a linear projection), L2-normalised
embeddings, a learnable ``logit_scale`` (initialised at log(1/0.07), used as ``logit_scale.exp()``
clamped at 100), under DDP. The loss is open_clip's ``ClipLoss`` with ``local_loss=True`` and
``gather_with_grad=True``: both towers' embeddings are all-gathered with autograd
(``torch.distributed.nn.functional.all_gather``), each rank scores its own rows against every rank's
columns (``logits_per_image = scale * img_local @ all_txt.T``, ``logits_per_text = scale * txt_local @
all_img.T``) and uses ``labels = arange(local_batch) + rank * local_batch``; the loss is the mean of the
two cross entropies. DDP averages the gradients; the gather's backward sums the ranks' gradients for each
rank's rows, so the average is the gradient of the global loss. SGD with momentum (in place of AdamW, so
that the check's float32 roundoff stays small). Every random draw (features, token ids, lengths) is made
for the global batch by a generator seeded per step; each rank keeps its rows. The reference computes the
same loss over the global batch in one process (labels ``arange(global_batch)``).

Follows mlfoundations/open_clip ``src/open_clip/loss.py`` (``gather_features``, ``ClipLoss.get_logits``,
``ClipLoss.get_ground_truth`` with ``labels + num_logits * rank`` when ``local_loss``),
``src/open_clip/model.py`` (``CLIP.encode_image`` / ``encode_text`` with ``F.normalize``,
``logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))``) and ``src/open_clip_train/train.py``
(``logit_scale.clamp_(0, math.log(100))`` after the step).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather_grad, all_gather_plain, gen, rank

GB, DI, V, L, D, SEED = 8, 12, 20, 6, 8, 1701
LR, MOMENTUM = 0.2, 0.9
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "gather_without_grad": "the embeddings are all-gathered without autograd (open_clip gather_with_grad=False: torch.distributed.all_gather, the local rows put back): the other ranks' rows get no gradient from this rank's loss",
    "labels_not_offset_by_rank": "the contrastive labels are arange(local_batch) on every rank, not offset by rank * local_batch: ranks > 0 pair each row with the wrong column",
    "local_negatives_only": "the embeddings are not all-gathered at all: each rank contrasts its rows against its own local batch only (fewer negatives)",
    "logit_scale_not_exponentiated": "the logits are multiplied by logit_scale itself instead of logit_scale.exp()",
    "image_to_text_only": "only the image-to-text cross entropy is used; the text-to-image term of the symmetric loss is missing",
    "features_not_normalized": "the image and text embeddings are not L2-normalised before the dot products",
    "loss_times_world_size": "the loss is multiplied by the world size (to 'undo' DDP's averaging): gradients W times too large",
}


class Clip(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(DI, 16), nn.GELU(), nn.Linear(16, D))
        self.token_embedding = nn.Embedding(V, 16)
        self.text_projection = nn.Linear(16, D, bias=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def forward(self, img, tok, mask, bug=None):
        fi = self.visual(img)
        e = self.token_embedding(tok) * mask[..., None]
        ft = self.text_projection(e.sum(1) / mask.sum(1, keepdim=True))
        if bug != "features_not_normalized":
            fi, ft = F.normalize(fi, dim=-1), F.normalize(ft, dim=-1)
        return fi, ft, self.logit_scale


def make_model():
    torch.manual_seed(SEED)
    return Clip()


def batch(step: int):
    g = gen(SEED + step)
    cls = torch.randint(0, 4, (GB,), generator=g)
    img = torch.randn(GB, DI, generator=g) + F.one_hot(cls, DI).float() * 2.0
    tok = torch.randint(2, V, (GB, L), generator=g)
    tok[:, 0] = cls + 2
    lens = torch.randint(2, L + 1, (GB,), generator=g)
    mask = (torch.arange(L)[None] < lens[:, None]).float()
    return img, tok * mask.long(), mask


def clip_loss(fi, ft, scale_param, labels, all_i, all_t, bug=None):
    scale = (scale_param if bug == "logit_scale_not_exponentiated" else scale_param.exp()).clamp(max=100)
    lpi = scale * fi @ all_t.T
    lpt = scale * ft @ all_i.T
    if bug == "image_to_text_only":
        return F.cross_entropy(lpi, labels)
    return (F.cross_entropy(lpi, labels) + F.cross_entropy(lpt, labels)) / 2


def after_step(model):
    with torch.no_grad():
        model.logit_scale.clamp_(0, math.log(100))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    lb = GB // w
    for step in range(STEPS):
        img, tok, mask = (t[r * lb:(r + 1) * lb] for t in batch(step))
        fi, ft, s = ddp(img, tok, mask, bug)
        if bug == "local_negatives_only":
            all_i, all_t = fi, ft
        elif bug == "gather_without_grad":
            all_i, all_t = all_gather_plain(fi), all_gather_plain(ft)
            # open_clip's gather_with_grad=False path: the local rows put back with their gradient
            all_i = torch.cat([all_i[:r * lb], fi, all_i[(r + 1) * lb:]])
            all_t = torch.cat([all_t[:r * lb], ft, all_t[(r + 1) * lb:]])
        else:
            all_i, all_t = all_gather_grad(fi), all_gather_grad(ft)
        labels = torch.arange(lb)
        if bug not in ("labels_not_offset_by_rank", "local_negatives_only"):
            labels = labels + r * lb
        loss = clip_loss(fi, ft, s, labels, all_i, all_t, bug)
        if bug == "loss_times_world_size":
            loss = loss * w
        opt.zero_grad()
        loss.backward()
        opt.step()
        after_step(model)


def reference(world_size: int) -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        img, tok, mask = batch(step)
        fi, ft, s = model(img, tok, mask)
        loss = clip_loss(fi, ft, s, torch.arange(GB), fi, ft)
        opt.zero_grad()
        loss.backward()
        opt.step()
        after_step(model)
