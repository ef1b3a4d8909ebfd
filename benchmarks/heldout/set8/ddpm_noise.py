"""DDPM training under DDP, tiny: an MLP denoiser of 8-d points with a sinusoidal timestep embedding,
a linear beta schedule (``alphas_cumprod``), per sample a random timestep in ``[0, T)`` and Gaussian
noise, ``noisy = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps``, the epsilon-prediction MSE, AdamW, a linear
warm-up ``LambdaLR`` stepped after ``optimizer.step()``, ``clip_grad_norm_`` after the backward.

The timesteps and the noise of an iteration are drawn for the GLOBAL batch from one generator seeded
alike on every rank (the seed and the step), and each rank keeps its rows; the one-device reference
draws the same global batch and takes the mean over all of it (DDP averages the ranks' means).

Follows huggingface/diffusers ``examples/unconditional_image_generation/train_unconditional.py``
(``noise = torch.randn(clean_images.shape)``, ``timesteps = torch.randint(0,
noise_scheduler.config.num_train_timesteps, (bsz,))``, ``noise_scheduler.add_noise``, ``F.mse_loss(
model_output, noise)`` for ``prediction_type == "epsilon"``, ``accelerator.clip_grad_norm_``,
``optimizer.step(); lr_scheduler.step()``), ``src/diffusers/schedulers/scheduling_ddpm.py``
(``add_noise``: ``sqrt_alpha_prod = alphas_cumprod[timesteps] ** 0.5``) and lucidrains'
denoising-diffusion-pytorch ``q_sample``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

DIM, HID, TEMB, T, N, GB, SEED = 8, 32, 8, 50, 32, 8, 5
LR, WARMUP, CLIP = 3e-3, 3, 1.0
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "same_noise_all_ranks": "noise and timesteps drawn for the local batch from the same seeded generator on every rank (all ranks get rank 0's draws)",
    "rank_seeded_timesteps": "timesteps drawn from a generator seeded with seed + rank, not the global batch's draw",
    "no_sqrt_alpha_bar": "add_noise uses abar_t and (1 - abar_t) instead of their square roots",
    "alpha_bar_off_by_one": "alphas_cumprod indexed at t - 1 (t = 0 wraps to the last entry)",
    "sched_before_opt": "lr_scheduler.step() called before optimizer.step() (the warm-up runs one step ahead)",
    "target_is_x0": "the loss compares the prediction with the clean sample instead of the noise",
    "fresh_noise_target": "the MSE target is a second randn draw, not the noise added to the sample",
}


def timestep_embedding(t: torch.Tensor) -> torch.Tensor:
    half = TEMB // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    a = t.float()[:, None] * freqs[None]
    return torch.cat([a.sin(), a.cos()], 1)


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM + TEMB, HID)
        self.mid = nn.Linear(HID, HID)
        self.out = nn.Linear(HID, DIM)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.inp(torch.cat([x, timestep_embedding(t)], 1)))
        return self.out(F.silu(self.mid(h)))


def alphas_cumprod() -> torch.Tensor:
    return torch.cumprod(1 - torch.linspace(1e-3, 0.2, T), 0)


def data() -> torch.Tensor:
    g = gen(SEED)
    centers = torch.randn(4, DIM, generator=g) * 2
    return centers[torch.randint(0, 4, (N,), generator=g)] + 0.1 * torch.randn(N, DIM, generator=g)


def build():
    torch.manual_seed(SEED)
    model = Denoiser()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    return model, opt, sched


def draws(step: int, n: int, seed: int = 1000):
    """Timesteps then noise for ``n`` samples from a generator seeded with ``seed + step``."""
    g = gen(seed + step)
    t = torch.randint(0, T, (n,), generator=g)
    return t, torch.randn(n, DIM, generator=g)


def add_noise(x0, noise, t, abar, bug=None):
    a = abar[t - 1] if bug == "alpha_bar_off_by_one" else abar[t]
    a = a[:, None]
    if bug == "no_sqrt_alpha_bar":
        return a * x0 + (1 - a) * noise
    return a.sqrt() * x0 + (1 - a).sqrt() * noise


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of each global batch, DDP, the global draws' rows for this rank."""
    r, w = rank(), world_size
    model, opt, sched = build()
    ddp = DDP(model)
    x_all, abar, lb = data(), alphas_cumprod(), GB // w
    for step in range(STEPS):
        x0 = x_all[(step * GB) % N:][:GB][r * lb:(r + 1) * lb]
        if bug == "same_noise_all_ranks":
            t, noise = draws(step, lb)
        else:
            t, noise = draws(step, GB)
            t, noise = t[r * lb:(r + 1) * lb], noise[r * lb:(r + 1) * lb]
            if bug == "rank_seeded_timesteps":
                t = torch.randint(0, T, (lb,), generator=gen(2000 + 7 * r + step))
        xt = add_noise(x0, noise, t, abar, bug)
        pred = ddp(xt, t)
        target = {"target_is_x0": x0, "fresh_noise_target": torch.randn(lb, DIM, generator=gen(3000 + step))}
        loss = F.mse_loss(pred, target.get(bug, noise))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), CLIP)
        if bug == "sched_before_opt":
            sched.step()
        opt.step()
        if bug != "sched_before_opt":
            sched.step()


def reference(world_size: int) -> None:
    """One device: the global batch, the global draws, the mean over all of it."""
    model, opt, sched = build()
    x_all, abar = data(), alphas_cumprod()
    for step in range(STEPS):
        x0 = x_all[(step * GB) % N:][:GB]
        t, noise = draws(step, GB)
        loss = F.mse_loss(model(add_noise(x0, noise, t, abar), t), noise)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
