"""A two-stage pipeline by hand: rank 0 holds ``stage0``, rank 1 ``stage1`` of one model, and a step
runs M micro-batches in the one-forward-one-backward (1F1B) order with point-to-point send/recv.
Rank 0 sends each micro-batch's activation forward (``isend``) and keeps its input/output pair in a
FIFO queue; rank 1 receives it into a buffer that requires grad, runs its stage and the loss (divided
by M, as Megatron's ``forward_step`` divides by ``num_microbatches``), backpropagates and sends the
activation's gradient back; rank 0 pops the OLDEST pair and runs ``torch.autograd.backward(output,
grad)``. The gradient norm is clipped over the whole model: each stage's sum of squares all-reduced
over the pipeline group. Each stage has its own SGD (momentum, weight decay) and its own linear
warm-up ``LambdaLR``, stepped after every optimizer step on both stages.

Follows NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``: warm-up forwards ``num_stages - rank - 1``,
steady 1F1B, cool-down backwards, ``input_tensors.pop(0)``), ``p2p_communication.py``
(``send_forward`` / ``recv_backward``), ``megatron/core/optimizer/clip_grads.py`` (the norm all-reduced
over the model-parallel group) and the PyTorch "Writing distributed applications" tutorial (send/recv).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

DIN, H, C, BATCH, M = 6, 12, 3, 16, 4
LR, MOMENTUM, WD, WARM, MAX_NORM, SEED = 0.3, 0.9, 1e-3, 3, 0.5, 21
STEPS = 5
CORRECT = {"default": (2,)}
BUGS = {
    "loss_not_div_micro": "each micro-batch's loss backpropagated without dividing by the number of micro-batches",
    "lifo_backward": "rank 0 pops the NEWEST stored activation for each received gradient (stack, not queue)",
    "step_last_stage_only": "optimizer.step() and the scheduler only under 'if is_last_stage:' (stage 0 never updates)",
    "grad_div_again": "rank 0 divides each received activation gradient by the number of micro-batches again",
    "zero_grad_per_micro": "the last stage calls optimizer.zero_grad() before every micro-batch's backward (only the last one's gradient is kept)",
    "warmup_last_stage_only": "the warm-up scheduler stepped only on the last stage (with the loss logging)",
    "clip_local_norm": "each stage clips with its own gradient norm, not the norm over both stages",
    "stage_seed_rank": "each stage builds the model under torch.manual_seed(SEED + rank)",
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stage0 = nn.Sequential(nn.Linear(DIN, H), nn.Tanh(), nn.Linear(H, H))
        self.stage1 = nn.Sequential(nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage1(self.stage0(x))


class Stage(nn.Module):
    """One stage of ``Net`` under its own name (``stage0`` or ``stage1``)."""

    def __init__(self, net: Net, r: int) -> None:
        super().__init__()
        self.r = r
        setattr(self, f"stage{r}", getattr(net, f"stage{r}"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, f"stage{self.r}")(x)


def micro_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = gen(500 + step)
    x, y = torch.randn(BATCH, DIN, generator=g), torch.randint(0, C, (BATCH,), generator=g)
    return list(zip(x.chunk(M), y.chunk(M)))


def warmup(s: int) -> float:
    return min(1.0, (s + 1) / WARM)


def clip(params: list[nn.Parameter], local: bool) -> None:
    """Scale the gradients so that the norm over BOTH stages is at most MAX_NORM."""
    params = [p for p in params if p.grad is not None]
    sq = torch.stack([p.grad.pow(2).sum() for p in params]).sum() if params else torch.zeros(())
    if not local:
        tdist.all_reduce(sq)
    coef = MAX_NORM / (sq.sqrt() + 1e-6)
    if coef < 1:
        for p in params:
            p.grad.mul_(coef)


def run_stage0(stage: Stage, mbs, bug: str | None) -> None:
    """Warm-up forward, then 1F1B, then the last backward."""
    queue, sends = [], []

    def forward(i):
        out = stage(mbs[i][0])
        sends.append(tdist.isend(out.detach().contiguous(), 1))
        queue.append(out)

    def backward():
        out = queue.pop() if bug == "lifo_backward" else queue.pop(0)
        grad = torch.empty_like(out)
        tdist.recv(grad, 1)
        torch.autograd.backward(out, grad / M if bug == "grad_div_again" else grad)

    forward(0)
    for i in range(1, M):
        forward(i)
        backward()
    backward()
    for s in sends:
        s.wait()


def run_stage1(stage: Stage, opt, mbs, bug: str | None) -> None:
    sends = []
    for i in range(M):
        inp = torch.empty(mbs[i][0].shape[0], H)
        tdist.recv(inp, 0)
        inp.requires_grad_()
        loss = F.cross_entropy(stage(inp), mbs[i][1])
        if bug == "zero_grad_per_micro":
            opt.zero_grad()
        (loss if bug == "loss_not_div_micro" else loss / M).backward()
        sends.append(tdist.isend(inp.grad.contiguous(), 0))
    for s in sends:
        s.wait()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Rank 0: stage0, rank 1: stage1."""
    r = rank()
    torch.manual_seed(SEED + r if bug == "stage_seed_rank" else SEED)
    stage = Stage(Net(), r)
    params = list(stage.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    last = r == 1
    for step in range(STEPS):
        opt.zero_grad()
        mbs = micro_batches(step)
        if last:
            run_stage1(stage, opt, mbs, bug)
        else:
            run_stage0(stage, mbs, bug)
        clip(params, local=bug == "clip_local_norm")
        if bug == "step_last_stage_only" and not last:
            continue
        opt.step()
        if bug != "warmup_last_stage_only" or last:
            sched.step()


def reference(world_size: int) -> None:
    """One device: the whole model, the same micro-batches accumulated."""
    torch.manual_seed(SEED)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    for step in range(STEPS):
        opt.zero_grad()
        for x, y in micro_batches(step):
            (F.cross_entropy(net(x), y) / M).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)
        opt.step()
        sched.step()
