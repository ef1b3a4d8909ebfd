"""A DINO student/teacher: the student under DDP, the teacher a momentum (EMA) copy, a centered and
sharpened teacher target whose center is all-reduced.

Follows facebookresearch/dino ``main_dino.py`` and ``utils.py``: ``teacher_without_ddp.load_state_dict
(student.module.state_dict())``, teacher ``requires_grad = False``; ``utils.get_params_groups``
(biases and 1-d parameters without weight decay); ``lr_schedule`` / ``wd_schedule`` /
``momentum_schedule`` (``utils.cosine_scheduler``) indexed by the global iteration ``it``, the
weight decay written into param group 0 only; ``DINOLoss`` (teacher softmax of ``(t - center) /
temp``, cross entropy over pairs of different views, ``update_center`` with ``dist.all_reduce
(batch_center)`` divided by ``len(teacher_output) * world_size``); ``utils.clip_gradients`` (per
parameter); ``utils.cancel_gradients_last_layer`` while ``epoch < freeze_last_layer``; the EMA
``param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)`` after ``optimizer.step()``. Small:
an MLP backbone, two "global crops" per image made by seeded noise, no multi-crop, no weight norm.
Variants: the loop as written; the EMA with ``torch._foreach_mul_`` / ``_foreach_add_``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..set1.common import rank

IN, HID, BOTTLENECK, OUT = 12, 24, 8, 16
BATCH, STEPS_PER_EPOCH, EPOCHS = 4, 2, 3
STEPS = STEPS_PER_EPOCH * EPOCHS
LR, MIN_LR, WD, WD_END, M0, CLIP = 0.01, 0.002, 0.04, 0.4, 0.9, 3.0
STUDENT_TEMP, TEACHER_TEMP, CENTER_M = 0.1, 0.04, 0.9
FREEZE_LAST_LAYER = 1
CORRECT = {"default": (2, 4), "foreach": (2,)}
BUGS = {
    "center_local": "update_center without the all_reduce: each rank's center from its own rows",
    "ema_rank0_only": "the teacher's momentum update inside 'if utils.is_main_process()'",
    "momentum_swapped": "EMA written param_k.mul_(1 - m).add_(m * param_q): the teacher follows the student",
    "ema_before_step": "the teacher's momentum update placed before optimizer.step()",
    "last_layer_trained": "cancel_gradients_last_layer never called: the last layer trains during the freeze epoch",
    "teacher_not_copied": "teacher built but load_state_dict(student.module.state_dict()) forgotten",
    "momentum_by_epoch": "momentum_schedule indexed by the epoch instead of the global iteration",
    "wd_all_groups": "wd_schedule written into every param group, the no-decay group included",
}


class DINOHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(HID, HID), nn.GELU(), nn.Linear(HID, BOTTLENECK))
        self.last_layer = nn.Linear(BOTTLENECK, OUT, bias=False)

    def forward(self, x):
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(IN, HID), nn.LayerNorm(HID), nn.GELU())
        self.head = DINOHead()

    def forward(self, x):
        return self.head(self.backbone(x))


class DINOLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("center", torch.zeros(1, OUT))

    def forward(self, student_output, teacher_output, distributed: bool = True):
        student_out = (student_output / STUDENT_TEMP).chunk(2)
        teacher_out = F.softmax((teacher_output - self.center) / TEACHER_TEMP, dim=-1).detach().chunk(2)
        total, n = 0, 0
        for iq, q in enumerate(teacher_out):
            for v, s in enumerate(student_out):
                if v == iq:
                    continue
                total = total + torch.sum(-q * F.log_softmax(s, dim=-1), dim=-1).mean()
                n += 1
        self.update_center(teacher_output, distributed)
        return total / n

    @torch.no_grad()
    def update_center(self, teacher_output, distributed: bool):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        if distributed:
            tdist.all_reduce(batch_center)
            batch_center = batch_center / (len(teacher_output) * tdist.get_world_size())
        else:
            batch_center = batch_center / len(teacher_output)
        self.center = self.center * CENTER_M + batch_center * (1 - CENTER_M)


def cosine_scheduler(base, final, epochs, niter_per_ep):
    iters = epochs * niter_per_ep
    return [final + 0.5 * (base - final) * (1 + math.cos(math.pi * i / iters)) for i in range(iters)]


def get_params_groups(model: nn.Module) -> list[dict]:
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (not_regularized if name.endswith(".bias") or len(param.shape) == 1 else regularized).append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def clip_gradients(model: nn.Module, clip: float) -> None:
    for _, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)


def cancel_gradients_last_layer(epoch: int, model: nn.Module, freeze_last_layer: int) -> None:
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def dataset(world_size: int) -> TensorDataset:
    """Images (feature vectors) and their two global crops, made once from a seed."""
    n = STEPS_PER_EPOCH * BATCH * world_size
    g = torch.Generator().manual_seed(2021)
    images = torch.randn(n, IN, generator=g)
    return TensorDataset(images + 0.3 * torch.randn(n, IN, generator=g), images + 0.3 * torch.randn(n, IN, generator=g))


@torch.no_grad()
def ema(student: nn.Module, teacher: nn.Module, m: float, bug: str | None, foreach: bool) -> None:
    qs, ks = list(student.parameters()), list(teacher.parameters())
    if bug == "momentum_swapped":
        for q, k in zip(qs, ks):
            k.data.mul_(1 - m).add_(m * q.detach().data)
    elif foreach:
        torch._foreach_mul_(ks, m)
        torch._foreach_add_(ks, qs, alpha=1 - m)
    else:
        for q, k in zip(qs, ks):
            k.data.mul_(m).add_((1 - m) * q.detach().data)


def _schedules(world_size: int):
    lr = cosine_scheduler(LR * (BATCH * world_size) / 8, MIN_LR, EPOCHS, STEPS_PER_EPOCH)
    return lr, cosine_scheduler(WD, WD_END, EPOCHS, STEPS_PER_EPOCH), cosine_scheduler(M0, 1.0, EPOCHS, STEPS_PER_EPOCH)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: main_dino's train_dino / train_one_epoch, in short."""
    student, teacher = Wrapper(), Wrapper()
    student = DDP(student)
    if bug != "teacher_not_copied":
        teacher.load_state_dict(student.module.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    loss_fn = DINOLoss()
    opt = torch.optim.AdamW(get_params_groups(student))
    lr_schedule, wd_schedule, momentum_schedule = _schedules(world_size)
    data = dataset(world_size)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (v1, v2) in enumerate(loader):
            it = STEPS_PER_EPOCH * epoch + i
            for j, group in enumerate(opt.param_groups):
                group["lr"] = lr_schedule[it]
                if j == 0 or bug == "wd_all_groups":
                    group["weight_decay"] = wd_schedule[it]
            images = torch.cat([v1, v2])
            teacher_output = teacher(images)
            student_output = student(images)
            loss = loss_fn(student_output, teacher_output, distributed=bug != "center_local")
            opt.zero_grad()
            loss.backward()
            clip_gradients(student, CLIP)
            if bug != "last_layer_trained":
                cancel_gradients_last_layer(epoch, student, FREEZE_LAST_LAYER)
            m = momentum_schedule[epoch if bug == "momentum_by_epoch" else it]
            if bug == "ema_before_step":
                ema(student.module, teacher, m, bug, variant == "foreach")
            opt.step()
            if bug != "ema_before_step" and (bug != "ema_rank0_only" or rank() == 0):
                ema(student.module, teacher, m, bug, variant == "foreach")


def reference(world_size: int) -> None:
    """One device: the global batch of each iteration, the center from all of it."""
    student, teacher = Wrapper(), Wrapper()
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    loss_fn = DINOLoss()
    opt = torch.optim.AdamW(get_params_groups(student))
    lr_schedule, wd_schedule, momentum_schedule = _schedules(world_size)
    data = dataset(world_size)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH * world_size, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (v1, v2) in enumerate(loader):
            it = STEPS_PER_EPOCH * epoch + i
            for j, group in enumerate(opt.param_groups):
                group["lr"] = lr_schedule[it]
                if j == 0:
                    group["weight_decay"] = wd_schedule[it]
            images = torch.cat([v1, v2])
            loss = loss_fn(student(images), teacher(images), distributed=False)
            opt.zero_grad()
            loss.backward()
            clip_gradients(student, CLIP)
            cancel_gradients_last_layer(epoch, student, FREEZE_LAST_LAYER)
            opt.step()
            ema(student, teacher, momentum_schedule[it], None, False)
