"""DINO self-distillation under DDP: a student (MLP backbone + projection head to ``K`` prototypes) wrapped in
DDP and a teacher (a copy of the student's weights, no gradients) updated after every optimizer step as
an EMA of the student with the per-iteration cosine momentum schedule (``momentum_schedule[it]``, from
``BASE_M`` to 1 over all iterations). Multi-crop: 2 global views go through the teacher, the 2 global
and 2 local views through the student (views concatenated along the batch, ``chunk`` by crop). The
DINO loss: teacher outputs centred and sharpened (``softmax((t - center) / teacher_temp)``, detached),
student ``log_softmax(s / 0.1)``, cross entropy over every (teacher view, student view) pair with
different views, averaged over the pairs; the teacher temperature warms up linearly from 0.04 to 0.07
over the first 2 epochs (``teacher_temp_schedule[epoch]``); after the loss, the center is updated by an
EMA (momentum 0.9) of the batch center, the teacher outputs summed, all-reduced and divided by the
global count (``len(teacher_output) * world_size``). SGD with momentum (in place of AdamW). Every random
draw (the samples and each view's noise) is made for the global batch by a generator seeded per step;
each rank keeps its rows. The reference runs the global batch in one process.

Follows facebookresearch/dino ``main_dino.py`` (``DINOLoss.forward`` / ``update_center``,
``teacher_temp_schedule`` with ``warmup_teacher_temp_epochs``, ``momentum_schedule =
utils.cosine_scheduler(args.momentum_teacher, 1, args.epochs, len(data_loader))``, ``it = len(data_loader)
* epoch + it``, the EMA ``param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)`` over
``student.module`` after ``optimizer.step()``, ``teacher_without_ddp.load_state_dict(student.module.state_dict())``)
and ``utils.py`` (``cosine_scheduler``).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce_sum, gen, rank

GB, DI, K, SEED = 8, 8, 10, 1706
LR, MOMENTUM, BASE_M, CENTER_M, STUDENT_T = 0.3, 0.9, 0.9, 0.9, 0.1
WARM_T, TEACHER_T, WARM_EPOCHS, EPOCHS, ITERS = 0.04, 0.07, 2, 3, 2
STEPS = EPOCHS * ITERS
CORRECT = {"default": (2, 4)}
BUGS = {
    "center_not_all_reduced": "the center's batch mean is taken over the rank's local teacher outputs only (no all-reduce): the ranks' centers differ",
    "center_divided_by_local_count": "the all-reduced batch center is divided by the local count len(teacher_output) without the world size: the center is W times too large",
    "center_updated_before_loss": "update_center runs before the loss: the teacher outputs are centred with a center that already includes the current batch",
    "teacher_temp_warmup_in_iterations": "the teacher-temperature warm-up schedule is indexed by iteration instead of epoch: the warm-up ends after 2 iterations instead of 2 epochs",
    "momentum_schedule_per_epoch": "the teacher momentum schedule is built with one value per epoch and indexed by the epoch (not per iteration): the EMA momentum is wrong",
    "teacher_ema_before_optimizer_step": "the teacher EMA update runs before optimizer.step(): the teacher follows the previous student weights",
    "same_view_pairs_not_skipped": "the DINO loss does not skip the pairs where the student and teacher see the same view (v == iq)",
}


def make_student():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, K))


def make_teacher(student):
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad = False
    return teacher


def views(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, DI, generator=g) + F.one_hot(torch.randint(0, 4, (GB,), generator=g), DI).float() * 2
    glob = [x + 0.3 * torch.randn(GB, DI, generator=g) for _ in range(2)]
    loc = [0.7 * x + 0.5 * torch.randn(GB, DI, generator=g) for _ in range(2)]
    return glob + loc


def cosine_scheduler(base, final, epochs, niter):
    total = epochs * niter
    return [final + 0.5 * (base - final) * (1 + math.cos(math.pi * i / total)) for i in range(total)]


def teacher_temps(n):
    warm = torch.linspace(WARM_T, TEACHER_T, WARM_EPOCHS).tolist()
    return warm + [TEACHER_T] * (n - WARM_EPOCHS)


class DINOLoss:
    def __init__(self):
        self.center = torch.zeros(1, K)

    def update_center(self, teacher_output, bug=None, world=1):
        s = teacher_output.sum(0, keepdim=True)
        if bug == "center_not_all_reduced":
            bc = s / len(teacher_output)
        else:
            s = all_reduce_sum(s) if world > 1 else s
            bc = s / (len(teacher_output) * (1 if bug == "center_divided_by_local_count" else world))
        self.center = self.center * CENTER_M + bc * (1 - CENTER_M)

    def __call__(self, student_output, teacher_output, temp, bug=None, world=1):
        if bug == "center_updated_before_loss":
            self.update_center(teacher_output, bug, world)
        s = (student_output / STUDENT_T).chunk(4)
        t = F.softmax((teacher_output - self.center) / temp, dim=-1).detach().chunk(2)
        total, n = 0.0, 0
        for iq, q in enumerate(t):
            for v in range(len(s)):
                if v == iq and bug != "same_view_pairs_not_skipped":
                    continue
                total = total + torch.sum(-q * F.log_softmax(s[v], dim=-1), dim=-1).mean()
                n += 1
        if bug != "center_updated_before_loss":
            self.update_center(teacher_output, bug, world)
        return total / n


def ema(teacher, student, m):
    with torch.no_grad():
        for pk, pq in zip(teacher.parameters(), student.parameters()):
            pk.mul_(m).add_((1 - m) * pq.detach())


def run(student, net, teacher, opt, rows, w, bug=None):
    loss_fn = DINOLoss()
    if bug == "momentum_schedule_per_epoch":
        ms = cosine_scheduler(BASE_M, 1.0, EPOCHS, 1)
    else:
        ms = cosine_scheduler(BASE_M, 1.0, EPOCHS, ITERS)
    temps = teacher_temps(STEPS if bug == "teacher_temp_warmup_in_iterations" else EPOCHS)
    for epoch in range(EPOCHS):
        for i in range(ITERS):
            it = epoch * ITERS + i
            v = [rows(x) for x in views(it)]
            t_out = teacher(torch.cat(v[:2]))
            s_out = net(torch.cat(v))
            temp = temps[it if bug == "teacher_temp_warmup_in_iterations" else epoch]
            loss = loss_fn(s_out, t_out, temp, bug, w)
            opt.zero_grad()
            loss.backward()
            m = ms[epoch] if bug == "momentum_schedule_per_epoch" else ms[it]
            if bug == "teacher_ema_before_optimizer_step":
                ema(teacher, student, m)
            opt.step()
            if bug != "teacher_ema_before_optimizer_step":
                ema(teacher, student, m)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    student = make_student()
    teacher = make_teacher(student)
    ddp = DDP(student)
    teacher.load_state_dict(ddp.module.state_dict())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    lb = GB // w
    run(student, ddp, teacher, opt, lambda x: x[r * lb:(r + 1) * lb], w, bug)


def reference(world_size: int) -> None:
    student = make_student()
    teacher = make_teacher(student)
    opt = torch.optim.SGD(student.parameters(), lr=LR, momentum=MOMENTUM)
    run(student, student, teacher, opt, lambda x: x, 1)
