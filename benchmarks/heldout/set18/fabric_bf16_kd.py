"""Knowledge distillation with Lightning Fabric: ``L.Fabric(strategy="ddp", precision="bf16-mixed")`` on
CPU (the student's forward runs under ``torch.autocast("cpu", torch.bfloat16)``), a frozen teacher with
batch norm kept in ``eval()`` and run under ``fabric.autocast()`` and ``torch.no_grad()``, 2 micro-batches
per update (``fabric.no_backward_sync(model, enabled=not is_last)``, ``fabric.backward(loss / ACC)``),
SGD momentum and ``transformers.get_cosine_schedule_with_warmup`` (2 warm-up updates) stepped once per
update. The loss is Hinton's: ``(1 - ALPHA) * CE(student, y, label_smoothing=0.1) + ALPHA * T**2 *
KL(softmax(teacher / T) || softmax(student / T))`` with ``F.kl_div(log_softmax(s / T), softmax(t / T),
reduction="batchmean")``. Every random draw is made for the global batch by a generator seeded per
update; each rank keeps its rows, split in its micro-batches.

The one-device reference runs the ranks' micro-batches one after another under the same bf16 autocast
(so the bf16 matmuls see the same shapes) and backpropagates each block's loss / (ACC * W), as DDP
averages the ranks' accumulated gradients; the loss is computed outside the autocast on float32 logits,
as Fabric's ``convert_output`` hands them back. The schedule is stepped once per update.

Follows Lightning Fabric docs ("Gradient accumulation": ``no_backward_sync``; "Mixed precision":
``precision="bf16-mixed"``, ``fabric.autocast()``), Lightning ``src/lightning/fabric/plugins/precision/
amp.py`` (``MixedPrecision.forward_context``), haitongli/knowledge-distillation-pytorch ``model/net.py``
(``loss_fn_kd``: ``nn.KLDivLoss()(F.log_softmax(outputs/T), F.softmax(teacher_outputs/T)) * (alpha * T *
T) + F.cross_entropy(outputs, labels) * (1. - alpha)``; teacher ``eval()``), the PyTorch knowledge
distillation tutorial (``beginner_source/knowledge_distillation_tutorial.py``: ``T**2``, ``batchmean``)
and transformers ``optimization.py`` (``get_cosine_schedule_with_warmup``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import gen, torchrun_env

DI, H, C, GB, ACC, SEED = 12, 32, 5, 16, 2, 1801
LR, MOMENTUM, WARMUP, T, ALPHA, LS = 0.3, 0.9, 2, 2.0, 0.7, 0.1
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "teacher_in_train_mode": "the teacher is left in train mode: its batch norm normalises each micro-batch with its own statistics (and updates its running statistics) instead of using the trained running statistics",
    "kd_missing_t_squared": "the distillation term is not multiplied by T**2: the soft-target gradients are T**2 times too small against the hard cross entropy",
    "kl_reduction_mean": "F.kl_div(..., reduction='mean') instead of 'batchmean': the KL is divided by the number of classes too",
    "teacher_not_softened": "the teacher's probabilities are softmax(teacher_logits) without dividing by the temperature T (only the student is softened)",
    "sync_on_first_micro": "no_backward_sync(model, enabled=is_last) is inverted: the gradients are all-reduced after the first micro-batch, and the last micro-batch's gradient stays local",
    "scheduler_per_micro_batch": "scheduler.step() is called after every micro-batch instead of once per update: the warm-up and cosine decay run ACC times too fast",
    "kl_args_swapped": "F.kl_div is given the teacher's log-probabilities and the student's probabilities (arguments swapped): the reverse KL, with the gradient through the target",
}


def make_student():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, H), nn.GELU(), nn.Linear(H, H), nn.GELU(), nn.Linear(H, C))


def make_teacher():
    """A teacher with batch norm whose running statistics are those of a few 'training' batches; frozen."""
    torch.manual_seed(SEED + 1)
    t = nn.Sequential(nn.Linear(DI, 48), nn.BatchNorm1d(48), nn.ReLU(), nn.Linear(48, C))
    with torch.no_grad():
        for i in range(4):
            x, _ = batch(1000 + i)
            t(x * 1.3 + 0.4)
        t[3].weight.mul_(3.0)
    t.eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t


def batch(step: int):
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x = torch.randn(GB, DI, generator=g) + F.one_hot(y, DI).float() * 1.5
    return x, y


def kd_loss(s, t, y, bug=None):
    ce = F.cross_entropy(s.float(), y, label_smoothing=LS)
    t, s = t.float(), s.float()
    p_t = F.softmax(t if bug == "teacher_not_softened" else t / T, dim=-1)
    if bug == "kl_args_swapped":
        kl = F.kl_div(F.log_softmax(t / T, dim=-1), F.softmax(s / T, dim=-1), reduction="batchmean")
    else:
        kl = F.kl_div(F.log_softmax(s / T, dim=-1), p_t, reduction="mean" if bug == "kl_reduction_mean" else "batchmean")
    return (1 - ALPHA) * ce + ALPHA * (1.0 if bug == "kd_missing_t_squared" else T * T) * kl


def make_opt(model):
    from transformers import get_cosine_schedule_with_warmup
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    return opt, get_cosine_schedule_with_warmup(opt, num_warmup_steps=WARMUP, num_training_steps=STEPS)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    import lightning as L
    torchrun_env()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=world_size, precision="bf16-mixed")
    fabric.launch()
    r, w = fabric.global_rank, fabric.world_size
    student, teacher = make_student(), make_teacher()
    if bug == "teacher_in_train_mode":
        teacher.train()
    opt, sched = make_opt(student)
    model, opt = fabric.setup(student, opt)
    lb, mb = GB // w, GB // w // ACC
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb]
        for i in range(ACC):
            last = i == ACC - 1
            xi, yi = x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]
            with fabric.no_backward_sync(model, enabled=last if bug == "sync_on_first_micro" else not last):
                with torch.no_grad(), fabric.autocast():
                    t = teacher(xi)
                loss = kd_loss(model(xi), t, yi, bug)
                fabric.backward(loss / ACC)
            if bug == "scheduler_per_micro_batch" and not last:
                sched.step()
        opt.step()
        sched.step()
        opt.zero_grad()


def reference(world_size: int) -> None:
    w = world_size
    model, teacher = make_student(), make_teacher()
    opt, sched = make_opt(model)
    lb, mb = GB // w, GB // w // ACC
    for step in range(STEPS):
        x, y = batch(step)
        for i in range(ACC):
            for r in range(w):
                xi, yi = x[r * lb + i * mb:r * lb + (i + 1) * mb], y[r * lb + i * mb:r * lb + (i + 1) * mb]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    with torch.no_grad():
                        t = teacher(xi)
                    out = model(xi)
                loss = kd_loss(out.float(), t.float(), yi)
                (loss / (ACC * w)).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
