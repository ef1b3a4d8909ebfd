"""Lightning Fabric (``strategy="ddp"``) training a timm ResMLP (``MlpMixer`` with ``ResBlock`` and ``Affine``, as ``resmlp_12_224``) built from its class (no download),
with timm's optimizer factory (SGD nesterov, no weight decay on biases and norms), timm's
``CosineLRScheduler`` with a linear warm-up counted in UPDATES (``t_in_epochs=False``,
``step_update(num_updates)`` after each optimizer step), gradient accumulation over 2 micro-batches
with ``fabric.no_backward_sync`` on the micro-batches that only accumulate, the loss divided by the
accumulation, ``fabric.clip_gradients`` before each step, the lr scaled with the GLOBAL batch (timm:
``lr = lr_base * global_batch / 256``, the global batch counting ranks and accumulation) and a
validation pass every 2 updates, right after the step (``model.eval()``, ``torch.no_grad()``, the loss
averaged with ``fabric.all_reduce``, ``optimizer.zero_grad(set_to_none=True)`` first to free memory,
``model.train()`` after). Each rank reads its block of each global micro-batch.

Follows huggingface/pytorch-image-models ``train.py`` (``train_one_epoch``: ``need_update``,
``num_updates``, ``lr_scheduler.step_update(num_updates=num_updates)``; the lr from the global batch;
``validate``), ``timm/scheduler/cosine_lr.py`` / ``scheduler.py`` (``step`` vs ``step_update``,
``t_in_epochs``), ``timm/optim/_optim_factory.py`` (``create_optimizer_v2``) and the Lightning Fabric
docs "Efficient Gradient Accumulation" (``fabric.no_backward_sync(model, enabled=is_accumulating)``)
and "Gradient clipping" (``fabric.clip_gradients``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import gen, rank, torchrun_env

IMG, CLASSES, BATCH, ACC, VAL_EVERY = 8, 4, 4, 2, 2
LR_BASE, WD, MAX_NORM, WARM, TOTAL, WARM_LR, SEED = 3.2, 0.05, 0.4, 3, 8, 0.02, 51
STEPS = 4  # optimizer steps (updates)
CORRECT = {"default": (2,)}
BUGS = {
    "step_update_micro": "scheduler.step_update() given the micro-batch count, not the update count (warm-up 2x fast)",
    "sched_step_epoch": "scheduler.step(num_updates) instead of step_update(): with t_in_epochs=False the lr never leaves warm-up start",
    "accum_sync_first": "no_backward_sync enabled on the LAST micro-batch of each update instead of the first (off by one)",
    "loss_not_div_accum": "the micro-batch loss not divided by the accumulation steps",
    "clip_per_micro": "fabric.clip_gradients called after every micro-batch's backward, not once before the step",
    "lr_local_batch": "the lr scaled with the per-rank batch (batch x accumulation), not the global batch",
    "val_mid_accum": "validation keyed on the micro-batch count: it lands mid-accumulation and its zero_grad wipes a micro-batch",
}


def make_model() -> torch.nn.Module:
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock
    return MlpMixer(num_classes=CLASSES, img_size=IMG, in_chans=3, patch_size=4, num_blocks=1, embed_dim=16,
                    mlp_ratio=4, block_layer=ResBlock, norm_layer=Affine)  # timm's resmlp_12_224, shrunk


def make_opt(model, global_batch: int):
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler
    opt = create_optimizer_v2(model, "sgd", lr=LR_BASE * global_batch / 256, momentum=0.9, weight_decay=WD)
    sched = CosineLRScheduler(opt, t_initial=TOTAL, warmup_t=WARM, warmup_lr_init=WARM_LR, t_in_epochs=False)
    return opt, sched


def micro_batch(i: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(1100 + i)
    return torch.randn(BATCH * w, 3, IMG, IMG, generator=g), torch.randint(0, CLASSES, (BATCH * w,), generator=g)


VAL = (torch.randn(16, 3, IMG, IMG, generator=gen(1099)), torch.randint(0, CLASSES, (16,), generator=gen(1098)))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Fabric DDP, its block of every global micro-batch."""
    import lightning as L

    torchrun_env()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=world_size)
    fabric.launch()
    r, w = fabric.global_rank, fabric.world_size
    torch.manual_seed(SEED)
    model = make_model()
    opt, sched = make_opt(model, BATCH * ACC * (1 if bug == "lr_local_batch" else w))
    model, opt = fabric.setup(model, opt)

    def validate():
        opt.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            x, y = VAL[0].chunk(w)[r], VAL[1].chunk(w)[r]
            fabric.all_reduce(F.cross_entropy(model(x), y), reduce_op="mean")
        model.train()

    model.train()
    updates = 0
    for i in range(STEPS * ACC):
        x, y = micro_batch(i, w)
        x, y = x.chunk(w)[r], y.chunk(w)[r]
        last = (i + 1) % ACC == 0
        accumulating = (i % ACC != 0) if bug == "accum_sync_first" else not last
        with fabric.no_backward_sync(model, enabled=accumulating):
            loss = F.cross_entropy(model(x), y)
            fabric.backward(loss if bug == "loss_not_div_accum" else loss / ACC)
        if bug == "clip_per_micro" and not last:
            fabric.clip_gradients(model, opt, max_norm=MAX_NORM)
        if last:
            fabric.clip_gradients(model, opt, max_norm=MAX_NORM)
            opt.step()
            opt.zero_grad()
            updates += 1
            if bug == "sched_step_epoch":
                sched.step(updates)
            else:
                sched.step_update(i + 1 if bug == "step_update_micro" else updates)
        if bug == "val_mid_accum":
            if (i + 2) % (VAL_EVERY * ACC) == 0:
                validate()
        elif last and updates % VAL_EVERY == 0:
            validate()


def reference(world_size: int) -> None:
    """One device: the global micro-batches, the same accumulation, clip, schedule."""
    w = world_size
    torch.manual_seed(SEED)
    model = make_model()
    opt, sched = make_opt(model, BATCH * ACC * w)
    model.train()
    updates = 0
    for i in range(STEPS * ACC):
        x, y = micro_batch(i, w)
        (F.cross_entropy(model(x), y) / ACC).backward()
        if (i + 1) % ACC == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad()
            updates += 1
            sched.step_update(updates)
