"""Pipeline parallel with ``torch.distributed.pipelining``: the model built whole on every rank, the
layers of the other stages deleted, a ``PipelineStage`` per rank and ``ScheduleGPipe`` (or
``Schedule1F1B``) over micro-batches; SGD per stage, a warm-up ``LambdaLR``, gradient clipping by
the global norm over all stages.

Follows pytorch/tutorials ``intermediate_source/pipelining_tutorial.rst`` (``manual_model_split``:
``del model.layers[str(i)]`` for the other stages' layers, ``model.tok_embeddings = None`` /
``model.output = None`` where not first / last, ``PipelineStage(model, stage_index, num_stages,
device)``, ``ScheduleGPipe(stage, n_microbatches=4, loss_fn=...)``, ``if rank == 0:
schedule.step(x) elif rank == last: losses = []; output = schedule.step(target=y, losses=losses)``),
the ``torch.distributed.pipelining`` docs (``scale_grads=True``: gradients divided by the number of
micro-batches, so ``loss_fn`` is a per-micro-batch mean) and pytorch/torchtitan
``torchtitan/distributed/utils.py`` (``clip_grad_norm_`` with pipeline parallel: each stage's squared
norm all-reduced over the pipeline group before the clip coefficient is taken). Every rank builds the
same global batch from a seeded generator (stage 0 reads the inputs, the last stage the targets).
Variants: ``ScheduleGPipe`` (default, 2 and 4 stages) and ``Schedule1F1B`` (2 stages).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

DIM, HID, OUT, LAYERS, GLOBAL_BATCH, MICRO = 8, 16, 4, 4, 16, 4
LR, MOMENTUM, MAX_NORM, WARMUP = 0.2, 0.9, 0.5, 3
STEPS = 5
CORRECT = {"default": (2, 4), "1f1b": (2,)}
BUGS = {
    "scale_grads_false": "ScheduleGPipe(..., scale_grads=False) with a mean loss_fn: gradients summed over micro-batches",
    "loss_div_micro": "loss_fn divides the mean loss by n_microbatches again though scale_grads=True",
    "no_zero_grad": "optimizer.zero_grad() left out: the stage's gradients pile up over steps",
    "seed_rank_data": "the batch generator seeded with seed + rank: the last stage's targets are not stage 0's rows'",
    "sched_last_stage_only": "scheduler.step() only inside the last stage's 'if rank == last' loss-logging branch",
    "clip_per_stage": "clip_grad_norm_ over the stage's own parameters: each stage clipped by its local norm",
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, HID)
        self.layers = nn.ModuleDict({str(i): nn.Sequential(nn.Linear(HID, HID), nn.Tanh()) for i in range(LAYERS)})
        self.output = nn.Linear(HID, OUT)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.inp is not None:
            h = torch.tanh(self.inp(h))
        for layer in self.layers.values():
            h = layer(h)
        return self.output(h) if self.output is not None else h


def global_batch(step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(400 + step + seed)
    return torch.randn(GLOBAL_BATCH, DIM, generator=g), torch.randn(GLOBAL_BATCH, OUT, generator=g)


def warmup(s: int) -> float:
    return min(1.0, (s + 1) / WARMUP)


def clip_global(params: list[torch.Tensor], max_norm: float) -> None:
    """torchtitan's pipeline-aware clip: the squared norms of every stage summed, one coefficient."""
    sq = torch.stack([p.grad.pow(2).sum() for p in params if p.grad is not None]).sum()
    tdist.all_reduce(sq)
    coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: one stage of the split model, the schedule over MICRO micro-batches."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    r, last = rank(), world_size - 1
    model = Net()
    per = LAYERS // world_size
    for i in range(LAYERS):
        if not r * per <= i < (r + 1) * per:
            del model.layers[str(i)]
    if r != 0:
        model.inp = None
    if r != last:
        model.output = None
    stage = PipelineStage(model, r, world_size, torch.device("cpu"))

    def loss_fn(out, target):
        loss = F.mse_loss(out, target)
        return loss / MICRO if bug == "loss_div_micro" else loss

    cls = Schedule1F1B if variant == "1f1b" else ScheduleGPipe
    schedule = cls(stage, n_microbatches=MICRO, loss_fn=loss_fn, scale_grads=bug != "scale_grads_false")
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    for step in range(STEPS):
        x, y = global_batch(step, seed=r if bug == "seed_rank_data" else 0)
        if bug != "no_zero_grad":
            opt.zero_grad()
        if r == 0:
            schedule.step(x)
        elif r == last:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if bug == "clip_per_stage":
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        else:
            clip_global(params, MAX_NORM)
        opt.step()
        if bug == "sched_last_stage_only":
            if r == last:
                sched.step()
        else:
            sched.step()


def reference(world_size: int) -> None:
    """One device: the whole model on the global batch, the mean loss, the same clip."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
