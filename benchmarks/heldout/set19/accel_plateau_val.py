"""Hugging Face accelerate with validation inside the training loop and ``ReduceLROnPlateau``: an MLP
classifier (LayerNorm, GELU, dropout whose masks are drawn for the global micro-batch), trained with
``Accelerator(gradient_accumulation_steps=2)``: ``with accelerator.accumulate(model)``, ``accelerator.backward
(loss)``, ``accelerator.clip_grad_norm_`` when ``accelerator.sync_gradients``, ``optimizer.step()`` /
``optimizer.zero_grad()`` every micro-batch (no-ops until the update). Every ``VAL_EVERY`` completed updates
a validation pass: ``model.eval()``, ``torch.no_grad()``, per-sample losses of the prepared validation
loader gathered with ``accelerator.gather_for_metrics`` (which drops the samples the last batch was padded
with, ``even_batches``), their mean, ``model.train()`` again, and ``scheduler.step(val_loss)`` on a
``ReduceLROnPlateau(mode="min", patience=0, threshold=0.1)`` that is not passed to ``prepare`` (so it
steps once per call). AdamW. The prepared training loader gives each process every W-th batch: its rows
of the global micro-batch. The validation set has 10 rows (the first two mislabelled, so the validation
loss turns up as the model learns) in batches of 3: at 2 ranks the last batch is padded with rows 0 and 1.
The dropout module is handed masks for the validation batches too (unused in eval mode, so that a
validation pass left in train mode is deterministic).

The one-device reference: micro-batches of BATCH x W rows, the same accumulation (loss / 2), clip,
validation over the whole validation set and plateau schedule.

Follows huggingface/accelerate ``examples/by_feature/gradient_accumulation.py`` (``accelerator.accumulate``,
the evaluation loop with ``model.eval()`` / ``torch.no_grad()`` / ``accelerator.gather_for_metrics``),
``examples/by_feature/checkpointing.py`` and ``examples/complete_nlp_example.py`` (evaluation inside the
training loop, ``completed_steps``), ``src/accelerate/scheduler.py`` (``AcceleratedScheduler.step`` steps
the wrapped scheduler ``num_processes`` times per call without ``split_batches``), the accelerate docs
"Gradient accumulation" (``clip_grad_norm_`` under ``sync_gradients``) and the ``ReduceLROnPlateau`` docs
(``scheduler.step(val_loss)``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .common import MaskDropout, gen, rank, torchrun_env

DI, H, C, BATCH, VBATCH, NV, ACC, SEED = 10, 32, 4, 4, 3, 10, 2, 1905
LR, MAX_NORM, P, VAL_EVERY, FACTOR, THRESHOLD = 0.02, 1.0, 0.2, 2, 0.5, 0.1
UPDATES = 8
STEPS = UPDATES
CORRECT = {"default": (2, 4)}
BUGS = {
    "val_in_train_mode": "model.eval() is missing before the validation pass: the validation loss is computed with dropout active, so the plateau scheduler sees a noisy, inflated loss",
    "train_mode_not_restored": "model.train() is not called after the validation pass: training continues in eval mode, without dropout",
    "val_loss_not_gathered": "the plateau scheduler is stepped with the rank's own validation loss (no gather): the ranks lower their learning rates at different times",
    "gather_counts_padding": "accelerator.gather is used instead of gather_for_metrics: the duplicated samples that pad the last validation batch are counted in the validation loss",
    "plateau_scheduler_prepared": "ReduceLROnPlateau is passed to accelerator.prepare: the AcceleratedScheduler steps it num_processes times per call, so patience runs out W times faster",
    "plateau_mode_max": "ReduceLROnPlateau(mode='max') on a loss: the learning rate is cut when the validation loss improves and kept when it gets worse",
    "val_every_micro_batch_count": "validation (and the plateau step) is triggered on the micro-batch counter instead of the completed-update counter: it runs every update instead of every VAL_EVERY updates",
}


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, H), nn.LayerNorm(H), nn.GELU(), MaskDropout(P), nn.Linear(H, H), nn.GELU(),
                         nn.Linear(H, C))


def prototypes():
    return torch.randn(C, DI, generator=gen(SEED - 1)) * 1.2


def train_set(w: int) -> TensorDataset:
    n = UPDATES * ACC * BATCH * w
    g = gen(SEED)
    y = torch.randint(0, C, (n,), generator=g)
    return TensorDataset(prototypes()[y] + torch.randn(n, DI, generator=g), y)


def val_set() -> TensorDataset:
    g = gen(SEED + 1)
    y = torch.randint(0, C, (NV,), generator=g)
    x = prototypes()[y] + 1.2 * torch.randn(NV, DI, generator=g)
    y[:2] = (y[:2] + 1) % C          # the first rows mislabelled: their loss grows as the model learns
    return TensorDataset(x, y)


def masks(micro: int, w: int):
    return (torch.rand(BATCH * w, H, generator=gen(SEED + 10 + micro)) > P).float()


def val_masks(update: int, j: int, r: int, n: int):
    """Dropout masks for a validation batch (unused in eval mode, as they should be)."""
    return (torch.rand(n, H, generator=gen(SEED + 500 + 100 * update + 10 * j + r)) > P).float()


def plateau(opt, bug=None):
    return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max" if bug == "plateau_mode_max" else "min",
                                                      factor=FACTOR, patience=0, threshold=THRESHOLD)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the accelerate loop with in-loop validation."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    torchrun_env()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACC)
    net = make_model()
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    sched = plateau(opt, bug)
    loader = DataLoader(train_set(world_size), batch_size=BATCH, shuffle=False)
    val_loader = DataLoader(val_set(), batch_size=VBATCH, shuffle=False)
    if bug == "plateau_scheduler_prepared":
        model, opt, loader, val_loader, sched = accelerator.prepare(net, opt, loader, val_loader, sched)
    else:
        model, opt, loader, val_loader = accelerator.prepare(net, opt, loader, val_loader)
    r = rank()
    model.train()
    completed = 0
    for micro, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            net[3].mask = masks(micro, world_size)[r * BATCH:(r + 1) * BATCH]
            loss = F.cross_entropy(model(x), y)
            net[3].mask = None
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            completed += 1
        counter = (micro + 1) if bug == "val_every_micro_batch_count" else completed
        due = counter % VAL_EVERY == 0 and (accelerator.sync_gradients or bug == "val_every_micro_batch_count")
        if due and completed > 0:
            if bug != "val_in_train_mode":
                model.eval()
            losses = []
            with torch.no_grad():
                for j, (vx, vy) in enumerate(val_loader):
                    net[3].mask = val_masks(completed, j, r, len(vx))   # used only if left in train mode
                    vl = F.cross_entropy(model(vx), vy, reduction="none")
                    net[3].mask = None
                    if bug == "val_loss_not_gathered":
                        losses.append(vl)
                    elif bug == "gather_counts_padding":
                        losses.append(accelerator.gather(vl))
                    else:
                        losses.append(accelerator.gather_for_metrics(vl))
            val_loss = torch.cat(losses).mean()
            if bug != "train_mode_not_restored":
                model.train()
            sched.step(val_loss.item())
        if completed == UPDATES:
            break


def reference(world_size: int) -> None:
    """One device: micro-batches of BATCH x W rows, the same accumulation, clip, validation and plateau."""
    w = world_size
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = plateau(opt)
    loader = DataLoader(train_set(w), batch_size=BATCH * w, shuffle=False)
    vx, vy = val_set().tensors
    model.train()
    completed = 0
    for micro, (x, y) in enumerate(loader):
        model[3].mask = masks(micro, w)
        (F.cross_entropy(model(x), y) / ACC).backward()
        model[3].mask = None
        if (micro + 1) % ACC:
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        completed += 1
        if completed % VAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                val_loss = F.cross_entropy(model(vx), vy)
            model.train()
            sched.step(val_loss.item())
        if completed == UPDATES:
            break
