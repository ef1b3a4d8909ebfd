"""Mean Teacher (semi-supervised) under DDP: a student MLP and an EMA teacher (a deep copy, frozen to
autograd); per step a global batch with about half its labels missing (``NO_LABEL = -1``), input noise
drawn separately for the student and the teacher; the classification loss is the cross entropy summed
over the labelled rows (``ignore_index``) and divided by the minibatch size, the consistency loss the
squared difference of the two softmaxes summed, divided by the classes and the minibatch size, weighted
by a sigmoid ramp-up in steps; after ``optimizer.step()`` the global step is counted and the teacher
updated with ``alpha = min(1 - 1 / (global_step + 1), ema_decay)``. SGD with Nesterov momentum. Every
draw (rows, labels, which labels are missing, both noises) is made for the global batch by a generator
seeded per step and each rank keeps its block of rows. The teacher is copied from ``ddp.module`` after
DDP has broadcast rank 0's weights.

The one-device reference: the same loop on the global batch.

Follows CuriousAI/mean-teacher ``pytorch/main.py`` (``create_model(ema=True)``: ``param.detach_()``;
``class_criterion = nn.CrossEntropyLoss(size_average=False, ignore_index=NO_LABEL)``, ``class_loss /
minibatch_size``; ``consistency_criterion = losses.softmax_mse_loss``, ``/ minibatch_size``;
``get_current_consistency_weight``; ``update_ema_variables(model, ema_model, args.ema_decay,
global_step)`` after ``optimizer.step()``), ``pytorch/mean_teacher/losses.py`` (``softmax_mse_loss``:
``F.mse_loss(input_softmax, target_softmax, size_average=False) / num_classes``) and ``ramps.py``
(``sigmoid_rampup``: ``exp(-5 * (1 - t) ** 2)``).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

D, H, C, GB, SEED, NO_LABEL = 8, 16, 4, 16, 151, -1
LR, MOMENTUM, EMA_DECAY, CONS, RAMP, NOISE = 0.3, 0.9, 0.9, 8.0, 4, 0.5
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "ce_mean_over_local_labeled": "the classification loss is CrossEntropyLoss(ignore_index) mean over the rank's own labelled rows, not summed / minibatch size",
    "teacher_update_rank0_only": "the EMA teacher is updated only on rank 0 (if rank == 0: update_ema_variables): the other ranks keep the initial teacher",
    "ema_before_step": "the teacher's EMA update is done before optimizer.step(), from the student's previous weights",
    "ema_no_alpha_warmup": "alpha is the fixed ema_decay from the first step, without min(1 - 1/(global_step + 1), ema_decay)",
    "teacher_noise_same_seed": "every rank draws the teacher's input noise of its rows from the same per-step seed (rank 0's noise on every rank)",
    "consistency_not_ramped": "the consistency weight is the full weight from the first step (no sigmoid ramp-up)",
    "teacher_copied_before_ddp": "the seed is set per rank (seed + rank) and the teacher is deep-copied before DDP broadcasts rank 0's weights: the teachers start from different weights",
}


def make_model(seed: int = SEED) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, C))


def draws(step: int):
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x = torch.randn(GB, D, generator=g) + torch.nn.functional.one_hot(y, D).float() * 2
    y = torch.where(torch.rand(GB, generator=g) < 0.5, y, torch.full_like(y, NO_LABEL))
    return x, y, torch.randn(GB, D, generator=g) * NOISE, torch.randn(GB, D, generator=g) * NOISE


def local(step: int, r: int, w: int, bug=None):
    x, y, e_s, e_t = draws(step)
    lb = GB // w
    rows = slice(r * lb, (r + 1) * lb)
    return x[rows], y[rows], e_s[rows], e_t[:lb] if bug == "teacher_noise_same_seed" else e_t[rows]


def cons_weight(step: int, bug=None) -> float:
    if bug == "consistency_not_ramped":
        return CONS
    t = min(max(step, 0), RAMP) / RAMP
    return CONS * math.exp(-5.0 * (1.0 - t) ** 2)


@torch.no_grad()
def update_ema(student: nn.Module, teacher: nn.Module, global_step: int, bug=None) -> None:
    alpha = EMA_DECAY if bug == "ema_no_alpha_warmup" else min(1 - 1 / (global_step + 1), EMA_DECAY)
    for e, p in zip(teacher.parameters(), student.parameters()):
        e.mul_(alpha).add_(p, alpha=1 - alpha)


def run(fwd, student, teacher, r, w, bug=None) -> None:
    opt = torch.optim.SGD(student.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
    global_step = 0
    for step in range(STEPS):
        x, y, e_s, e_t = local(step, r, w, bug)
        n = x.shape[0]
        logits = fwd(x + e_s)
        with torch.no_grad():
            t_logits = teacher(x + e_t)
        if bug == "ce_mean_over_local_labeled":
            class_loss = F.cross_entropy(logits, y, ignore_index=NO_LABEL)
        else:
            class_loss = F.cross_entropy(logits, y, ignore_index=NO_LABEL, reduction="sum") / n
        cons = F.mse_loss(logits.softmax(-1), t_logits.softmax(-1), reduction="sum") / C / n
        loss = class_loss + cons_weight(step, bug) * cons
        opt.zero_grad()
        loss.backward()
        if bug == "ema_before_step":
            update_ema(student, teacher, global_step + 1, bug)
        opt.step()
        global_step += 1
        if bug == "ema_before_step" or (bug == "teacher_update_rank0_only" and r != 0):
            continue
        update_ema(student, teacher, global_step, bug)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the student under DDP, the teacher copied from ``ddp.module``, its block of rows."""
    r = rank()
    if bug == "teacher_copied_before_ddp":
        model = make_model(SEED + r)
        teacher = copy.deepcopy(model).requires_grad_(False)
        ddp = DDP(model)   # broadcasts rank 0's student; the teachers stay as they were made
    else:
        model = make_model()
        ddp = DDP(model)
        teacher = copy.deepcopy(ddp.module).requires_grad_(False)
    run(ddp, ddp.module, teacher, r, world_size, bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = make_model()
    run(model, model, copy.deepcopy(model).requires_grad_(False), 0, 1)
