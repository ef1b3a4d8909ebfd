"""A beta-VAE with KL annealing under DDP: an MLP encoder to (mu, logvar), the reparameterisation
``z = mu + eps * exp(0.5 logvar)`` with ``eps`` drawn for the global batch and sliced per rank, a
sigmoid decoder, the loss per sample ``BCE(sum over pixels) + beta * KLD`` averaged over the rank's rows
(DDP's average is the global mean), ``beta = BETA_MAX * min(1, global_step / warmup_steps)`` with
``global_step`` the optimizer steps taken and ``warmup_steps = WARMUP_EPOCHS * len(loader)`` (the loader
of a ``DistributedSampler``: N / global batch steps an epoch), SGD with momentum.

The one-device reference: the global batch, the same noise, the same beta.

Follows pytorch/examples ``vae/main.py`` (``VAE.encode`` / ``reparameterize`` / ``decode``,
``loss_function``: ``binary_cross_entropy(..., reduction='sum')`` and ``-0.5 * sum(1 + logvar - mu^2 -
logvar.exp())``), AntixK/PyTorch-VAE ``models/beta_vae.py`` (``BetaVAE.loss_function``: ``kld_weight``,
per-batch mean KLD, ``num_iter`` counted per call) and the monotonic KL annealing schedule of
haofuml/cyclical_annealing ``plot/plot_schedules.ipynb`` (a linear ramp of beta by iteration).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

D, H, Z, N, GB, SEED = 12, 8, 3, 32, 8, 53
BETA_MAX, WARMUP_EPOCHS, LR = 4.0, 1, 0.05
STEPS = 8   # 2 epochs of N / GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "eps_rank_seed": "each rank draws its own reparameterisation noise (generator seeded with seed + rank) instead of its slice of the global draw",
    "beta_sample_units": "the annealing counter advances by the rank's batch size (samples) per step instead of by one optimizer step",
    "warmup_len_local": "the warm-up length uses len(dataset) // per-rank batch size as steps per epoch, not the distributed loader's length",
    "beta_off_by_one": "beta is computed from global_step + 1 (the counter incremented before use)",
    "kld_sum_batch": "the KL term is summed over the rank's rows while the reconstruction term is averaged",
    "sum_reduction": "the loss is summed over the rank's rows (pytorch/examples' sum) instead of averaged",
    "std_not_half": "reparameterise with std = exp(logvar) instead of exp(0.5 * logvar)",
}


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(D, H), nn.Linear(H, Z), nn.Linear(H, Z)
        self.fc3, self.fc4 = nn.Linear(Z, H), nn.Linear(H, D)

    def forward(self, x, eps, bug=None):
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        std = torch.exp(logvar) if bug == "std_not_half" else torch.exp(0.5 * logvar)
        z = mu + eps * std
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def data():
    g = gen(SEED)
    return torch.sigmoid(2 * torch.randn(N, D, generator=g))


def noise(step, rows, seed_shift=0):
    return torch.randn(rows, Z, generator=gen(SEED + 200 + step + seed_shift))


def beta_at(global_step, steps_per_epoch):
    return BETA_MAX * min(1.0, global_step / (WARMUP_EPOCHS * steps_per_epoch))


def loss_fn(recon, x, mu, logvar, beta, bug=None):
    """Per-sample BCE + beta KLD, averaged over the rows given."""
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    n = x.shape[0]
    if bug == "sum_reduction":
        return bce + beta * kld
    if bug == "kld_sum_batch":
        return bce / n + beta * kld
    return (bce + beta * kld) / n


def build():
    torch.manual_seed(SEED)
    model = VAE()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of rows and of the global noise draw, beta by optimizer step."""
    r, lb = rank(), GB // world_size
    model, opt = build()
    ddp = DDP(model)
    xs = data()
    steps_per_epoch = N // lb if bug == "warmup_len_local" else N // GB
    global_step = 0
    for step in range(STEPS):
        e = step % (N // GB)
        x = xs[e * GB + r * lb:e * GB + (r + 1) * lb]
        eps = noise(step, lb, 71 * (r + 1)) if bug == "eps_rank_seed" else noise(step, GB)[r * lb:(r + 1) * lb]
        beta = beta_at(global_step + (1 if bug == "beta_off_by_one" else 0), steps_per_epoch)
        recon, mu, logvar = ddp(x, eps, bug)
        loss = loss_fn(recon, x, mu, logvar, beta, bug)
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_step += lb if bug == "beta_sample_units" else 1


def reference(world_size: int) -> None:
    """One device: the global batch."""
    model, opt = build()
    xs = data()
    for step in range(STEPS):
        e = step % (N // GB)
        x = xs[e * GB:(e + 1) * GB]
        recon, mu, logvar = model(x, noise(step, GB))
        loss = loss_fn(recon, x, mu, logvar, beta_at(step, N // GB))
        opt.zero_grad()
        loss.backward()
        opt.step()
