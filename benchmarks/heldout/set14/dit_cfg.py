"""A diffusion-transformer training step with classifier-free guidance under DDP: a tiny adaLN denoiser
(timestep embedder with sinusoidal frequencies and an MLP, label embedder with one extra "null" row,
``shift, scale`` from ``SiLU(c)`` modulating a LayerNorm without affine) predicts the noise of
``x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps``; the loss is the MSE on the noise, averaged over every
element. Label dropout (``token_drop``: a dropped label becomes the null class ``num_classes``), the
timesteps and the noise are drawn for the global batch by a generator seeded per step, and each rank keeps
its block of rows. AdamW with weight decay 0; after each step an EMA copy of the model is updated from
the unwrapped module (``update_ema(ema, model.module)``).

The one-device reference: the same loop on the global batch.

Follows facebookresearch/DiT ``train.py`` (``update_ema``, ``requires_grad(ema, False)``, ``AdamW(
model.parameters(), lr=1e-4, weight_decay=0)``, ``t = torch.randint(0, diffusion.num_timesteps, ...)``,
``mean_flat`` of the MSE) and ``models.py`` (``TimestepEmbedder.timestep_embedding``, ``LabelEmbedder.
token_drop``: ``drop_ids = torch.rand(labels.shape[0]) < self.dropout_prob``, ``torch.where(drop_ids,
self.num_classes, labels)``; ``modulate``). Where DiT draws ``t`` and the drops per rank, this loop draws
them for the global batch, as the one-device run does.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank, world

D, C, H, FREQ, NT, GB, SEED, P_DROP = 8, 4, 16, 16, 50, 8, 143, 0.25
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "label_drop_per_rank": "the label-dropout mask is drawn per rank from a rank-seeded generator, not from the global per-step draw",
    "timesteps_same_seed": "every rank draws the timesteps of its rows from the same per-step seed (rank 0's timesteps on every rank)",
    "noise_same_seed": "every rank draws the noise of its rows from the same per-step seed (rank 0's noise on every rank)",
    "null_label_class0": "a dropped label is replaced by class 0 instead of the extra null class num_classes",
    "sampler_seed_per_rank": "each rank picks its rows of the global batch from a permutation seeded with its rank: rows overlap and others are never seen",
    "noise_coef_no_sqrt": "x_t uses (1 - abar_t) * eps instead of sqrt(1 - abar_t) * eps",
}
ALPHAS_BAR = torch.cumprod(1 - torch.linspace(1e-4, 0.02, NT, dtype=torch.float64), 0).float()


def timestep_embedding(t: torch.Tensor, dim: int = FREQ, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.t_mlp = nn.Sequential(nn.Linear(FREQ, H), nn.SiLU(), nn.Linear(H, H))
        self.y_table = nn.Embedding(C + 1, H)   # the last row: the null class of classifier-free guidance
        self.x_in = nn.Linear(D, H)
        self.ada = nn.Linear(H, 2 * H)
        self.out = nn.Linear(H, D)

    def forward(self, x_t, t, y):
        c = self.t_mlp(timestep_embedding(t)) + self.y_table(y)
        shift, scale = self.ada(F.silu(c)).chunk(2, -1)
        h = F.layer_norm(self.x_in(x_t), (H,)) * (1 + scale) + shift
        return self.out(F.silu(h))


@torch.no_grad()
def update_ema(ema: nn.Module, model: nn.Module, decay: float = 0.9) -> None:
    for e, p in zip(ema.parameters(), model.parameters()):
        e.mul_(decay).add_(p, alpha=1 - decay)


def draws(step: int):
    """The global batch of one step: data, labels, timesteps, noise, the label-drop uniform draws."""
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x0 = torch.randn(GB, D, generator=g) * 0.5 + y[:, None].float() - 1.5
    t = torch.randint(0, NT, (GB,), generator=g)
    eps = torch.randn(GB, D, generator=g)
    u = torch.rand(GB, generator=g)
    return x0, y, t, eps, u


def local(step: int, r: int, w: int, bug=None):
    """Rank ``r``'s rows of the step's draws (the whole batch where ``w == 1``)."""
    x0, y, t, eps, u = draws(step)
    lb = GB // w
    rows = slice(r * lb, (r + 1) * lb)
    if bug == "sampler_seed_per_rank":
        idx = torch.randperm(GB, generator=gen(SEED * 10 + step * 7 + r))[:lb]
        x0, y = x0[idx], y[idx]
    else:
        x0, y = x0[rows], y[rows]
    t = t[:lb] if bug == "timesteps_same_seed" else t[rows]
    eps = eps[:lb] if bug == "noise_same_seed" else eps[rows]
    u = torch.rand(lb, generator=gen(SEED * 100 + step * 7 + r)) if bug == "label_drop_per_rank" else u[rows]
    return x0, y, t, eps, u


def loss_of(fwd, x0, y, t, eps, u, bug=None):
    drop = u < P_DROP
    y = torch.where(drop, torch.zeros_like(y) if bug == "null_label_class0" else torch.full_like(y, C), y)
    ab = ALPHAS_BAR[t][:, None]
    x_t = ab.sqrt() * x0 + ((1 - ab) if bug == "noise_coef_no_sqrt" else (1 - ab).sqrt()) * eps
    return ((fwd(x_t, t, y) - eps) ** 2).mean()


def run(model, fwd, r, w, bug=None) -> None:
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0)
    for step in range(STEPS):
        loss = loss_of(fwd, *local(step, r, w, bug), bug=bug)
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_ema(ema, model)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the denoiser under DDP, its block of the global draws, the EMA from ``ddp.module``."""
    model = Denoiser()
    ddp = DDP(model)
    run(ddp.module, ddp, rank(), world_size, bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = Denoiser()
    run(model, model, 0, 1)
