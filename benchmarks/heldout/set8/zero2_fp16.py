"""ZeRO stage 2 by hand for a float16 model, in the manner of DeepSpeed's ``DeepSpeedZeroOptimizer``:
the model's float16 parameters are flattened (padded to a multiple of W) and every rank keeps an fp32
master copy of ITS partition only, with its optimizer state (SGD momentum, weight decay); the loss is
scaled by a dynamic loss scale before the backward; in ``step()`` the float16 gradients are copied into a
flat fp32 buffer, summed over the ranks and divided by W (a reduce-scatter: each rank keeps its
partition), the overflow flag of each partition is all-reduced (every rank skips the step together and
halves the scale), the gradients are unscaled and clipped by the GLOBAL norm (squared partition norms
all-reduced), the rank's fp32 partition is stepped, and the partitions are all-gathered back into the
float16 parameters. The scale doubles after ``WINDOW`` good steps. The optimizer is a
``torch.optim.Optimizer`` over the model's parameters, as DeepSpeed's wraps the client's.

The one-device reference runs the ranks' blocks one after another through the same float16 model (the
same shapes), sums their fp32 gradients in rank order and steps the whole flat master with W = 1.

Follows microsoft/DeepSpeed ``deepspeed/runtime/zero/stage_1_and_2.py`` (``single_partition_of_fp32_
groups``, ``average_tensor`` / ``reduce_scatter``, ``has_overflow`` with ``all_reduce(overflow_gpu,
op=ReduceOp.MAX)``, ``unscale_and_clip_grads``, ``complete_grad_norm_calculation_for_cpu_offload`` /
``get_grad_norm_direct`` summing squared norms over the group, ``all_gather_dp_groups``),
``deepspeed/runtime/fp16/loss_scaler.py`` (``DynamicLossScaler.update_scale``) and ``engine.py``
(``backward`` scaling the loss).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import all_gather, all_reduce, gen, rank, world

DIN, HID, DOUT, GB, SEED = 8, 16, 4, 8, 23
LR, MOMENTUM, WD, CLIP = 0.05, 0.9, 1e-3, 4.0
INIT_SCALE, WINDOW = 2.0 ** 14, 2
STEPS = 8
CORRECT = {"default": (2,)}
BUGS = {
    "no_grad_average": "the reduce-scatter sums the ranks' gradients without dividing by the data-parallel size",
    "clip_on_scaled_grads": "the clipping coefficient is computed from the norm of the still loss-scaled gradients",
    "partition_off_by_one": "each rank steps its fp32 partition with the gradient slice of the next rank's partition",
    "no_allgather": "the updated partitions are not all-gathered: each rank copies back only its own partition",
    "local_norm_clip": "the clipping norm is the rank's partition norm (squared norms not all-reduced)",
    "scale_update_after_return": "the loss-scale update sits after the overflow early return: a skipped step never lowers the scale",
    "grads_not_zeroed": "the flat fp32 gradient buffer is not zeroed between steps (gradients accumulate)",
}


class Zero2FP16(torch.optim.Optimizer):
    """A partitioned fp32 master + momentum over the float16 ``params``; ``backward`` scales the loss."""

    def __init__(self, params, bug=None) -> None:
        super().__init__(list(params), {"lr": LR})
        self.bug, self.r, self.w = bug, rank(), world()
        self.flat_params = self.param_groups[0]["params"]
        self.numel = sum(p.numel() for p in self.flat_params)
        self.part = -(-self.numel // self.w)
        full = self.flat_fp32()
        self.master = full[self.r * self.part:(self.r + 1) * self.part].clone()
        self.mom = torch.zeros_like(self.master)
        self.buf = torch.zeros(self.part * self.w)
        self.scale, self.good = INIT_SCALE, 0
        self.avg = self.w    # the divisor of the summed gradients (the data-parallel size)
        self.summed = None   # the one-device reference hands its rank-ordered sum here

    def flat_fp32(self) -> torch.Tensor:
        flat = torch.cat([p.detach().float().reshape(-1) for p in self.flat_params])
        return F.pad(flat, (0, self.part * self.w - self.numel))

    def flat_grads(self) -> torch.Tensor:
        g = torch.cat([p.grad.float().reshape(-1) for p in self.flat_params])
        return F.pad(g, (0, self.part * self.w - self.numel))

    def backward(self, loss: torch.Tensor) -> None:
        (loss.float() * self.scale).backward()

    @torch.no_grad()
    def step(self, closure=None):
        if self.summed is not None:
            total = self.summed
        else:
            if self.bug != "grads_not_zeroed":
                self.buf.zero_()
            self.buf += self.flat_grads()
            total = all_reduce(self.buf)
        if self.bug != "no_grad_average":
            total = total / self.avg
        src = (self.r + 1) % self.w if self.bug == "partition_off_by_one" else self.r
        g = total[src * self.part:(src + 1) * self.part]
        overflow = torch.tensor([0.0 if torch.isfinite(g).all() else 1.0])
        if self.w > 1:
            tdist.all_reduce(overflow, op=tdist.ReduceOp.MAX)
        if overflow.item() > 0:
            if self.bug != "scale_update_after_return":
                self.scale, self.good = self.scale / 2, 0
            return None
        if self.bug != "clip_on_scaled_grads":
            g = g / self.scale
        sq = (g * g).sum().reshape(1)
        if self.bug != "local_norm_clip":
            sq = all_reduce(sq)
        g = g * min(1.0, CLIP / (sq.sqrt().item() + 1e-6))
        if self.bug == "clip_on_scaled_grads":
            g = g / self.scale
        self.mom.mul_(MOMENTUM).add_(g + WD * self.master)
        self.master.sub_(LR * self.mom)
        if self.bug == "no_allgather":
            full = self.flat_fp32()
            full[self.r * self.part:(self.r + 1) * self.part] = self.master
        else:
            full = all_gather(self.master)
        off = 0
        for p in self.flat_params:
            p.copy_(full[off:off + p.numel()].view_as(p).to(p.dtype))
            off += p.numel()
        self.good += 1
        if self.good % WINDOW == 0:
            self.scale *= 2
        return None


def mlp() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, HID), nn.Tanh(), nn.Linear(HID, DOUT)).half()


def batch(step: int, w: int):
    """The global batch of ``step``; the later rows (the second rank's block at 2 ranks) are larger."""
    g = gen(SEED + step)
    x = torch.randn(GB, DIN, generator=g) * torch.linspace(0.5, 6.0, GB)[:, None]
    y = torch.randn(GB, DOUT, generator=g) * 3
    return x.half(), y


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of the global batch, the scaled backward, the ZeRO-2 step."""
    r, w = rank(), world_size
    model = mlp()
    opt = Zero2FP16(model.parameters(), bug)
    lb = GB // w
    for step in range(STEPS):
        x, y = batch(step, w)
        out = model(x[r * lb:(r + 1) * lb])
        loss = F.mse_loss(out.float(), y[r * lb:(r + 1) * lb])
        opt.zero_grad()
        opt.backward(loss)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the ranks' blocks one after another, their fp32 gradients summed in rank order."""
    w = world_size
    model = mlp()
    opt = Zero2FP16(model.parameters())
    opt.avg, lb = w, GB // w  # the average over W blocks; in this process one partition holds everything
    for step in range(STEPS):
        x, y = batch(step, w)
        total = None
        for r in range(w):
            out = model(x[r * lb:(r + 1) * lb])
            opt.zero_grad()
            opt.backward(F.mse_loss(out.float(), y[r * lb:(r + 1) * lb]))
            g = opt.flat_grads()
            total = g if total is None else total + g
        opt.summed = total
        opt.step()
