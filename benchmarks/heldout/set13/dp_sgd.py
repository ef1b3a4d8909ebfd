"""DP-SGD by hand across ranks (Opacus-style, no DDP hooks): per-sample gradients with ``torch.func``
(``vmap(grad(loss))`` over ``functional_call``), each sample's gradient clipped to ``MAX_NORM`` (one norm
over all parameters, "flat" clipping), the clipped gradients summed over the rank's samples, Gaussian
noise of std ``NOISE * MAX_NORM`` added once for the global batch (rank 0 adds it, drawn from a generator
seeded per step, as the one-device run draws it), divided by the rank's expected batch size, then
all-reduced (sum) and divided by the world size; SGD with momentum steps. The rank's loop also runs the
model's plain forward on its rows for the logged loss. A tiny MLP; each rank keeps its block of every
global batch.

The one-device reference: the same DP-SGD on the global batch (noise added once, divided by the global
batch size).

Follows pytorch/opacus ``opacus/optimizers/optimizer.py`` (``clip_and_accumulate``: per-sample norms over
all parameters, ``clip_factor = (max_grad_norm / (norm + 1e-6)).clamp(max=1.0)``; ``add_noise``:
``_generate_noise(std=noise_multiplier * max_grad_norm)``; ``scale_grad``: divided by
``expected_batch_size``), ``opacus/optimizers/ddpoptimizer.py`` (``DistributedDPOptimizer``: noise on rank
0 only, ``all_reduce`` of the gradients, divided by ``world_size`` for a mean loss) and the torch.func
tutorial ``per_sample_grads`` (``vmap(grad(compute_loss), in_dims=(None, None, 0, 0))`` over
``functional_call``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from .common import all_reduce, gen, rank, world

DIN, C, GB, SEED = 6, 3, 8, 53
MAX_NORM, NOISE, LR = 0.5, 0.8, 0.2
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "noise_every_rank": "every rank adds its own Gaussian noise (seeded per rank) before the all-reduce, not rank 0 alone",
    "clip_summed_grad": "the summed batch gradient is clipped to max_grad_norm instead of each sample's gradient",
    "local_batch_divisor": "the noisy sum is divided by the rank's batch size and all-reduced without dividing by the world size",
    "no_all_reduce": "the noisy per-rank gradient is never all-reduced: each rank steps on its own samples",
    "per_layer_clip": "each parameter's per-sample gradient is clipped to max_grad_norm on its own instead of one norm over all parameters",
    "noise_std_no_clip": "the noise std is noise_multiplier alone, not noise_multiplier * max_grad_norm",
}


def net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, 12), nn.Tanh(), nn.Linear(12, C))


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, DIN, generator=g)
    y = (x[:, :C] + 0.3 * torch.randn(GB, C, generator=g)).argmax(1)
    return x, y


def per_sample_grads(model, x, y):
    """The torch.func recipe: one gradient per row, as a dict name -> (rows, *shape)."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)


def clipped_sum(grads, bug=None):
    """Opacus's clip_and_accumulate: per-sample factors from one norm over all parameters."""
    if bug == "clip_summed_grad":
        summed = {k: g.sum(0) for k, g in grads.items()}
        norm = torch.stack([s.norm(2) for s in summed.values()]).norm(2)
        f = (MAX_NORM / (norm + 1e-6)).clamp(max=1.0)
        return {k: s * f for k, s in summed.items()}
    if bug == "per_layer_clip":
        out = {}
        for k, g in grads.items():
            n = g.reshape(len(g), -1).norm(2, dim=1)
            f = (MAX_NORM / (n + 1e-6)).clamp(max=1.0)
            out[k] = torch.einsum("i,i...->...", f, g)
        return out
    norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=1) for g in grads.values()], 1).norm(2, dim=1)
    f = (MAX_NORM / (norms + 1e-6)).clamp(max=1.0)
    return {k: torch.einsum("i,i...->...", f, g) for k, g in grads.items()}


def noise_for(step, shapes, std, seed_shift=0):
    g = gen(SEED * 100 + step + seed_shift)
    return {k: torch.randn(s, generator=g) * std for k, s in shapes.items()}


def run(model, rows, expected_bs, noisy, reduce, bug=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    shapes = {k: p.shape for k, p in model.named_parameters()}
    std = NOISE if bug == "noise_std_no_clip" else NOISE * MAX_NORM
    for step in range(STEPS):
        x, y = batch(step)
        x, y = rows(x), rows(y)
        with torch.no_grad():
            F.cross_entropy(model(x), y)          # the logged loss (plain forward)
        summed = clipped_sum(per_sample_grads(model, x, y), bug)
        if noisy:
            noise = noise_for(step, shapes, std, 1000 * (rank() + 1) if bug == "noise_every_rank" else 0)
            summed = {k: s + noise[k] for k, s in summed.items()}
        for k, p in model.named_parameters():
            p.grad = reduce(summed[k] / expected_bs)
        opt.step()
        opt.zero_grad(set_to_none=True)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of rows, noise on rank 0, gradients all-reduced and averaged by hand."""
    r, lb = rank(), GB // world_size
    model = net()
    w = world()

    def reduce(t):
        if bug == "no_all_reduce":
            return t
        s = all_reduce(t)
        return s if bug == "local_batch_divisor" else s / w

    noisy = r == 0 or bug == "noise_every_rank"
    run(model, lambda t: t[r * lb:(r + 1) * lb], lb, noisy, reduce, bug)


def reference(world_size: int) -> None:
    """One device: DP-SGD on the global batch."""
    run(net(), lambda t: t, GB, True, lambda t: t)
