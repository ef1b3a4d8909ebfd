"""WGAN-GP under DDP: a generator and a critic, each under DDP, each with Adam(betas=(0.5, 0.9)); per
generator step ``N_CRITIC`` critic steps, each on its own real batch. The critic loss is
``mean(D(fake)) - mean(D(real)) + LAMBDA * mean((||grad_x D(x_hat)||_2 - 1)^2)`` with ``x_hat = alpha
* real + (1 - alpha) * fake`` (one alpha per sample), the input gradient taken by
``torch.autograd.grad(..., create_graph=True)`` so that the penalty's double backward reaches the
critic's weights; fakes are made under ``no_grad`` for the critic step. The generator loss is
``-mean(D(G(z)))``. Every random draw (real rows, noise z, alphas) is made for the global batch by a
generator seeded the same on every rank, and each rank keeps its block of rows; every loss is a mean
over rows, so DDP's average of the ranks' gradients is the global batch's gradient.

The one-device reference runs the same schedule on the global batches with the same draws.

Follows eriklindernoren/PyTorch-GAN ``implementations/wgan_gp/wgan_gp.py``
(``compute_gradient_penalty``: interpolates, ``autograd.grad(outputs=d_interpolates,
inputs=interpolates, grad_outputs=..., create_graph=True, retain_graph=True, only_inputs=True)``,
``((gradients.norm(2, dim=1) - 1) ** 2).mean()``; ``n_critic`` critic steps then a generator step) and
igul222/improved_wgan_training ``gan_toy.py`` (``LAMBDA = 10``, ``CRITIC_ITERS``, Adam(1e-4, 0.5, 0.9),
alpha of shape ``[BATCH_SIZE, 1]``).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

ZD, XD, GB, SEED = 4, 6, 8, 41
N_CRITIC, ITERS, LAMBDA, LR = 2, 2, 10.0, 1e-2
STEPS = ITERS * (N_CRITIC + 1)   # optimizer steps: the critic's and the generator's
CORRECT = {"default": (2, 4)}
BUGS = {
    "gp_no_create_graph": "the penalty's input gradient is taken without create_graph=True: the penalty adds nothing to the critic's gradient",
    "alpha_per_rank": "the interpolation alphas are drawn by a generator seeded with seed + rank, not the shared draw for the global batch",
    "alpha_per_element": "alpha drawn with the shape of the samples (one per element) instead of one per sample ([B, 1])",
    "gp_norm_whole_batch": "the gradient norm is taken over the whole batch tensor (gradients.norm(2)) instead of per sample (dim=1)",
    "gp_sum_rows": "the penalty is summed over the rows instead of averaged (a reduction changed)",
    "critic_count_off": "the generator steps when it % n_critic == 0 instead of after the n_critic-th critic step: it steps after the first critic step",
    "z_same_on_ranks": "the generator step's noise is drawn unsharded: every rank generates the same first rows instead of its block of the global batch",
}


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(ZD, 16), nn.Tanh(), nn.Linear(16, XD))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.gen(z)


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(XD, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)


def nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(SEED)
    return Generator(), Critic()


def real_rows(it: int, k: int) -> torch.Tensor:
    """The real global batch of critic step ``k`` of iteration ``it``: a shifted, skewed Gaussian."""
    x = torch.randn(GB, XD, generator=gen(SEED + 100 * it + k))
    return 0.7 * x + torch.linspace(-1.0, 1.0, XD)


def penalty(critic, real, fake, alpha, bug=None):
    """LAMBDA * mean((||grad_x critic(x_hat)|| - 1)^2) over the rows of this batch."""
    x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = critic(x_hat)
    grads = torch.autograd.grad(outputs=out, inputs=x_hat, grad_outputs=torch.ones_like(out),
                                create_graph=bug != "gp_no_create_graph", retain_graph=True, only_inputs=True)[0]
    norm = grads.norm(2) if bug == "gp_norm_whole_batch" else grads.norm(2, dim=1)
    pen = (norm - 1) ** 2
    return LAMBDA * (pen.sum() if bug == "gp_sum_rows" else pen.mean())


def draws(it: int, k: int, alpha_seed: int, bug=None):
    """The global batch's noise and alphas for critic step ``k`` of iteration ``it``."""
    z = torch.randn(GB, ZD, generator=gen(SEED + 1000 + 10 * it + k))
    shape = (GB, XD) if bug == "alpha_per_element" else (GB, 1)
    alpha = torch.rand(shape, generator=gen(alpha_seed + 10 * it + k))
    return z, alpha


def run(gen_net, critic, opt_g, opt_d, rows, bug=None, alpha_shift=0) -> None:
    """The WGAN-GP schedule; ``rows(t)`` keeps this process's block of a global-batch tensor."""
    for i in range(ITERS * N_CRITIC):
        it, k = divmod(i, N_CRITIC)
        z, alpha = draws(it, k, SEED + 2000 + alpha_shift, bug)
        real = rows(real_rows(it, k))
        with torch.no_grad():
            fake = gen_net(rows(z))
        loss_d = critic(fake).mean() - critic(real).mean() + penalty(critic, real, fake, rows(alpha), bug)
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        due = i % N_CRITIC == 0 if bug == "critic_count_off" else (i + 1) % N_CRITIC == 0
        if due:
            generator_step(gen_net, critic, opt_g, rows, i, bug)


def generator_step(gen_net, critic, opt_g, rows, i, bug=None) -> None:
    """One generator step on fresh noise for the global batch (this rank's block of it)."""
    z = torch.randn(GB, ZD, generator=gen(SEED + 3000 + i))
    zr = z[:rows(z).shape[0]] if bug == "z_same_on_ranks" else rows(z)
    loss_g = -critic(gen_net(zr)).mean()
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()


def optims(g: nn.Module, d: nn.Module):
    return (torch.optim.Adam(g.parameters(), lr=LR, betas=(0.5, 0.9)),
            torch.optim.Adam(d.parameters(), lr=LR, betas=(0.5, 0.9)))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: both nets under DDP, its block of every global-batch draw."""
    r, lb = rank(), GB // world_size
    g, d = nets()
    opt_g, opt_d = optims(g, d)
    run(DDP(g), DDP(d), opt_g, opt_d, lambda t: t[r * lb:(r + 1) * lb], bug,
        alpha_shift=7919 * r if bug == "alpha_per_rank" else 0)


def reference(world_size: int) -> None:
    """One device: the same schedule on the global batches."""
    g, d = nets()
    opt_g, opt_d = optims(g, d)
    run(g, d, opt_g, opt_d, lambda t: t)
