"""DINO-style self-distillation: a DDP student, an EMA teacher (``AveragedModel``), a centred loss.

Follows facebookresearch/dino ``main_dino.py``: the student wrapped in DDP, the teacher a copy that
receives no gradients and is updated by momentum after ``optimizer.step()``, ``DINOLoss`` with a
``center`` buffer updated from the teacher's outputs by ``dist.all_reduce(batch_center)`` divided by
``len(teacher_output) * world_size``, student and teacher temperatures, two views per image. The
teacher is ``torch.optim.swa_utils.AveragedModel`` with ``get_ema_multi_avg_fn`` (the EMA pattern of
torchvision's classification reference). Views are made from seeded noise per row.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import block, rank

DIM, OUT, GLOBAL_BATCH, LR, MOMENTUM, CENTER_M = 16, 16, 8, 1e-2, 0.9, 0.9
STUDENT_T, TEACHER_T = 0.1, 0.04
STEPS = 5
CORRECT = {"default": (2,)}
BUGS = {
    "ema_rank0_only": "the teacher's EMA update runs on rank 0 only (inside the main-process branch)",
    "center_not_reduced": "the center update uses the local batch's mean, no all_reduce",
    "center_sum": "the center's batch mean all-reduced but divided by the local row count only",
    "ema_before_step": "the teacher's EMA update runs before optimizer.step() instead of after",
}


def backbone() -> nn.Sequential:
    """Backbone and projection head."""
    return nn.Sequential(nn.Linear(DIM, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, OUT))


def views(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two seeded 'augmentations' of the step's global rows."""
    g = torch.Generator().manual_seed(6000 + step)
    x = torch.randn(GLOBAL_BATCH, DIM, generator=g)
    return x + 0.1 * torch.randn(x.shape, generator=g), 0.9 * x + 0.1 * torch.randn(x.shape, generator=g)


class DINOLoss(nn.Module):
    """Cross-entropy of the centred, sharpened teacher against the student, over crossed views."""

    def __init__(self, world_size: int, bug: str | None = None):
        super().__init__()
        self.world_size, self.bug = world_size, bug
        self.register_buffer("center", torch.zeros(1, OUT))

    def forward(self, student: list[torch.Tensor], teacher: list[torch.Tensor]) -> torch.Tensor:
        t_probs = [F.softmax((t - self.center) / TEACHER_T, dim=-1) for t in teacher]
        s_logp = [F.log_softmax(s / STUDENT_T, dim=-1) for s in student]
        loss = sum(-(t_probs[i] * s_logp[j]).sum(-1).mean() for i in range(2) for j in range(2) if i != j) / 2
        self.update_center(torch.cat(teacher))
        return loss

    @torch.no_grad()
    def update_center(self, teacher_output: torch.Tensor) -> None:
        """main_dino.py's center update: an EMA of the (all-reduced) mean teacher output."""
        batch_center = teacher_output.sum(dim=0, keepdim=True)
        w = self.world_size
        if w > 1 and self.bug != "center_not_reduced":
            tdist.all_reduce(batch_center)
        divisor = len(teacher_output) * (1 if self.bug in ("center_sum", "center_not_reduced") else w)
        self.center.mul_(CENTER_M).add_(batch_center / divisor, alpha=1 - CENTER_M)


def _loop(student, teacher, module, rows, world_size: int, bug=None) -> None:
    """Per step: both views through student and teacher, DINO loss, step, EMA update;
    ``world_size`` 1 on the one-device side (no collectives there)."""
    loss_fn = DINOLoss(world_size, bug)
    opt = torch.optim.AdamW(student.parameters(), lr=LR)
    for step in range(STEPS):
        v1, v2 = rows(step)
        with torch.no_grad():
            t_out = [teacher(v1), teacher(v2)]
        loss = loss_fn([student(v1), student(v2)], t_out)
        opt.zero_grad()
        loss.backward()
        if bug == "ema_before_step":
            teacher.update_parameters(module)
        opt.step()
        if bug is None or (bug == "ema_rank0_only" and rank() == 0) or bug.startswith("center"):
            teacher.update_parameters(module)


def _teacher(module: nn.Module):
    """The EMA teacher: an AveragedModel copy of the student that takes no gradients."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    teacher = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(MOMENTUM))
    teacher.requires_grad_(False)
    return teacher


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP student on its block of both views; the teacher follows by EMA."""
    net = backbone()
    teacher = _teacher(net)
    student = DDP(net)
    _loop(student, teacher, net, lambda s: tuple(block(v, rank(), world_size) for v in views(s)),
          world_size, bug)


def reference(world_size: int) -> None:
    """One device: the global rows of both views."""
    net = backbone()
    _loop(net, _teacher(net), net, views, 1)
