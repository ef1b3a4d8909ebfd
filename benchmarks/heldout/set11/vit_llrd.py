"""ViT fine-tuning with layer-wise lr decay under DDP: a tiny timm ``VisionTransformer`` (2 blocks, cls
token, learned position embedding, no qkv bias: the key bias has no gradient, BEiT leaves it out),
parameter groups by layer id (``cls_token`` / ``pos_embed`` / ``patch_embed`` 0, block i -> i + 1, the
rest ``len(blocks) + 1``) with ``lr_scale = decay ** (num_layers - layer_id)``, no weight decay on 1-d parameters and on ``pos_embed`` / ``cls_token``, AdamW, the
absolute lr from the base lr and the effective batch (per-GPU batch x accumulation x world size) / 256,
and the per-iteration schedule (linear warm-up over the first epoch, half-cycle cosine after) evaluated
at the fractional epoch ``it / len(loader) + epoch`` and written into each group as ``lr * lr_scale``.
Cross entropy mean over the rank's rows (DDP's average is the global mean).

The one-device reference: the global batch, the same groups and lrs.

Follows facebookresearch/mae ``util/lr_decay.py`` (``param_groups_lrd``, ``get_layer_id_for_vit``),
``util/lr_sched.py`` (``adjust_learning_rate``), ``main_finetune.py`` (``eff_batch_size =
args.batch_size * args.accum_iter * misc.get_world_size()``, ``args.lr = args.blr * eff_batch_size /
256``, groups built from ``model_without_ddp``, ``no_weight_decay_list``) and ``engine_finetune.py``
(the schedule called every iteration with ``data_iter_step / len(data_loader) + epoch``); microsoft/unilm
``beit/optim_factory.py``; huggingface/pytorch-image-models ``timm/models/vision_transformer.py``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

IMG, CLASSES, N, GB, SEED = 8, 5, 32, 8, 61
BLR, DECAY, WD, EPOCHS, WARMUP = 0.32, 0.5, 0.05, 2, 1
STEPS = 8   # EPOCHS x N / GB
NO_WD = ("pos_embed", "cls_token")
CORRECT = {"default": (2, 4)}
BUGS = {
    "lr_world_missing": "the effective batch size for the lr scaling omits the world size (per-GPU batch x accumulation only)",
    "decay_reversed": "the layer scales are decay ** layer_id, so the deepest layers and the head get the smallest lr",
    "wd_on_all": "weight decay is applied to every parameter: biases, norms, pos_embed and cls_token included",
    "sched_int_epoch": "the per-iteration schedule is evaluated at the integer epoch, not it / len(loader) + epoch",
    "groups_from_ddp": "the parameter groups are built from the DDP wrapper's names ('module.' prefix): every layer id falls to the head's and pos_embed / cls_token get weight decay",
    "num_layers_off": "num_layers = len(blocks) instead of len(blocks) + 1, so every layer's lr scale is one decay factor off",
    "lr_scale_dropped": "the schedule writes the same lr into every group, dropping each group's lr_scale",
}


def net():
    return VisionTransformer(img_size=IMG, patch_size=4, in_chans=3, num_classes=CLASSES, embed_dim=16, depth=2,
                             num_heads=2, mlp_ratio=2.0, qkv_bias=False)


def layer_id(name, num_layers):
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed"):
        return 0
    if name.startswith("blocks"):
        return int(name.split(".")[1]) + 1
    return num_layers


def param_groups(named, n_blocks, bug=None):
    """MAE's ``param_groups_lrd`` over ``named`` (name, parameter) pairs."""
    num_layers = n_blocks if bug == "num_layers_off" else n_blocks + 1
    scales = [DECAY ** (i if bug == "decay_reversed" else num_layers - i) for i in range(num_layers + 1)]
    groups: dict[str, dict] = {}
    for n, p in named:
        no_decay = (p.ndim == 1 or n in NO_WD) and bug != "wd_on_all"
        lid = layer_id(n, num_layers)
        key = f"layer_{lid}_{'no_decay' if no_decay else 'decay'}"
        groups.setdefault(key, {"lr_scale": scales[lid], "weight_decay": 0.0 if no_decay else WD, "params": []})
        groups[key]["params"].append(p)
    return list(groups.values())


def adjust_lr(opt, epoch, lr, bug=None):
    if epoch < WARMUP:
        cur = lr * epoch / WARMUP
    else:
        cur = lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - WARMUP) / (EPOCHS - WARMUP)))
    for g in opt.param_groups:
        g["lr"] = cur if bug == "lr_scale_dropped" else cur * g["lr_scale"]


def data():
    g = gen(SEED)
    x = torch.randn(N, 3, IMG, IMG, generator=g)
    y = (x[:, :, :4, :4].mean((2, 3)) @ torch.randn(3, CLASSES, generator=g)).argmax(1)
    return x, y


def build(named_from=None, bug=None, eff_batch=GB):
    torch.manual_seed(SEED)
    model = net()
    groups = param_groups((named_from or model).named_parameters(), len(model.blocks), bug)
    return model, torch.optim.AdamW(groups, lr=BLR * eff_batch / 256), BLR * eff_batch / 256


def run(fwd, opt, lr, xs, ys, rows, bug=None):
    per_epoch = N // GB
    for step in range(STEPS):
        epoch, it = divmod(step, per_epoch)
        adjust_lr(opt, epoch if bug == "sched_int_epoch" else it / per_epoch + epoch, lr, bug)
        base = it * GB
        loss = F.cross_entropy(fwd(xs[base:base + GB][rows]), ys[base:base + GB][rows])
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of images, the layer-decayed groups, the per-iteration schedule."""
    r, lb = rank(), GB // world_size
    eff = lb * 1 * (1 if bug == "lr_world_missing" else world_size)
    if bug == "groups_from_ddp":
        torch.manual_seed(SEED)
        model = net()
        ddp = DDP(model)
        lr = BLR * eff / 256
        opt = torch.optim.AdamW(param_groups(ddp.named_parameters(), len(model.blocks), bug), lr=lr)
    else:
        model, opt, lr = build(None, bug, eff)
        ddp = DDP(model)
    xs, ys = data()
    run(ddp, opt, lr, xs, ys, slice(r * lb, (r + 1) * lb), bug)


def reference(world_size: int) -> None:
    """One device: the global batch."""
    model, opt, lr = build()
    xs, ys = data()
    run(model, opt, lr, xs, ys, slice(0, GB))
