"""A tiny timm ``VisionTransformer`` (8x8 images, 4x4 patches, one block) built from its class under DDP,
trained with timm's ``LabelSmoothingCrossEntropy(0.1)`` plus self-distillation from an EMA of its own
weights (``timm.utils.ModelEmaV3(decay=0.9, use_warmup=True)`` made before the DDP wrap, updated after
every optimizer step with ``model_ema.update(model, step=num_updates)``; the distillation term is
``T**2 * KL(student || teacher)`` at temperature 2 with ``reduction="batchmean"``), SGD with momentum,
timm's ``CosineLRScheduler(t_initial=total updates, warmup_t=2, t_in_epochs=False)`` stepped with
``step_update(num_updates)`` after every update (and ``step(epoch + 1)`` at each epoch's end), and a
validation pass of the EMA model at the end of each epoch (the validation set in contiguous shards, the
loss sum and count all-reduced). Every random draw (images, labels) is made for the global batch by a
generator seeded per step; each rank keeps its rows. The reference runs the global batch in one forward.

Follows huggingface/pytorch-image-models ``train.py`` (``ModelEmaV3`` created before the distributed
wrap, ``num_updates += 1``, ``lr_scheduler.step_update(num_updates=num_updates)``,
``model_ema.update(model, step=num_updates)``, ``validate(model_ema, ...)`` at the epoch's end,
``updates_per_epoch`` with ``t_in_epochs=False``), ``timm/utils/model_ema.py`` (``get_decay``),
``timm/loss/cross_entropy.py`` (``LabelSmoothingCrossEntropy``), ``timm/scheduler/cosine_lr.py``, and
Hinton et al.'s distillation (``kl_div(log_softmax(s / T), softmax(t / T), "batchmean") * T**2``).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

C, GB, NV, SEED = 5, 8, 8, 1644
LR, MOMENTUM, T, LAMBDA, EPOCHS, PER_EPOCH = 0.1, 0.9, 2.0, 1.0, 2, 3
STEPS = EPOCHS * PER_EPOCH
CORRECT = {"default": (2, 4)}
BUGS = {
    "label_smoothing_missing": "the classification loss is plain cross entropy instead of label-smoothing cross entropy (smoothing 0.1)",
    "t_initial_in_epochs": "CosineLRScheduler gets t_initial in epochs while it is stepped per update (step_update, t_in_epochs=False): the cosine ends after 2 updates and the lr sits at lr_min",
    "ema_step_in_epochs": "model_ema.update(model, step=epoch) passes the epoch instead of the update count: the EMA warm-up's decay stays 0, the EMA is a plain copy of the student",
    "ema_update_in_validation": "the validation pass updates the EMA again (model_ema.update at the epoch's end): the EMA takes two updates on those steps",
    "kl_mean_not_batchmean": "the distillation KL uses reduction='mean' (over every element) instead of 'batchmean': the term is divided by the number of classes",
    "kl_direction_reversed": "the KL arguments are swapped (the teacher's log-probabilities as input, the student's probabilities as target): the wrong divergence and gradient",
    "kl_missing_t_squared": "the distillation loss is not multiplied by T**2: the soft-target gradients are T**2 times too small",
}


def make_model():
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(SEED)
    return VisionTransformer(img_size=8, patch_size=4, in_chans=3, num_classes=C, embed_dim=16, depth=1,
                             num_heads=2, mlp_ratio=2.0)


def make_ema(model):
    from timm.utils import ModelEmaV3
    return ModelEmaV3(model, decay=0.9, use_warmup=True)


def make_sched(opt, bug=None):
    from timm.scheduler import CosineLRScheduler
    t = EPOCHS if bug == "t_initial_in_epochs" else STEPS
    return CosineLRScheduler(opt, t_initial=t, lr_min=1e-3, warmup_t=2, warmup_lr_init=0.01, t_in_epochs=False)


def batch(step: int):
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x = torch.randn(GB, 3, 8, 8, generator=g) + y[:, None, None, None].float() * 0.5
    return x, y


def val_set():
    g = gen(SEED - 1)
    y = torch.randint(0, C, (NV,), generator=g)
    return torch.randn(NV, 3, 8, 8, generator=g) + y[:, None, None, None].float() * 0.5, y


def loss_fn(logits, teacher, y, bug=None):
    from timm.loss import LabelSmoothingCrossEntropy
    ce = F.cross_entropy(logits, y) if bug == "label_smoothing_missing" else LabelSmoothingCrossEntropy(0.1)(logits, y)
    if bug == "kl_direction_reversed":
        kl = F.kl_div(F.log_softmax(teacher / T, -1), F.softmax(logits / T, -1), reduction="batchmean")
    else:
        kl = F.kl_div(F.log_softmax(logits / T, -1), F.softmax(teacher / T, -1),
                      reduction="mean" if bug == "kl_mean_not_batchmean" else "batchmean")
    return ce + LAMBDA * kl * (1.0 if bug == "kl_missing_t_squared" else T * T)


def validate(ema_model, rows):
    ema_model.eval()
    with torch.no_grad():
        return sum(F.cross_entropy(ema_model(x), y, reduction="sum") for x, y in rows), sum(len(y) for _, y in rows)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its rows of each global batch, its shard of the validation set."""
    r, w = rank(), world_size
    model = make_model()
    ema = make_ema(model)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    sched = make_sched(opt, bug)
    lb = GB // w
    xv, yv = val_set()
    shard = (xv[r * NV // w:(r + 1) * NV // w], yv[r * NV // w:(r + 1) * NV // w])
    num_updates = 0
    for epoch in range(EPOCHS):
        ddp.train()
        for i in range(PER_EPOCH):
            x, y = batch(epoch * PER_EPOCH + i)
            x, y = x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb]
            with torch.no_grad():
                teacher = ema.module(x)
            loss = loss_fn(ddp(x), teacher, y, bug)
            opt.zero_grad()
            loss.backward()
            opt.step()
            num_updates += 1
            ema.update(ddp, step=epoch if bug == "ema_step_in_epochs" else num_updates)
            sched.step_update(num_updates=num_updates)
        sched.step(epoch + 1)
        if bug == "ema_update_in_validation":
            ema.update(ddp, step=num_updates)
        s, n = validate(ema.module, [shard])
        t = torch.tensor([float(s), float(n)])
        tdist.all_reduce(t)
        val_loss = (t[0] / t[1]).item()   # logged


def reference(world_size: int) -> None:
    """One device: the global batch in one forward, the whole validation set."""
    model = make_model()
    ema = make_ema(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sched = make_sched(opt)
    num_updates = 0
    for epoch in range(EPOCHS):
        model.train()
        for i in range(PER_EPOCH):
            x, y = batch(epoch * PER_EPOCH + i)
            with torch.no_grad():
                teacher = ema.module(x)
            loss = loss_fn(model(x), teacher, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            num_updates += 1
            ema.update(model, step=num_updates)
            sched.step_update(num_updates=num_updates)
        sched.step(epoch + 1)
        s, n = validate(ema.module, [val_set()])
