"""beta-VAE with KL annealing under DDP: an MLP encoder to (mu, log_var), the reparameterisation
``z = mu + eps * exp(0.5 * log_var)``, an MLP decoder; loss = MSE reconstruction (mean) + beta *
kld_weight * KLD, the KLD summed over latent dimensions and averaged over the batch, ``kld_weight`` the
batch size over the dataset size (``M_N``: the global batch under DDP), and beta annealed linearly from 0
to ``BETA`` over the first ``WARM`` optimizer steps (the global step). Two micro-batches per optimizer
step (each loss divided by 2; DDP all-reduces at each backward), Adam. The noise ``eps`` is drawn for
the global batch by a generator seeded the same on every rank and passed to the forward; each rank keeps
its block of rows. Variant ``manual``: no DDP wrapper, the gradients all-reduced by hand and divided by
the world size after the accumulation.

The one-device reference trains on the global micro-batches with the same draws and the same beta.

Follows pytorch/examples ``vae/main.py`` (``VAE.encode`` / ``reparameterize`` / ``decode``,
``loss_function``: ``KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())``), AntixK/PyTorch-VAE
``models/beta_vae.py`` (``BetaVAE.loss_function``: ``recons_loss + beta * kld_weight * kld_loss``,
``kld_loss = torch.mean(-0.5 * torch.sum(1 + log_var - mu ** 2 - log_var.exp(), dim=1), dim=0)``) and
``experiment.py`` (``M_N = batch_size / num_train_imgs``); KL annealing by global step as in
haofuml/cyclical_annealing ``frange_cycle_linear`` (the linear ramp, one cycle).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce_grads, gen, rank

D, Z, GB, ACC, SEED, LR = 10, 3, 8, 2, 53, 1e-2
BETA, WARM, N_DATA = 4.0, 4, 80
STEPS = 5
CORRECT = {"default": (2, 4), "manual": (2,)}
BUGS = {
    "beta_per_microbatch": "the annealing counter advances at every micro-batch instead of every optimizer step",
    "warmup_in_samples": "the warmup is counted in the rank's samples seen (step * local batch) against a length in steps",
    "kld_weight_local": "kld_weight (M_N) is the rank's batch size over the dataset size instead of the global batch's",
    "eps_per_rank": "each rank draws its reparameterisation noise from a generator seeded with seed + rank",
    "eps_same_rows": "every rank takes the first block of the global noise draw (eps[:B]) instead of its own block",
    "kld_mean_latent": "the KLD is averaged over the latent dimensions too (torch.mean over everything) instead of summed",
    "logvar_as_std": "the noise is scaled by exp(log_var) instead of exp(0.5 * log_var)",
}


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 2 * Z))
        self.dec = nn.Sequential(nn.Linear(Z, 16), nn.ReLU(), nn.Linear(16, D))

    def forward(self, x, eps, bug=None):
        mu, log_var = self.enc(x).chunk(2, -1)
        std = torch.exp(log_var) if bug == "logvar_as_std" else torch.exp(0.5 * log_var)
        return self.dec(mu + eps * std), mu, log_var


def loss_fn(recon, x, mu, log_var, beta, kld_weight, bug=None):
    terms = 1 + log_var - mu ** 2 - log_var.exp()
    kld = torch.mean(-0.5 * terms) if bug == "kld_mean_latent" else torch.mean(-0.5 * torch.sum(terms, 1), 0)
    return F.mse_loss(recon, x) + beta * kld_weight * kld


def beta_at(count):
    return BETA * min(1.0, count / WARM)


def data():
    g = gen(SEED)
    basis = torch.randn(Z, D, generator=g)
    x = torch.randn(N_DATA, Z, generator=g) @ basis + 0.1 * torch.randn(N_DATA, D, generator=g)
    return x


def noise(seed_offset=0):
    return torch.randn(STEPS * ACC * GB, Z, generator=gen(SEED + 1 + seed_offset))


def build():
    torch.manual_seed(SEED)
    model = VAE()
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of each micro-batch and of the noise; beta by the global step."""
    r, lb = rank(), GB // world_size
    model, opt = build()
    net = model if variant == "manual" else DDP(model)
    x = data()
    eps = noise(r if bug == "eps_per_rank" else 0)
    kld_weight = (lb if bug == "kld_weight_local" else GB) / N_DATA
    micro = 0
    for step in range(STEPS):
        opt.zero_grad()
        for a in range(ACC):
            i = (step * ACC + a) * GB
            rows = slice(i + r * lb, i + (r + 1) * lb)
            erows = slice(i, i + lb) if bug == "eps_same_rows" else rows
            count = micro if bug == "beta_per_microbatch" else step * lb if bug == "warmup_in_samples" else step
            recon, mu, log_var = net(x[rows], eps[erows], bug)
            loss = loss_fn(recon, x[rows], mu, log_var, beta_at(count), kld_weight, bug)
            (loss / ACC).backward()
            micro += 1
        if variant == "manual":
            all_reduce_grads(model.parameters(), divide=world_size)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global micro-batches, the same noise and the same beta by step."""
    model, opt = build()
    x, eps = data(), noise()
    for step in range(STEPS):
        opt.zero_grad()
        for a in range(ACC):
            rows = slice((step * ACC + a) * GB, (step * ACC + a + 1) * GB)
            recon, mu, log_var = model(x[rows], eps[rows])
            loss = loss_fn(recon, x[rows], mu, log_var, beta_at(step), GB / N_DATA)
            (loss / ACC).backward()
        opt.step()
