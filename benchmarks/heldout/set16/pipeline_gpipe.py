"""A GPipe pipeline written by hand over ``dist.send`` / ``dist.recv``: a 4-block MLP (Linear + tanh,
the last block with the classifier head) split into W stages of consecutive blocks (2 stages of 2 blocks
at 2 ranks, 4 stages of 1 at 4). Every step the global batch is cut into 4 micro-batches; all forwards
first (each stage receives the activation from the previous stage, marks it ``requires_grad_()``, runs
its blocks, keeps input and output, sends the output on), the last stage computes each micro-batch's
cross entropy divided by the number of micro-batches, then all backwards in reverse micro-batch order
(the last stage backpropagates its loss, the others receive the gradient of their output and
``output.backward(grad)``; every stage but the first sends its input's gradient back). Each stage steps
its own SGD-with-momentum optimizer once per step. The stages' blocks are cut from the one model built on
one seed, so the reference is the whole model on one device, the loss the mean over the global batch.

Follows the GPipe paper (Huang et al. 2019: micro-batches, all forwards then all backwards, one
synchronous update per mini-batch), pytorch/PiPPy ``ScheduleGPipe`` (``torch/distributed/pipelining/
schedules.py``: the loss scaled by ``1 / n_microbatches``, backward in reverse order) and the PyTorch
point-to-point tutorial (``dist.send`` / ``dist.recv``); the hand-written stage loop as in
Megatron-LM ``megatron/core/pipeline_parallel/schedules.py`` (``forward_backward_pipelining_without_
interleaving``: ``input_tensor.requires_grad``, ``output_tensor.backward(output_tensor_grad)``,
``input_tensor.grad`` sent back).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

D, C, GB, M, NB, SEED = 12, 4, 16, 4, 4, 1666
LR, MOMENTUM = 0.3, 0.9
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "recv_no_requires_grad": "the received activation is not marked requires_grad_(): its gradient is None, the stage sends zeros back and the earlier stages never learn",
    "loss_not_divided_by_microbatches": "each micro-batch's loss is not divided by the number of micro-batches: the accumulated gradient is M times the mini-batch mean's",
    "send_pre_activation": "each stage sends its last block's pre-activation (the Linear output before tanh) instead of the block's output",
    "recv_buffer_reused": "a stage receives every micro-batch's activation into one preallocated buffer: the saved inputs all alias the last micro-batch's activation (and its .grad accumulates over the micro-batches)",
    "backward_order_mismatch": "the last stage runs the backwards in reverse micro-batch order while the other stages pop their saved activations first-in-first-out: gradients meet the wrong micro-batch's activations",
    "label_micro_offset": "the last stage takes the labels of the next micro-batch ((i + 1) % M) for micro-batch i: labels misaligned with the inputs",
    "init_seed_per_stage": "each stage builds its blocks from a seed of its own (torch.manual_seed(rank)) instead of the shared model's weights",
}


class Block(nn.Module):
    def __init__(self, last: bool):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.head = nn.Linear(D, C) if last else None

    def forward(self, x, pre=False):
        z = self.lin(x)
        if pre:
            return z
        h = torch.tanh(z)
        return self.head(h) if self.head is not None else h


class Pipe(nn.Module):
    """The 4 blocks; a stage keeps its own (the others replaced by empty modules)."""

    def __init__(self, lo: int = 0, hi: int = NB, seed: int = SEED):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([Block(i == NB - 1) for i in range(NB)])
        for i in range(NB):
            if not lo <= i < hi:
                self.blocks[i] = nn.Identity()
        self.lo, self.hi = lo, hi

    def forward(self, x, pre_last=False):
        for i in range(self.lo, self.hi):
            x = self.blocks[i](x, pre=pre_last and i == self.hi - 1)
        return x


def batch(step: int):
    g = gen(SEED + 1 + step)
    y = torch.randint(0, C, (GB,), generator=g)
    return torch.randn(GB, D, generator=g) + F.one_hot(y, D).float(), y


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: one stage (NB / W consecutive blocks), GPipe over M micro-batches."""
    r, w = rank(), world_size
    per = NB // w
    stage = Pipe(r * per, (r + 1) * per, seed=SEED + 1000 + r if bug == "init_seed_per_stage" else SEED)
    opt = torch.optim.SGD(stage.parameters(), lr=LR, momentum=MOMENTUM)
    first, last, mb = r == 0, r == w - 1, GB // M
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        saved, buf = [], torch.empty(mb, D)
        for i in range(M):
            if first:
                inp = x[i * mb:(i + 1) * mb]
            else:
                inp = buf if bug == "recv_buffer_reused" else torch.empty(mb, D)
                tdist.recv(inp.data if inp.requires_grad else inp, r - 1)
                if bug != "recv_no_requires_grad":
                    inp.requires_grad_()
            out = stage(inp)
            if last:
                j = (i + 1) % M if bug == "label_micro_offset" else i
                out = F.cross_entropy(out, y[j * mb:(j + 1) * mb])
                if bug != "loss_not_divided_by_microbatches":
                    out = out / M
            else:
                tdist.send((stage(inp, pre_last=True) if bug == "send_pre_activation" else out).detach().contiguous(), r + 1)
            saved.append((inp, out))
        order = range(M) if (bug == "backward_order_mismatch" and not last) else reversed(range(M))
        for i in order:
            inp, out = saved[i]
            if last:
                out.backward()
            else:
                g = torch.empty(mb, D)
                tdist.recv(g, r + 1)
                out.backward(g)
            if not first:
                tdist.send(inp.grad if inp.grad is not None else torch.zeros(mb, D), r - 1)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the whole model, the mean loss over the global batch."""
    model = Pipe()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
