"""ViT fine-tuning with layer-wise lr decay under DDP: a tiny ViT (patch embedding, cls token, learned
position embedding, two pre-norm blocks, final norm, linear head), AdamW over MAE / BEiT parameter groups
(``param_groups_lrd``: layer id 0 for cls_token / pos_embed / patch_embed, i + 1 for block i, the top for
the rest; lr scale ``layer_decay ** (num_layers - layer_id)``; no weight decay on 1-D parameters and on
cls_token / pos_embed), built from the unwrapped model's parameter names; the learning rate set every
iteration (``adjust_learning_rate``: linear warmup over ``WARMUP_EPOCHS`` measured in fractional epochs
``epoch + it / iters_per_epoch``, then a half cosine to ``MIN_LR``), times each group's ``lr_scale``; the
base lr scaled by the effective (global) batch size (``blr * eff_batch_size / 256``). Label-smoothed
cross entropy, equal rows per rank. Variant ``lambdalr``: the same schedule as a ``LambdaLR`` whose
initial lrs are ``lr * lr_scale`` per group, stepped after each optimizer step.

The one-device reference trains on the global batch with the same groups and schedule.

Follows facebookresearch/mae ``util/lr_decay.py`` (``param_groups_lrd``, ``get_layer_id_for_vit``),
``util/lr_sched.py`` (``adjust_learning_rate``: ``if "lr_scale" in param_group: param_group["lr"] = lr *
param_group["lr_scale"]``), ``main_finetune.py`` (``eff_batch_size = args.batch_size * args.accum_iter *
misc.get_world_size()``, ``args.lr = args.blr * eff_batch_size / 256``, groups built from
``model_without_ddp``) and ``engine_finetune.py`` (lr adjusted per iteration with ``data_iter_step /
len(data_loader) + epoch``); microsoft/unilm ``beit/optim_factory.py`` (``LayerDecayValueAssigner``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

D, C, IMG, P, DEPTH, GB, N, SEED = 16, 4, 8, 4, 2, 8, 24, 61
BLR, MIN_LR, LAYER_DECAY, WD, EPOCHS, WARMUP_EPOCHS = 0.32, 1e-5, 0.65, 0.3, 2, 1
ITERS = N // GB          # iterations per epoch of the global batch
STEPS = EPOCHS * ITERS
CORRECT = {"default": (2, 4), "lambdalr": (2,)}
BUGS = {
    "lr_per_epoch": "the lr is adjusted once per epoch (integer epoch) instead of every iteration: no warmup steps inside the epoch",
    "iters_per_epoch_local": "the fractional epoch uses len(dataset) / local batch iterations per epoch: warmup W times too long",
    "layer_decay_reversed": "the layer scales are reversed (layer_decay ** layer_id): the head gets the smallest lr, the embedding the largest",
    "groups_from_ddp_names": "param_groups_lrd is built from the DDP-wrapped model ('module.' names): every parameter in the top group, cls/pos decayed",
    "decay_on_norm_bias": "weight decay applied to every parameter, the norms' and biases' included",
    "lr_scale_ignored": "the per-iteration lr is written to every group without multiplying by its lr_scale",
    "lr_local_batch": "the base lr is scaled by the rank's batch size (blr * local_batch / 256), not the effective global batch",
    "sched_before_step": "LambdaLR stepped before optimizer.step(): every iteration uses the next iteration's lr",
}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 2, bias=False, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        n = (IMG // P) ** 2
        self.patch_embed = nn.Conv2d(2, D, P, stride=P)
        self.cls_token = nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, D) * 0.02)
        self.blocks = nn.ModuleList([Block() for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, C)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def layer_id(name, num_layers):
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed"):
        return 0
    if name.startswith("blocks"):
        return int(name.split(".")[1]) + 1
    return num_layers


def param_groups_lrd(model, bug=None):
    num_layers = DEPTH + 1
    if bug == "layer_decay_reversed":
        scales = [LAYER_DECAY ** i for i in range(num_layers + 1)]
    else:
        scales = [LAYER_DECAY ** (num_layers - i) for i in range(num_layers + 1)]
    groups: dict[str, dict] = {}
    for n, p in model.named_parameters():
        no_decay = (p.ndim == 1 or n in ("cls_token", "pos_embed")) and bug != "decay_on_norm_bias"
        lid = layer_id(n, num_layers)
        key = f"layer_{lid}_{'no_decay' if no_decay else 'decay'}"
        groups.setdefault(key, {"lr_scale": scales[lid], "weight_decay": 0.0 if no_decay else WD, "params": []})
        groups[key]["params"].append(p)
    return list(groups.values())


def lr_factor(epoch):
    """The schedule's lr over the peak lr at a fractional epoch."""
    if epoch < WARMUP_EPOCHS:
        return epoch / WARMUP_EPOCHS
    t = (epoch - WARMUP_EPOCHS) / (EPOCHS - WARMUP_EPOCHS)
    return (MIN_LR + (1.0 - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * t)))


def data():
    g = gen(SEED)
    x = torch.randn(N, 2, IMG, IMG, generator=g)
    y = (x[:, 0, :4].mean((1, 2)) > 0).long() * 2 + (x[:, 1, 4:].mean((1, 2)) > 0).long()
    return x, y


def build(world_size, bug=None):
    torch.manual_seed(SEED)
    model = ViT()
    ddp = DDP(model) if world_size else None
    groups = param_groups_lrd(ddp if bug == "groups_from_ddp_names" else model, bug)
    batch = GB // world_size if bug == "lr_local_batch" else GB
    lr = BLR * batch / 256
    return model, ddp, torch.optim.AdamW(groups, lr=lr), lr


def set_lr(opt, lr, bug=None):
    for g in opt.param_groups:
        g["lr"] = lr if bug == "lr_scale_ignored" else lr * g["lr_scale"]


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its rows of each global batch; lr per iteration from the global schedule."""
    r, lb = rank(), GB // world_size
    model, ddp, opt, lr = build(world_size, bug)
    x, y = data()
    lam = variant == "lambdalr" or bug == "sched_before_step"
    if lam:
        set_lr(opt, lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: lr_factor(it / ITERS))
    iters = N // lb if bug == "iters_per_epoch_local" else ITERS
    for step in range(STEPS):
        ep, it = divmod(step, ITERS)
        if not lam:
            set_lr(opt, lr * lr_factor(ep if bug == "lr_per_epoch" else ep + it / iters), bug)
        rows = slice(it * GB + r * lb, it * GB + (r + 1) * lb)
        loss = F.cross_entropy(ddp(x[rows]), y[rows], label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        if bug == "sched_before_step":
            sched.step()
        opt.step()
        if lam and bug != "sched_before_step":
            sched.step()


def reference(world_size: int) -> None:
    """One device: the global batch, the same groups and the lr set every iteration."""
    model, _, opt, lr = build(0)
    x, y = data()
    for step in range(STEPS):
        ep, it = divmod(step, ITERS)
        set_lr(opt, lr * lr_factor(ep + it / ITERS))
        rows = slice(it * GB, (it + 1) * GB)
        loss = F.cross_entropy(model(x[rows]), y[rows], label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
